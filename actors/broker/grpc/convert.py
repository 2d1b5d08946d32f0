"""RocketMQ 5's protocol values ↔ RayMQ's: resource names, messages, status codes.

* **Names.** A RocketMQ 5 ``Resource`` (``resource_namespace``, ``name``) is the RayMQ
  topic or group ``<namespace>%<name>``, or ``<name>`` when the namespace is empty:
  RocketMQ's own ``NamespaceUtil`` wrapping, so a 4.x client that wraps names itself
  reaches the same topics.
* **Messages.** A client's ``message_id`` is kept as the message's ``UNIQ_KEY``, which is
  RayMQ's ``MessageExt.msg_id``: both sides see one id. ``message_group`` is the
  ``__SHARDINGKEY`` property (RocketMQ's name) and picks the queue; a
  ``delivery_timestamp`` is the ``TIMER_DELIVER_MS`` property (epoch ms, RocketMQ 5's
  timer messages); a transactional message is a half message (``TRAN_MSG``, ``PGROUP``).
* **Errors.** :func:`status_of` maps RayMQ's errors to ``apache.rocketmq.v2.Code`` in one
  table; a call answers that code, never a broker crash.

Imports the generated protocol modules: imported only by ``actors.broker.grpc.service``
and its activities, themselves imported only when a broker starts its endpoint (see
docs/rocketmq5.md).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import re
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from actors.broker.grpc.auth import AuthError
from actors.broker.grpc.v2 import definition_pb2 as pb
from storage.codec import TOPIC_RE
from storage.errors import (
    BrokerUnavailableError,
    DiskFullError,
    InvalidConfigError,
    InvalidMessageError,
    InvalidReceiptHandleError,
    OffsetOutOfRangeError,
    PermissionDeniedError,
    RayMQError,
    StoreClosedError,
    TopicNotFoundError,
)
from storage.lite import (
    PROP_LITE_TOPIC,
    IllegalLiteTopicError,
    LiteTopicQuotaExceededError,
    NotALiteParentError,
)
from storage.message import Message, MessageExt
from storage.properties import (
    PROP_KEYS,
    PROP_PRODUCER_GROUP,
    PROP_TAGS,
    PROP_TRAN_MSG,
    PROP_UNIQ_KEY,
)

PROP_SHARDING_KEY = "__SHARDINGKEY"  # RocketMQ's MessageConst.PROPERTY_SHARDING_KEY
PROP_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # RocketMQ 5's timer messages
MAX_DELAY_S = 40 * 86400  # a delivery time further ahead is ILLEGAL_DELIVERY_TIME
_MESSAGE_ID_RE = re.compile(r"[0-9A-Za-z_.:-]{1,128}")
_SYSTEM_USER_KEYS = frozenset(
    {PROP_UNIQ_KEY, PROP_TAGS, PROP_KEYS, PROP_SHARDING_KEY, PROP_TIMER_DELIVER_MS}
    | {PROP_TRAN_MSG, PROP_PRODUCER_GROUP, "DELAY", "REAL_TOPIC", "REAL_QID", PROP_LITE_TOPIC}
)


class StatusError(Exception):
    """A request refused with a RocketMQ 5 status code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_ERROR_CODES: tuple[tuple[type[BaseException], int], ...] = (
    # first match wins: subclasses before their bases
    (AuthError, pb.Code.UNAUTHORIZED),
    (IllegalLiteTopicError, pb.Code.ILLEGAL_LITE_TOPIC),
    (LiteTopicQuotaExceededError, pb.Code.LITE_TOPIC_QUOTA_EXCEEDED),
    (NotALiteParentError, pb.Code.BAD_REQUEST),
    (TopicNotFoundError, pb.Code.TOPIC_NOT_FOUND),
    (InvalidReceiptHandleError, pb.Code.INVALID_RECEIPT_HANDLE),
    (PermissionDeniedError, pb.Code.FORBIDDEN),
    (InvalidMessageError, pb.Code.BAD_REQUEST),
    (InvalidConfigError, pb.Code.BAD_REQUEST),
    (OffsetOutOfRangeError, pb.Code.ILLEGAL_OFFSET),
    (DiskFullError, pb.Code.INTERNAL_SERVER_ERROR),
    (StoreClosedError, pb.Code.INTERNAL_SERVER_ERROR),
    (BrokerUnavailableError, pb.Code.INTERNAL_SERVER_ERROR),
    (RayMQError, pb.Code.INTERNAL_ERROR),
)
"""RayMQ's errors → RocketMQ 5 codes (``RayMQError`` subclasses; anything else is
``INTERNAL_ERROR`` too, and logged)."""


