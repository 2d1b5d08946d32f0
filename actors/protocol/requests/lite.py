"""Lite topics on the data path: sends, subscriptions, receives, acks and pulls of the
lite topics of a LITE parent (``actors.broker.lite.processor``). Each stands for the
Broker's ``lite_*`` Ray method of the same arguments; receives and pulls answer the
records as stored, decoded by the client."""

from __future__ import annotations

from typing import Any

from actors.protocol.requests.declare import INT, LIST, Answer, Codec, Field, Request
from actors.protocol.requests.fields import CLIENT_ID, GROUP
from storage.codec import decode_records
from storage.errors import (
    BrokerUnavailableError,
    InvalidMessageError,
    PermissionDeniedError,
    TopicNotFoundError,
)
from storage.lite.errors import (
    IllegalLiteTopicError,
    LiteTopicQuotaExceededError,
    NotALiteParentError,
)

_ERRORS = (
    IllegalLiteTopicError,
    LiteTopicQuotaExceededError,
    InvalidMessageError,
    TopicNotFoundError,
    PermissionDeniedError,
    BrokerUnavailableError,
    NotALiteParentError,
)

PARENT = Field("parent", "p")
LITE_TOPIC = Field("lite_topic", "l")
MAX_COUNT = Field("max_count", "n", INT, default=32)
WAIT_MS = Field("wait_ms", "w", INT, default=0)


def _items(value: Any) -> list[Any]:
    """A send's items: ``(lite topic, body[, options])`` each, as a list (msgpack's)."""
    return [list(item) if isinstance(item, tuple) else item for item in value]


def _reply_parts(answer: Any) -> tuple[dict[str, Any], list[Any]]:
    head, parts = answer
    return {"r": head}, [p for p in (parts if isinstance(parts, list) else [parts]) if len(p)]


def _read_batches(h: Any, body: Any) -> list[dict[str, Any]]:
    heads = h.get("r") or []
    messages = decode_records(body, check_crc=False) if body is not None and len(body) else []
    if sum(head[2] for head in heads) != len(messages):
        raise InvalidMessageError(f"a lite receive's answer: {heads!r:.80} and {len(messages)}")
    out, at = [], 0
    for name, offset, count, next_offset in heads:
        out.append(
            {
                "lite_topic": name,
                "offset": offset,
                "messages": messages[at : at + count],
                "next_offset": next_offset,
            }
        )
        at += count
    return out


def _read_pull(h: Any, body: Any) -> dict[str, Any]:
    head = dict(h.get("r") or {})
    count = head.pop("count", 0)
    messages = decode_records(body, check_crc=False) if count else []
    return {**head, "messages": messages}


LITE_SEND = Request(
    "LITE_SEND",
    40,
    "lite_send",
    (PARENT, Field("items", "m", Codec(_items))),
    serve="lite.send",
    errors=_ERRORS,
    doc="Messages to lite topics of a parent; per message its lite topic, offset and id.",
)

LITE_SUBSCRIBE = Request(
    "LITE_SUBSCRIBE",
    41,
    "lite_subscribe",
    (
        GROUP,
        PARENT,
        CLIENT_ID,
        Field("lite_topics", "s", LIST),
        Field("action", "a", default="add"),
    ),
    serve="lite_consumers.subscribe",
    errors=_ERRORS,
    doc=(
        "Add, remove, set or keep (a resync: add those that exist) a consumer's lite "
        "topics; those it subscribes and owns, and those a keep found gone."
    ),
)

LITE_RECEIVE = Request(
    "LITE_RECEIVE",
    42,
    "lite_receive",
    (GROUP, PARENT, CLIENT_ID, MAX_COUNT, WAIT_MS, Field("peek", "k", default=False, omit=True)),
    answer=Answer(_reply_parts, _read_batches),
    serve="lite.receive_packed",
    ordered=False,
    errors=_ERRORS,
    doc="Messages of the lite topics a consumer owns, per lite topic from where the group "
    "stands; held up to ``wait_ms`` for a send when there are none. With ``peek``: only "
    "which of them have messages (none handed out).",
)

LITE_ACK = Request(
    "LITE_ACK",
    43,
    "lite_ack",
    (GROUP, PARENT, CLIENT_ID, LITE_TOPIC, Field("offset", "x", INT)),
    serve="lite_consumers.ack",
    errors=_ERRORS,
    doc="Commit a lite topic for the group up to an offset (its owner only).",
)

LITE_PULL = Request(
    "LITE_PULL",
    44,
    "lite_pull",
    (PARENT, LITE_TOPIC, Field("offset", "x", INT), MAX_COUNT, WAIT_MS),
    answer=Answer(_reply_parts, _read_pull),
    serve="lite.pull_packed",
    ordered=False,
    errors=_ERRORS,
    doc="A lite topic from an offset, whoever owns it (a resume); held up to ``wait_ms`` "
    "for a send when there is nothing there yet.",
)

LITE_COMMITTED_OFFSET = Request(
    "LITE_COMMITTED_OFFSET",
    45,
    "lite_committed_offset",
    (GROUP, PARENT, LITE_TOPIC),
    serve="lite.committed_offset",
    errors=_ERRORS,
    doc="A group's committed offset of a lite topic.",
)

REQUESTS = (LITE_SEND, LITE_SUBSCRIBE, LITE_RECEIVE, LITE_ACK, LITE_PULL, LITE_COMMITTED_OFFSET)
