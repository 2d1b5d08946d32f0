"""Starting and calling actors: RayMQ's named service actors start one way
(:func:`service_actor`); a RayMQError raised inside an actor comes back as itself (not
wrapped in Ray's ``RayTaskError``), and Ray's own failures (actor dead, restarting,
unreachable, timed out) are told apart as retriable."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

from actors.protocol.errors import mark_answered
from storage.errors import BrokerUnavailableError, RayMQError


class PendingCall:
    """A call answered outside Ray's object store (a broker's data-path socket, a
    producer's shared ring), waited on as an ObjectRef is: ``future()`` (a lane, a
    callback) or ``result(timeout)`` (:func:`get`, :func:`wait`)."""

    __slots__ = ("_future",)

    def __init__(self, future: concurrent.futures.Future[Any]) -> None:
        self._future = future

    def future(self) -> concurrent.futures.Future[Any]:
        return self._future

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None) -> Any:
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise GetTimeoutError(f"a call was not answered in {timeout} s") from None


def cause_of(exc: BaseException) -> BaseException:
    """The RayMQError an actor raised, or ``exc`` itself."""
    if isinstance(exc, RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, RayMQError):
            return mark_answered(cause)  # the actor ran and raised it
    return exc


def get(refs: Any, timeout: float | None = None) -> Any:
    """``ray.get`` (or a :class:`PendingCall`'s result, or a list mixing both) that
    re-raises a RayMQError raised inside the actor as itself."""
    try:
        if isinstance(refs, PendingCall):
            return refs.result(timeout)
        if isinstance(refs, list) and any(isinstance(r, PendingCall) for r in refs):
            deadline = None if timeout is None else time.monotonic() + timeout
            return [
                get(r, None if deadline is None else max(0.0, deadline - time.monotonic()))
                for r in refs
            ]
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


def wait(refs: Sequence[Any], timeout: float | None) -> tuple[list[Any], list[Any]]:
    """``ray.wait`` for all of ``refs`` (ObjectRefs and :class:`PendingCall` mixed), at
    most ``timeout`` seconds: (the answered ones, the others), each in ``refs``' order."""
    calls = [r for r in refs if isinstance(r, PendingCall)]
    objects = [r for r in refs if not isinstance(r, PendingCall)]
    deadline = None if timeout is None else time.monotonic() + timeout
    ready_objects: set[Any] = set()
    if objects:
        ready_objects = set(ray.wait(objects, num_returns=len(objects), timeout=timeout)[0])
    if calls:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        concurrent.futures.wait([c.future() for c in calls], timeout=left)
    ready = [r for r in refs if (r.done() if isinstance(r, PendingCall) else r in ready_objects)]
    chosen = {id(r) for r in ready}
    return ready, [r for r in refs if id(r) not in chosen]


def service_actor(cls: type, name: str, namespace: str, **options: Any) -> Any:
    """``cls`` as one of RayMQ's named service actors, ready for ``.remote(...)``: named
    ``name`` in ``namespace``, detached (it outlives the program that starts it) and
    holding no CPU (it waits on I/O); ``options`` are Ray's other actor options."""
    return ray.remote(cls).options(
        name=name, namespace=namespace, lifetime="detached", num_cpus=0, **options
    )
