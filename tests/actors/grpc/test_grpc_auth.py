"""The gRPC endpoint's signature check (actors/broker/grpc/auth.py), against the
signature the official Python client computes (its own ``Signature``), no Ray."""

from __future__ import annotations

import calendar
import time

import pytest
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.util.signature import Signature

from actors.broker.grpc.auth import Authenticator, AuthError


def _client_metadata(ak: str, sk: str) -> list[tuple[str, str]]:
    config = ClientConfiguration("127.0.0.1:1", Credentials(ak, sk))
    return Signature.metadata(config, "client-1")


def _signed_at(metadata: list[tuple[str, str]]) -> float:
    date_time = dict(metadata)["x-mq-date-time"]
    return float(calendar.timegm(time.strptime(date_time, "%Y%m%dT%H%M%SZ")))


def test_the_official_clients_signature_passes_and_anything_else_is_refused() -> None:
    auth = Authenticator("ak", "sk-secret", window_s=60)
    good = _client_metadata("ak", "sk-secret")
    now = _signed_at(good)
    assert auth.check(good, now=now) == "ak"
    assert auth.check(good, now=now + 59) == "ak"
    with pytest.raises(AuthError, match="from the broker's clock"):  # replayed too late
        auth.check(good, now=now + 61)
    with pytest.raises(AuthError, match="bad access key or signature"):
        auth.check(_client_metadata("ak", "wrong"), now=now)
    with pytest.raises(AuthError, match="bad access key or signature"):
        auth.check(_client_metadata("other", "sk-secret"), now=now)
    with pytest.raises(AuthError, match="unsigned"):
        auth.check([(k, v) for k, v in good if k != "authorization"], now=now)
    tampered = [(k, v if k != "x-mq-date-time" else "20260101T000000Z") for k, v in good]
    with pytest.raises(AuthError, match="bad access key or signature"):
        auth.check(tampered, now=now)
    with pytest.raises(AuthError, match="scheme"):
        auth.check([*tampered[:-1], ("authorization", "Basic abc")], now=now)
