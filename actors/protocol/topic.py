"""Topic configuration and permissions, as RocketMQ defines them.

``perm`` is a bit set: 4 = readable, 2 = writable, 6 = both (1 = inherit, only
on the auto-create template topic ``TBW102``). A topic has ``write_queue_nums``
queues producers may pick and ``read_queue_nums`` queues consumers read; a
broker keeps its topics' configs in ``config/topics.json`` under RocketMQ's
field names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from storage import codec, transaction
from storage.codec import validate_topic
from storage.errors import InvalidConfigError
from storage.message import MessageExt
from storage.timer import TIMER_TOPIC

PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
USER_PERMS = (PERM_WRITE, PERM_READ, PERM_READ | PERM_WRITE)
MAX_QUEUE_NUMS = 1024

AUTO_CREATE_TOPIC_KEY = "TBW102"
"""The template topic a broker with auto-create on advertises (RocketMQ's name)."""
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
SYSTEM_TOPICS = frozenset(
    {
        AUTO_CREATE_TOPIC_KEY,
        "SCHEDULE_TOPIC_XXXX",
        transaction.HALF_TOPIC,
        transaction.OP_HALF_TOPIC,
        transaction.CHECK_MAX_TOPIC,
        transaction.COMMIT_TOPIC,
        TIMER_TOPIC,
    }
)
"""Topics producers may not send to (clients check; brokers write them themselves)."""
SYSTEM_TOPIC_PREFIX = "RMQ_SYS_"
"""RocketMQ's system topics (``RMQ_SYS_TRANS_HALF_TOPIC``, ``RMQ_SYS_TRACE_TOPIC``, ...)."""


def is_system_topic(topic: str, *names: str) -> bool:
    """A topic nobody may delete or re-perm: ``TBW102``, ``SCHEDULE_TOPIC_XXXX``,
    ``RMQ_SYS_*`` (in any case, as RocketMQ's ``TopicValidator``), and ``names``
    (a broker passes its cluster and broker names: RocketMQ creates topics named so)."""
    return topic in SYSTEM_TOPICS or topic.upper().startswith(SYSTEM_TOPIC_PREFIX) or topic in names


def perm_to_string(perm: int) -> str:
    return (
        ("R" if perm & PERM_READ else "-")
        + ("W" if perm & PERM_WRITE else "-")
        + ("X" if perm & PERM_INHERIT else "-")
    )


def is_readable(perm: int) -> bool:
    return bool(perm & PERM_READ)


def is_writeable(perm: int) -> bool:
    return bool(perm & PERM_WRITE)


@dataclass(frozen=True)
class TopicConfig:
    """One topic on one broker."""

    topic_name: str
    read_queue_nums: int = 8
    write_queue_nums: int = 8
    perm: int = PERM_READ | PERM_WRITE
    order: bool = False

    def __post_init__(self) -> None:
        validate_topic(self.topic_name)
        for name in ("read_queue_nums", "write_queue_nums"):
            value = getattr(self, name)
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or not 1 <= value <= MAX_QUEUE_NUMS
            ):
                raise InvalidConfigError(
                    f"{name}={value!r} for topic {self.topic_name!r}: must be an int in 1..{MAX_QUEUE_NUMS}"
                )
        allowed = USER_PERMS + (
            (PERM_READ | PERM_WRITE | PERM_INHERIT,)
            if self.topic_name == AUTO_CREATE_TOPIC_KEY
            else ()
        )
        if self.perm not in allowed:
            raise InvalidConfigError(
                f"perm={self.perm!r} for topic {self.topic_name!r}: must be one of {allowed} "
                "(2 = write only, 4 = read only, 6 = read and write)"
            )

    @classmethod
    def checked(cls, value: object) -> TopicConfig:
        """A fresh, validated copy of ``value`` (a TopicConfig or a mapping of its fields):
        what a broker takes from a caller, whatever the caller built around the checks."""
        if isinstance(value, TopicConfig):
            fields = {f: getattr(value, f) for f in _FIELDS}
        elif isinstance(value, Mapping):
            return cls.from_dict(value)
        else:
            raise InvalidConfigError(
                f"topic config: expected a TopicConfig, got {type(value).__name__}"
            )
        if not isinstance(fields["order"], bool):
            raise InvalidConfigError(f"order={fields['order']!r} for a topic: must be a bool")
        if not isinstance(fields["perm"], int) or isinstance(fields["perm"], bool):
            raise InvalidConfigError(f"perm={fields['perm']!r} for a topic: must be an int")
        return cls(**fields)

    @property
    def readable(self) -> bool:
        return is_readable(self.perm)

    @property
    def writeable(self) -> bool:
        return is_writeable(self.perm)

    def to_dict(self) -> dict[str, Any]:
        """RocketMQ's ``topics.json`` field names."""
        return {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": self.order,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TopicConfig:
        """From RocketMQ's camelCase fields or this class's snake_case ones."""

        def pick(snake: str, camel: str, default: Any) -> Any:
            return data.get(snake, data.get(camel, default))

        name = pick("topic_name", "topicName", None) or data.get("name")
        if name is None:
            raise InvalidConfigError(f"topic config {dict(data)!r}: needs topic_name")
        try:
            return cls(
                topic_name=name,
                read_queue_nums=int(pick("read_queue_nums", "readQueueNums", 8)),
                write_queue_nums=int(pick("write_queue_nums", "writeQueueNums", 8)),
                perm=int(pick("perm", "perm", PERM_READ | PERM_WRITE)),
                order=bool(pick("order", "order", False)),
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, InvalidConfigError):
                raise
            raise InvalidConfigError(f"topic config {dict(data)!r}: {exc}") from exc


def retry_topic(group: str) -> str:
    """``%RETRY%<group>``, validated as a topic name."""
    return codec.validate_topic(f"{RETRY_GROUP_TOPIC_PREFIX}{group}")


def dlq_topic(group: str) -> str:
    """``%DLQ%<group>``, validated as a topic name."""
    return codec.validate_topic(f"{DLQ_GROUP_TOPIC_PREFIX}{group}")


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def origin_topic(m: MessageExt) -> str:
    """The topic a message was first consumed from (its own unless it is a retry copy)."""
    return m.properties.get(codec.PROP_RETRY_TOPIC) or m.topic


_FIELDS = ("topic_name", "read_queue_nums", "write_queue_nums", "perm", "order")
