"""Every request of the framed protocol (``actors.protocol.frames``), declared once.

One module per kind of request, as aiokafka keeps one per request in its ``protocol/``;
each declaration (``declare.Request``) is what RocketMQ's ``RequestCode`` constant and
``*RequestHeader`` class are together: code, fields and their wire keys, body, answer,
errors, and the coroutine that serves it; the fields several requests share (a group,
a topic, a transaction's id) are declared once with their wire key in ``fields``. From
these tables:

* the client's data path frames its calls (``actors.protocol.data_path``): a broker's
  stub carries :data:`BROKER` over the socket, the transaction coordinator's
  :data:`COORDINATOR`; any other method stays a Ray call;
* each server dispatches by code (``declare.Dispatch``): the broker's listener over
  :data:`BROKER`, the coordinator's over :data:`COORDINATOR`.

A new request is a declaration in one of these modules (and the coroutine that serves
it): the stub, the listener and the Ray fallback follow.
"""

from __future__ import annotations

from actors.protocol import frames
from actors.protocol.requests import (
    consumer,
    lite,
    offsets,
    pop,
    pull,
    send,
    subscribe,
    transaction,
)
from actors.protocol.requests.declare import Dispatch, Request, by_method

BROKER: tuple[Request, ...] = (
    *send.REQUESTS,
    *pull.REQUESTS,
    *consumer.REQUESTS,
    *transaction.BROKER_REQUESTS,
    *pop.REQUESTS,
    *offsets.REQUESTS,
    *lite.REQUESTS,
    *subscribe.REQUESTS,
)
"""What a broker serves on its socket (``actors.broker.listener``)."""

COORDINATOR: tuple[Request, ...] = transaction.COORDINATOR_REQUESTS
"""What the transaction coordinator serves on its socket (``actors.coordinator.txn``)."""


def _check(requests: tuple[Request, ...]) -> None:
    codes = [r.code for r in requests]
    framing = {
        int(c) for c in (frames.Code.OK, frames.Code.ERROR, frames.Code.HELLO, frames.Code.AUTH)
    }
    if len(set(codes)) != len(codes) or framing & set(codes):
        raise ValueError(f"request codes repeat or take the framing's: {sorted(codes)}")
    for r in requests:  # the names frames.Code keeps for hand-made frames (tests) agree
        named = frames.Code.__members__.get(r.name)
        if named is not None and int(named) != r.code:
            raise ValueError(f"{r.name}: code {r.code}, frames.Code says {int(named)}")


_check(BROKER + COORDINATOR)

__all__ = ["BROKER", "COORDINATOR", "Dispatch", "Request", "by_method"]
