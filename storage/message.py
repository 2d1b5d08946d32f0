"""The values the store takes and gives: messages, put and get results.

``Message`` and ``MessageExt`` are slotted dataclasses rather than frozen ones:
they are built once per message on the hottest paths (encode, decode), where a
frozen dataclass's ``object.__setattr__`` per field costs more than the rest of
the work. Treat them as read-only once handed to the store.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import InvalidMessageError
from .message_id import make_offset_msg_id
from .properties import (
    PROP_REAL_QID,
    PROP_REAL_TOPIC,
    PROP_TIMER_DELAY_SEC,
    PROP_TIMER_DELIVER_MS,
    decode_properties,
)


class PutStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"


class GetStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"


@dataclass(slots=True)
class Message:
    """A message as a producer builds it.

    ``keys`` may be one string or a sequence; each key is indexed as
    ``topic#key``. ``delay_level`` (1-based, 0 = none) asks for delayed delivery at
    one of the broker's levels; ``deliver_at_ms`` (epoch milliseconds, an int) for
    delivery at that time, within a second (``storage.timer``). It is kept as the
    ``TIMER_DELIVER_MS`` property, the contract RocketMQ 5 defines, not as a field of
    its own (so the encoders' plain fast paths see a message with properties). A time
    now or past is delivered at once; more than the broker's ``timer_max_delay_ms``
    ahead is refused. With both, the delay level wins, as in RocketMQ.
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: Sequence[str] | str = ()
    properties: Mapping[str, str] | None = None
    queue_id: int = 0
    flag: int = 0
    delay_level: int = 0

    def __init__(
        self,
        topic: str,
        body: bytes,
        tags: str | None = None,
        keys: Sequence[str] | str = (),
        properties: Mapping[str, str] | None = None,
        queue_id: int = 0,
        flag: int = 0,
        delay_level: int = 0,
        deliver_at_ms: int | None = None,
    ) -> None:
        self.topic = topic
        self.body = body
        self.tags = tags
        self.keys = keys
        if deliver_at_ms is not None:
            properties = _with_deliver_at(properties, deliver_at_ms)
        self.properties = properties
        self.queue_id = queue_id
        self.flag = flag
        self.delay_level = delay_level

    @property
    def deliver_at_ms(self) -> int | None:
        """The delivery time asked for (epoch ms), or None."""
        text = self.properties.get(PROP_TIMER_DELIVER_MS) if self.properties else None
        return int(text) if text is not None and text.isdigit() else None


def _with_deliver_at(properties: Mapping[str, str] | None, deliver_at_ms: int) -> dict[str, str]:
    if deliver_at_ms.__class__ is not int or deliver_at_ms < 0:
        raise InvalidMessageError(
            f"deliver_at_ms={deliver_at_ms!r}: must be an int >= 0 (epoch milliseconds)"
        )
    props = dict(properties or {})
    if PROP_TIMER_DELAY_SEC in props:
        raise InvalidMessageError("deliver_at_ms and a TIMER_DELAY_SEC property both given")
    props[PROP_TIMER_DELIVER_MS] = str(deliver_at_ms)
    return props


class _MessageExtFields(NamedTuple):
    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    store_size: int
    born_timestamp: int
    store_timestamp: int
    born_host: str
    store_host: str
    flag: int = 0
    sys_flag: int = 0
    body_crc: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    raw_properties: bytes = b""


class MessageExt(_MessageExtFields):
    """A stored message with everything the store knows about it.

    A named tuple (built in C, thousands per pull) whose properties are parsed
    from ``raw_properties`` on first access and cached: decoding a pull should
    not pay for text nobody reads.
    """

    @property
    def properties(self) -> dict[str, str]:
        cache = self.__dict__
        props: dict[str, str] | None = cache.get("_props")
        if props is None:
            props = cache["_props"] = decode_properties(self.raw_properties)
        return props

    def __repr__(self) -> str:
        return (
            f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, msg_id={self.msg_id!r}, "
            f"tags={self.tags!r}, body={self.body[:32]!r}{'...' if len(self.body) > 32 else ''})"
        )

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> tuple[str, ...]:
        raw = self.properties.get("KEYS")
        return tuple(k for k in raw.split(" ") if k) if raw else ()

    @property
    def offset_msg_id(self) -> str:
        """Store host + port + commitlog offset, 32 hex chars: where the bytes are."""
        return make_offset_msg_id(self.store_host, self.commitlog_offset)

    @property
    def msg_id(self) -> str:
        """The producer's unique key when it set one (as RocketMQ shows), else the offset id."""
        return self.properties.get("UNIQ_KEY") or self.offset_msg_id

    @property
    def delay_level(self) -> int:
        return int(self.properties.get("DELAY", "0") or 0)


def copied(
    m: MessageExt, topic: str, queue_id: int, properties: Mapping[str, str], delay_level: int = 0
) -> Message:
    """A message with ``m``'s body, tags, keys and flag, for ``topic`` and ``queue_id``
    with ``properties``: the copies the store puts for delivery, transactions and retries."""
    return Message(
        topic,
        m.body,
        tags=m.tags,
        keys=m.keys,
        properties=properties,
        queue_id=queue_id,
        flag=m.flag,
        delay_level=delay_level,
    )


def to_real_topic(m: MessageExt, hidden: Collection[str]) -> Message:
    """The message a parked copy (schedule, timer or half) stands for: back to the topic
    and queue its ``REAL_TOPIC`` and ``REAL_QID`` name, without the ``hidden`` properties."""
    props = {k: v for k, v in m.properties.items() if k not in hidden}
    return copied(m, m.properties[PROP_REAL_TOPIC], int(m.properties[PROP_REAL_QID]), props)


class PutResult(NamedTuple):
    """One stored message. A NamedTuple: built per message on the put path."""

    status: PutStatus
    msg_id: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    offset_msg_id: str = ""
    topic: str = ""


@dataclass(frozen=True, slots=True)
class GetResult:
    status: GetStatus
    messages: list[MessageExt]
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class RawGetResult:
    """A pull answered as stored bytes: ``data`` holds ``count`` records back to back.

    This is what a broker ships to a consumer: one blob, decoded on the client
    with :func:`storage.codec.decode_records`.
    """

    status: GetStatus
    data: bytes | memoryview  # a view of the CommitLog when asked for (get_raw(view=True))
    count: int
    next_offset: int
    min_offset: int
    max_offset: int
    sizes: Any = None  # int32 array of the records' sizes, so decoding needs no size walk

    def starts(self) -> Any:
        """Start position of each record in ``data`` (numpy int64), or None."""
        return record_starts_of(self.sizes)


def record_starts_of(sizes: Any) -> Any:
    """Where each of the records laid back to back with ``sizes`` starts (numpy
    int64), or None when the sizes are not known."""
    if sizes is None:
        return None
    import numpy as np  # not at the top: most users of this module never need it

    sizes = np.asarray(sizes, dtype=np.int64)
    return np.cumsum(sizes) - sizes
