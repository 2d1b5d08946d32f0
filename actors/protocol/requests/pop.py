"""POP consumption: receive, ack and change of invisible time by receipt handle
(``actors.broker.processor.pop``; RocketMQ 5's SimpleConsumer)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from actors.protocol.pop import PoppedMessage, pops_from_wire
from actors.protocol.requests.declare import Answer, Codec, Field, Request
from actors.protocol.requests.fields import GROUP, INVISIBLE_MS, RECEIPT_HANDLE, TOPIC
from storage.errors import (
    InvalidMessageError,
    InvalidReceiptHandleError,
    TopicNotFoundError,
)


def _reply_popped(popped: tuple[list[Any], Any]) -> tuple[dict[str, Any], list[Any]]:
    heads, records = popped  # what ``pop_packed`` answers: records as stored
    return {"r": heads}, [records] if records else []


def _read_popped(h: Any, body: Any) -> list[PoppedMessage]:
    return pops_from_wire(h.get("r"), body)


POP = Request(
    "POP",
    17,
    "pop",
    (
        GROUP,
        TOPIC,
        Field("max_msgs", "n"),
        INVISIBLE_MS,
        Field("wait_ms", "w", default=0),
        Field("fifo", "ff", default=False, keyword=True),
        Field("tag_expr", "x", default="*", keyword=True),
        Field("client_id", "id", default="", keyword=True),
    ),
    served_by=("popper", "pop"),
    answer=Answer(_reply_popped, _read_popped),
    serve="popper.pop_packed",  # the records as stored, the handles in the header
    ordered=False,
    errors=(InvalidMessageError, TopicNotFoundError),
    doc="Up to ``max_msgs`` messages made invisible to the group, each with its handle.",
)

ACK = Request(
    "ACK",
    18,
    "ack_message",
    (
        GROUP,
        TOPIC,
        replace(RECEIPT_HANDLE, codec=Codec(lambda v: v if isinstance(v, str) else list(v))),
    ),
    served_by=("popper", "ack_message"),
    errors=(InvalidMessageError, InvalidReceiptHandleError),
    doc="Ack by receipt handle; a list of handles answers, per handle, None or why not.",
)

CHANGE_INVISIBLE = Request(
    "CHANGE_INVISIBLE",
    19,
    "change_invisible_duration",
    (
        GROUP,
        TOPIC,
        RECEIPT_HANDLE,
        INVISIBLE_MS,
    ),
    served_by=("popper", "change_invisible_duration"),
    errors=(InvalidMessageError, InvalidReceiptHandleError),
    doc="Re-arm a received message's invisible time; its new receipt handle.",
)

REQUESTS = (POP, ACK, CHANGE_INVISIBLE)