def status_of(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, StatusError):
        return exc.code, exc.message
    for kind, code in _ERROR_CODES:
        if isinstance(exc, kind):
            return code, f"{type(exc).__name__}: {exc}"
    return pb.Code.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"


def status(code: int = pb.Code.OK, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)  # type: ignore[arg-type]


def overall_status(entries: Sequence[Any]) -> pb.Status:
    """A batch answer's status from its entries': OK if all are, an only entry's own,
    else ``MULTIPLE_RESULTS``."""
    if {e.status.code for e in entries} == {pb.Code.OK}:
        return status()
    if len(entries) == 1:
        return entries[0].status  # type: ignore[no-any-return]
    return status(pb.Code.MULTIPLE_RESULTS, "some entries failed")


# ---------------------------------------------------------------- names


def raymq_name(resource: pb.Resource, what: str = "topic") -> str:
    """The RayMQ topic (or group) a RocketMQ 5 ``Resource`` names."""
    name = resource.name
    full = f"{resource.resource_namespace}%{name}" if resource.resource_namespace else name
    if not name or not TOPIC_RE.fullmatch(full):
        code = pb.Code.ILLEGAL_TOPIC if what == "topic" else pb.Code.ILLEGAL_CONSUMER_GROUP
        raise StatusError(code, f"{what} {full!r}: must match [A-Za-z0-9_%|-]{{1,127}}")
    return full


def resource_of(raymq: str, namespace: str) -> pb.Resource:
    """The ``Resource`` a client of ``namespace`` knows the RayMQ name ``raymq`` by."""
    prefix = f"{namespace}%" if namespace else ""
    name = raymq[len(prefix) :] if prefix and raymq.startswith(prefix) else raymq
    return pb.Resource(resource_namespace=namespace, name=name)


# ---------------------------------------------------------------- messages


_MS_IN_SECONDS = 100_000_000_000  # as seconds: the year 5138; as ms: March 1973


def _ms(ts: Any) -> int:
    """A ``Timestamp`` in epoch ms. The official Python client (5.1.x) puts its
    ``delivery_timestamp``, documented and given in ms, into the ``seconds`` field: a
    ``seconds`` past the year 5138 is read as ms, so that client's delays work unchanged."""
    if ts.seconds > _MS_IN_SECONDS:
        return int(ts.seconds)
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip member (header and trailer checked)


def gunzip_body(data: bytes, max_body: int) -> bytes:
    """A GZIP body as it was before the client compressed it (RocketMQ's Java client
    compresses bodies over 4 KiB and says so in ``body_encoding``): the store keeps the
    original bytes. Bounded: inflating stops past ``max_body`` bytes
    (``MESSAGE_BODY_TOO_LARGE``, so a small bomb costs at most that much memory); a
    corrupt, truncated or non-GZIP body is ``BAD_REQUEST``. Concatenated members are
    one body, as ``GZIPInputStream`` reads them."""
    out: list[bytes] = []
    size = 0
    rest = data
    while True:
        inflater = zlib.decompressobj(_GZIP_WBITS)
        try:
            chunk = inflater.decompress(rest, max_body + 1 - size)
        except zlib.error as exc:
            raise StatusError(pb.Code.BAD_REQUEST, f"the GZIP body is corrupt: {exc}") from exc
        size += len(chunk)
        out.append(chunk)
        if size > max_body:
            raise StatusError(
                pb.Code.MESSAGE_BODY_TOO_LARGE,
                f"the GZIP body inflates to over the broker's {max_body} bytes",
            )
        if not inflater.eof:  # all input taken, no end of stream: cut short
            raise StatusError(pb.Code.BAD_REQUEST, "the GZIP body is truncated")
        rest = inflater.unused_data
        if not rest:
            break
    body = b"".join(out)
    if not body:
        raise StatusError(pb.Code.MESSAGE_BODY_EMPTY, "the GZIP body inflates to nothing")
    return body


