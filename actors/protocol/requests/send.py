"""Sends: a batch to store, over the socket or through the producer's shared ring
(``actors.broker.processor.send``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.protocol.requests.declare import (
    BODY,
    INT,
    Answer,
    Codec,
    Field,
    Request,
    body,
)
from actors.protocol.requests.fields import AUTO_CREATE_QUEUE_NUMS
from storage.errors import (
    BrokerUnavailableError,
    InvalidMessageError,
    PermissionDeniedError,
    ProducerSequenceError,
    TopicNotFoundError,
)

_ERRORS = (
    InvalidMessageError,
    TopicNotFoundError,
    PermissionDeniedError,
    ProducerSequenceError,
    BrokerUnavailableError,
)

SEND = Request(
    "SEND",
    10,
    "send",
    (body("blob"), AUTO_CREATE_QUEUE_NUMS),
    served_by=("sender", "send"),
    answer=BODY,
    errors=_ERRORS,
    doc="One encoded batch (``EncodedBatch.to_bytes``) to store; answers its ack's bytes.",
)


def _reply_shared(ack: Any) -> tuple[dict[str, Any], list[Any]]:
    return ({"u": 1}, []) if ack is None else ({}, [ack])


def _read_shared(h: Mapping[str, Any], body: Any) -> Any:
    return None if h.get("u") else body


def _ring_from_wire(value: Any) -> Any:
    """A ring's id as msgpack carries it (a list): the tuple the ring reader checks."""
    return tuple(value) if isinstance(value, list) else value


SEND_SHARED = Request(
    "SEND_SHARED",
    23,
    "send_shared",
    (
        Field("ring", "r", Codec(list, _ring_from_wire)),
        Field("offset", "x", INT),
        Field("length", "l", INT),
        AUTO_CREATE_QUEUE_NUMS,
    ),
    # "u": the broker cannot read the ring (the producer sends through Ray's store then)
    served_by=("sender", "send_shared"),
    answer=Answer(_reply_shared, _read_shared),
    errors=_ERRORS,
    doc="A send whose batch waits in the producer's shared ring (``actors.protocol.shared_ring``).",
)

REQUESTS = (SEND, SEND_SHARED)
