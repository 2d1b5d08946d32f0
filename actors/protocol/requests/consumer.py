"""A consumer group's requests: offsets, heartbeats, leaving, sending back
(``actors.broker.processor.consumer_manage``, ``actors.broker.processor.send_back``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from actors.protocol.fencing import OffsetFencedError
from actors.protocol.requests.declare import (
    INTS,
    LIST,
    NOTHING,
    QUEUE_OFFSETS,
    Codec,
    Field,
    Request,
    rows,
)
from actors.protocol.requests.fields import CLIENT_ID, GROUP
from storage.errors import InvalidMessageError


def _tokens_from_wire(value: Any) -> Any:
    return {(t, q): (e, g) for t, q, e, g in rows(value, 4)} or None


_TOKENS = Codec(lambda v: [[t, q, e, g] for (t, q), (e, g) in v.items()], _tokens_from_wire)
"""Fencing tokens ``{(topic, queue id): (epoch, generation)}`` as rows of four."""


COMMIT_OFFSETS = Request(
    "COMMIT_OFFSETS",
    12,
    "commit_offsets",
    (
        GROUP,
        Field("offsets", "q", QUEUE_OFFSETS),
        replace(CLIENT_ID, default=""),
        Field("tokens", "k", _TOKENS, default=None, omit=True),
    ),
    served_by=("groups", "commit_offsets"),
    errors=(InvalidMessageError, OffsetFencedError),
    doc="Commit ``{(topic, queue id): offset}``, all or nothing; how many were committed.",
)

SEND_BACK = Request(
    "SEND_BACK",
    13,
    "consumer_send_msg_back",
    (
        GROUP,
        Field("commitlog_offsets", "q", INTS),
        Field("max_reconsume_times", "x"),
        Field("reconsume_times", "t", INTS, default=None),
    ),
    served_by=("sender", "consumer_send_msg_back"),
    errors=(InvalidMessageError,),
    doc="Retry (or dead-letter) copies of consumed messages; where each went.",
)

HEARTBEAT = Request(
    "HEARTBEAT",
    14,
    "heartbeat",
    (
        GROUP,
        CLIENT_ID,
        Field("topics", "t", LIST),
        Field("ttl_s", "l", default=None),
    ),
    served_by=("groups", "heartbeat"),
    answer=NOTHING,
    errors=(InvalidMessageError,),
    doc="A consumer's sign of life.",
)

UNREGISTER = Request(
    "UNREGISTER",
    15,
    "unregister_consumer",
    (GROUP, CLIENT_ID),
    served_by=("groups", "unregister_consumer"),
    answer=NOTHING,
    errors=(InvalidMessageError,),
    doc="A consumer leaving its group cleanly.",
)

REQUESTS = (COMMIT_OFFSETS, SEND_BACK, HEARTBEAT, UNREGISTER)