def to_store_message(
    msg: pb.Message,
    topic: str,
    queue_id: int,
    max_body: int,
    *,
    transaction_group: str | None = None,
    now_ms: int | None = None,
) -> Message:
    """A RocketMQ 5 message as RayMQ stores it, checked as RocketMQ's proxy does."""
    sp = msg.system_properties
    body = msg.body
    if not body:
        raise StatusError(pb.Code.MESSAGE_BODY_EMPTY, "the message body is empty")
    if len(body) > max_body:
        raise StatusError(
            pb.Code.MESSAGE_BODY_TOO_LARGE,
            f"the message body is {len(body)} bytes: over the broker's {max_body}",
        )
    if not _MESSAGE_ID_RE.fullmatch(sp.message_id):
        raise StatusError(pb.Code.ILLEGAL_MESSAGE_ID, f"message_id {sp.message_id!r} is invalid")
    if sp.body_encoding == pb.Encoding.GZIP:
        body = gunzip_body(body, max_body)
    elif sp.body_encoding not in (pb.Encoding.IDENTITY, pb.Encoding.ENCODING_UNSPECIFIED):
        raise StatusError(pb.Code.BAD_REQUEST, f"body_encoding {sp.body_encoding} is unknown")
    props: dict[str, str] = {}
    for key, value in msg.user_properties.items():
        if key in _SYSTEM_USER_KEYS or not key:
            raise StatusError(
                pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"user property {key!r} is reserved"
            )
        props[key] = value
    props[PROP_UNIQ_KEY] = sp.message_id
    mtype = sp.message_type
    has_group = sp.HasField("message_group")
    has_delivery = sp.HasField("delivery_timestamp")
    if has_group:
        group = sp.message_group
        if not group or len(group) > 64 or "\x01" in group or "\x02" in group:
            raise StatusError(pb.Code.ILLEGAL_MESSAGE_GROUP, f"message_group {group!r} is invalid")
        props[PROP_SHARDING_KEY] = group
    if has_delivery:
        at = _ms(sp.delivery_timestamp)
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if at - now > MAX_DELAY_S * 1000:
            raise StatusError(
                pb.Code.ILLEGAL_DELIVERY_TIME,
                f"delivery_timestamp is more than {MAX_DELAY_S // 86400} days ahead",
            )
        props[PROP_TIMER_DELIVER_MS] = str(at)
    if transaction_group is not None:
        if has_group or has_delivery:
            raise StatusError(
                pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                "a transactional message has no message_group and no delivery_timestamp",
            )
        props[PROP_TRAN_MSG] = "true"
        props[PROP_PRODUCER_GROUP] = transaction_group
    elif (mtype == pb.MessageType.FIFO and not has_group) or (
        mtype == pb.MessageType.DELAY and not has_delivery
    ):
        raise StatusError(
            pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"message_type {pb.MessageType.Name(mtype)} without its property",
        )
    tag = sp.tag if sp.HasField("tag") else None
    if tag is not None and (not tag or "||" in tag or tag == "*"):
        raise StatusError(pb.Code.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} is invalid")
    return Message(
        topic=topic, body=body, tags=tag, keys=tuple(sp.keys), properties=props, queue_id=queue_id
    )


def _digest(sp: Any, body: bytes) -> None:
    """The body's digest the clients check: MD5 in upper-case hex, as RocketMQ's proxy
    sends it (``GrpcConverter``). Every official client checks it alike; a CRC32's text
    is not agreed on (the Java client reads hex, the Node.js client 1.0.8 decimal, and
    its push consumers discard a message whose digest does not match)."""
    sp.body_digest.type = pb.DigestType.MD5
    sp.body_digest.checksum = hashlib.md5(body).hexdigest().upper()


