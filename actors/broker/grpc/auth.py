"""Who may call the gRPC endpoint: RocketMQ 5's ACL signature, checked on every call.

A RocketMQ 5 client signs each call with its access key and secret key (the
official clients' ``Signature``): metadata ``x-mq-date-time`` (``%Y%m%dT%H%M%SZ``)
and ``authorization: MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=
x-mq-date-time, Signature=<hex HMAC-SHA1(secret key, date-time)>``. The endpoint
serves a call only when the access key is the cluster's, the signature matches and
the date-time is within ``window_s`` of the broker's clock (so a captured header
cannot be replayed for long). Pure: no grpc import, so it is tested on its own.

A client signs the date-time to the second, so its calls within one second carry the
same two headers: a pair once verified is remembered (a bounded cache of exact header
values) and only its time is checked again on each call. A pair that failed is never
remembered: every attempt with it is checked in full.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import time
from collections.abc import Iterable

SCHEME = "MQv2-HMAC-SHA1"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"


class AuthError(Exception):
    """A call that does not prove it belongs to the cluster; the message says why."""


def sign(secret_key: str, date_time: str) -> str:
    """The signature a client sends for ``date_time`` (hex HMAC-SHA1)."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def _parse_authorization(value: str) -> dict[str, str]:
    scheme, _, rest = value.strip().partition(" ")
    if scheme != SCHEME:
        raise AuthError(f"authorization scheme {scheme!r}: only {SCHEME} is served")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, val = part.strip().partition("=")
        if sep:
            fields[key.strip()] = val.strip()
    return fields


VERIFIED_CACHE = 1024
"""Verified (authorization, date-time) pairs remembered; past that the cache starts over
(a client makes one pair a second)."""


class Authenticator:
    """Checks the signature of a call against the one credential pair of the cluster."""

    def __init__(self, access_key: str, secret_key: str, window_s: float) -> None:
        if not access_key or not secret_key:
            raise ValueError("an access key and a secret key are required")
        self.access_key = access_key
        self._secret = secret_key
        self.window_s = window_s
        # (authorization, x-mq-date-time) -> signed at (epoch s), for pairs that verified
        self._verified: dict[tuple[str, str], int] = {}

    def check(self, metadata: Iterable[tuple[str, str | bytes]], now: float | None = None) -> str:
        """Raise :class:`AuthError` unless ``metadata`` is signed by the cluster's key
        within the window; return the access key."""
        authorization: str | bytes | None = None
        date_time: str | bytes | None = None
        for key, value in metadata:
            lowered = key.lower()
            if lowered == "authorization":
                authorization = value
            elif lowered == "x-mq-date-time":
                date_time = value
        if isinstance(authorization, bytes):
            authorization = authorization.decode()
        if isinstance(date_time, bytes):
            date_time = date_time.decode()
        if not authorization or not date_time:
            raise AuthError("unsigned call: authorization and x-mq-date-time are required")
        pair = (authorization, date_time)
        signed_at = self._verified.get(pair)
        if signed_at is None:
            signed_at = self._verify(authorization, date_time)
        self._check_time(date_time, signed_at, now)
        if pair not in self._verified:  # remembered only once it passed in full
            if len(self._verified) >= VERIFIED_CACHE:
                self._verified.clear()
            self._verified[pair] = signed_at
        return self.access_key

    def _check_time(self, date_time: str, signed_at: int, now: float | None) -> None:
        skew = abs((time.time() if now is None else now) - signed_at)
        if skew > self.window_s:
            raise AuthError(
                f"x-mq-date-time {date_time} is {skew:.0f}s from the broker's clock "
                f"(at most {self.window_s:.0f}s)"
            )

    def _verify(self, authorization: str, date_time: str) -> int:
        """The signature and access key checked; the signing time (epoch s)."""
        fields = _parse_authorization(authorization)
        if fields.get("SignedHeaders", "").lower() != "x-mq-date-time":
            raise AuthError("SignedHeaders must be x-mq-date-time")
        access_key = fields.get("Credential", "")
        given = fields.get("Signature", "")
        expected = sign(self._secret, date_time)
        # compare both whatever the access key, so timing says nothing about which was wrong
        key_ok = hmac.compare_digest(access_key.encode(), self.access_key.encode())
        sig_ok = hmac.compare_digest(given.lower().encode(), expected.encode())
        if not (key_ok and sig_ok):
            raise AuthError("bad access key or signature")
        try:
            signed_at = calendar.timegm(time.strptime(date_time, DATE_TIME_FORMAT))
        except ValueError as exc:
            raise AuthError(f"x-mq-date-time {date_time!r} is not {DATE_TIME_FORMAT}") from exc
        return int(signed_at)
