"""Calling actors: a RayMQError raised inside an actor comes back as itself (not
wrapped in Ray's ``RayTaskError``), and Ray's own failures (actor dead, restarting,
unreachable, timed out) are told apart as retriable."""

from __future__ import annotations

from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

from actors.protocol.shared_ring import SharedCall
from storage.errors import BrokerUnavailableError, RayMQError


def cause_of(exc: BaseException) -> BaseException:
    """The RayMQError an actor raised, or ``exc`` itself."""
    if isinstance(exc, RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, RayMQError):
            return cause
    return exc


def get(refs: Any, timeout: float | None = None) -> Any:
    """``ray.get`` (or a :class:`SharedCall`'s result) that re-raises a RayMQError
    raised inside the actor as itself."""
    try:
        if isinstance(refs, SharedCall):
            return refs.result(timeout)
        return ray.get(refs, timeout=timeout)
    except RayTaskError as exc:
        cause = cause_of(exc)
        if cause is not exc:
            raise cause from None
        raise


def is_retriable(exc: BaseException) -> bool:
    """Ray could not deliver or answer the call: another broker may take it."""
    return isinstance(exc, (RayActorError, GetTimeoutError)) or (
        isinstance(exc, RayError) and not isinstance(exc, RayTaskError)
    )


def send_may_retry(exc: BaseException) -> bool:
    """A send failed on the way (Ray, or no live broker), not for what it carries: the
    producer tries it again elsewhere. Anything else is the broker refusing it."""
    return is_retriable(exc) or isinstance(exc, BrokerUnavailableError)