def to_pb_message(
    ext: MessageExt,
    resource: pb.Resource,
    *,
    receipt_handle: str | None = None,
    invisible_ms: int | None = None,
    delivery_attempt: int | None = None,
) -> pb.Message:
    """A stored message as a RocketMQ 5 client receives it."""
    props: Mapping[str, str] = ext.properties
    out = pb.Message(topic=resource, body=ext.body)
    sp = out.system_properties
    tags = props.get(PROP_TAGS)
    if tags:
        sp.tag = tags
    keys = props.get(PROP_KEYS)
    if keys:
        sp.keys.extend(k for k in keys.split(" ") if k)
    sp.message_id = ext.msg_id
    sp.body_encoding = pb.Encoding.IDENTITY
    _digest(sp, ext.body)
    group = props.get(PROP_SHARDING_KEY)
    deliver = props.get(PROP_TIMER_DELIVER_MS)
    if group:
        sp.message_group = group
        sp.message_type = pb.MessageType.FIFO
    elif deliver:
        sp.message_type = pb.MessageType.DELAY
        with contextlib.suppress(ValueError):
            sp.delivery_timestamp.FromMilliseconds(int(deliver))
    else:
        sp.message_type = pb.MessageType.NORMAL
    sp.born_timestamp.FromMilliseconds(ext.born_timestamp)
    sp.born_host = ext.born_host
    sp.store_timestamp.FromMilliseconds(ext.store_timestamp)
    sp.store_host = ext.store_host
    sp.queue_id = ext.queue_id
    sp.queue_offset = ext.queue_offset
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if invisible_ms is not None:
        sp.invisible_duration.FromMilliseconds(invisible_ms)
    sp.delivery_attempt = delivery_attempt if delivery_attempt is not None else 1
    for key, value in props.items():
        if key not in _SYSTEM_USER_KEYS:
            out.user_properties[key] = value
    return out


def transaction_check_message(message: Message, resource: pb.Resource, msg_id: str) -> pb.Message:
    """A half message as an orphaned-transaction check shows it to its producer."""
    out = pb.Message(topic=resource, body=message.body)
    sp = out.system_properties
    if message.tags:
        sp.tag = message.tags
    keys = [message.keys] if isinstance(message.keys, str) else list(message.keys)
    sp.keys.extend(k for k in keys if k)
    sp.message_id = msg_id
    sp.message_type = pb.MessageType.TRANSACTION
    sp.body_encoding = pb.Encoding.IDENTITY
    _digest(sp, message.body)
    for key, value in (message.properties or {}).items():
        if key not in _SYSTEM_USER_KEYS:
            out.user_properties[key] = value
    return out


# ---------------------------------------------------------------- recall handles


class RecallHandle(NamedTuple):
    """What a timer message's recall handle names (RocketMQ 5.3's ``HandleV1``)."""

    topic: str
    broker: str
    deliver_ms: int
    message_id: str

    def encode(self) -> str:
        """URL-safe base64 of ``v1 <topic> <broker> <delivery ms> <message id>``, padded,
        as RocketMQ's broker writes it (a client hands it back unread)."""
        raw = " ".join(("v1", self.topic, self.broker, str(self.deliver_ms), self.message_id))
        return base64.urlsafe_b64encode(raw.encode()).decode()

    @classmethod
    def decode(cls, text: str) -> RecallHandle:
        """The handle, or ``StatusError`` with RocketMQ's answer to a malformed one
        (its proxy's ``INTERNAL_SERVER_ERROR``, "recall handle is invalid"). A handle
        without its padding is taken too (some clients' ports drop it)."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
            version, topic, broker, deliver, message_id, *_ = raw.split(" ")
            deliver_ms = int(deliver)
        except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
            raise StatusError(pb.Code.INTERNAL_SERVER_ERROR, "recall handle is invalid") from exc
        if version != "v1" or not (topic and broker and message_id) or deliver_ms <= 0:
            raise StatusError(pb.Code.INTERNAL_SERVER_ERROR, "recall handle is invalid")
        return cls(topic, broker, deliver_ms, message_id)
