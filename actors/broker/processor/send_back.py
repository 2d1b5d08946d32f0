"""Consumer send-back on the broker (RocketMQ's ``consumerSendMsgBack``).

A consumer whose listener asked to consume messages later names them by
commitlog offset, many in one call. The broker reads each original from its
store and stores a copy:

* to ``%RETRY%<group>`` (one queue per broker, created on first use) with delay
  level ``3 + reconsume times``, so the schedule service redelivers it when due;
* or, once its reconsume times reached the consumer's ``max_reconsume_times``,
  to ``%DLQ%<group>`` (one queue, perm 2 = write only: no consumer reads it
  until an operator changes the perm).

The copy keeps the body, tags, keys and unique key (so the message id is the
same across retries), counts one more reconsume, and carries
``RETRY_TOPIC`` (the topic it was first consumed from), ``ORIGIN_MESSAGE_ID``
and ``RECONSUME_TIME``. The whole call is one put: all stored or none.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from actors.protocol.checks import validate_group
from actors.protocol.topic import (
    PERM_READ,
    PERM_WRITE,
    TopicConfig,
    dlq_topic,
    retry_topic,
)
from actors.protocol.wire import NOT_FOUND, SENT_TO_DLQ, SENT_TO_RETRY
from storage import codec
from storage.errors import InvalidMessageError, OffsetOutOfRangeError, StoreCorruptedError
from storage.message import Message, MessageExt

if TYPE_CHECKING:
    from actors.broker.runtime import BrokerRuntime
    from storage.store import MessageStore, PutBatchResult

log = logging.getLogger("raymq.actors.retry")

RETRY_QUEUE_NUMS = 1
DLQ_QUEUE_NUMS = 1
DLQ_PERM = PERM_WRITE
RETRY_DELAY_LEVEL_BASE = 3
# properties a stored copy must not inherit: the store sets them on the delay path
_DROPPED = (codec.PROP_DELAY, codec.PROP_REAL_TOPIC, codec.PROP_REAL_QID)


def send_back_copy(
    m: MessageExt, group: str, max_reconsume_times: int, levels: int
) -> tuple[Message, tuple[int, str, int], str]:
    """The retry (or dead-letter) copy of ``m``, its born fields, and where it goes."""
    props = {k: v for k, v in m.properties.items() if k not in _DROPPED}
    props.setdefault(codec.PROP_RETRY_TOPIC, m.topic)
    props.setdefault(codec.PROP_ORIGIN_MESSAGE_ID, m.msg_id)
    times = m.reconsume_times
    props[codec.PROP_RECONSUME_TIME] = str(times + 1)
    props[codec.PROP_MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    if times >= max_reconsume_times:
        topic, level, where = dlq_topic(group), 0, SENT_TO_DLQ
    else:
        topic, where = retry_topic(group), SENT_TO_RETRY
        level = min(RETRY_DELAY_LEVEL_BASE + times, levels)
    copy = Message(
        topic,
        m.body,
        tags=m.tags,
        keys=m.keys,
        properties=props,
        queue_id=0,
        flag=m.flag,
        delay_level=level,
    )
    return copy, (m.born_timestamp, m.born_host, times + 1), where


async def ensure_topic(broker: BrokerRuntime, config: TopicConfig) -> bool:
    """Create ``config`` on ``broker`` unless it exists (an operator's perm change
    stays); True when created, and then every NameServer knows it on return."""
    if broker.topics.get(config.topic_name) is not None:
        return False
    broker.topics.put(config)
    await broker.register_all()
    log.info(
        "created %s on %s (%d queue(s), perm %d)",
        config.topic_name,
        broker.config.broker_name,
        config.read_queue_nums,
        config.perm,
    )
    return True


async def create_retry_topic(broker: BrokerRuntime, group: str) -> bool:
    return await ensure_topic(
        broker,
        TopicConfig(retry_topic(group), RETRY_QUEUE_NUMS, RETRY_QUEUE_NUMS, PERM_READ | PERM_WRITE),
    )


def build_send_back(
    store: MessageStore,
    group: str,
    commitlog_offsets: Sequence[int],
    max_reconsume_times: int,
    reconsume_times: Sequence[int] | None = None,
) -> tuple[codec.EncodedBatch | None, list[str]]:
    """The encoded copies of the messages at ``commitlog_offsets`` (None when none was
    found) and, per message, where its copy goes (run off the broker's event loop).
    ``reconsume_times``: the consumer's own count per message, in place of the stored
    one (an orderly consumer retries in place and counts locally)."""
    levels = len(store.config.delay_levels_ms)
    copies: list[Message] = []
    born: list[tuple[int, str, int]] = []
    outcome: list[str] = []
    for i, off in enumerate(commitlog_offsets):
        try:
            m = store.message_at(int(off))
        except (OffsetOutOfRangeError, StoreCorruptedError, ValueError) as exc:
            log.warning("send-back: no message at commitlog offset %s: %s", off, exc)
            outcome.append(NOT_FOUND)
            continue
        if reconsume_times is not None:
            m = m._replace(reconsume_times=int(reconsume_times[i]))
        copy, b, where = send_back_copy(m, group, max_reconsume_times, levels)
        copies.append(copy)
        born.append(b)
        outcome.append(where)
    if not copies:
        return None, outcome
    batch = codec.encode_batch(copies, max_message_size=store.config.max_message_size, born=born)
    return batch, outcome


async def consumer_send_msg_back(
    broker: BrokerRuntime,
    put: Callable[[codec.EncodedBatch], Awaitable[PutBatchResult]],
    group: str,
    commitlog_offsets: Sequence[int],
    max_reconsume_times: int,
    reconsume_times: Sequence[int] | None = None,
) -> list[str]:
    """Store the retry or dead-letter copy of each message; per message ``"RETRY"``,
    ``"DLQ"`` or ``"NOT_FOUND"`` (the original expired: the consumer must retry it
    locally). Raises when the put fails: nothing was stored then."""
    validate_group(group)
    if not isinstance(commitlog_offsets, (list, tuple)):
        raise InvalidMessageError(
            f"commitlog_offsets: expected a list, got {type(commitlog_offsets).__name__}"
        )
    if not isinstance(max_reconsume_times, int) or max_reconsume_times < 0:
        raise InvalidMessageError(
            f"max_reconsume_times={max_reconsume_times!r}: must be an int >= 0"
        )
    if reconsume_times is not None and len(reconsume_times) != len(commitlog_offsets):
        raise InvalidMessageError(
            f"reconsume_times has {len(reconsume_times)} entries: need one per offset "
            f"({len(commitlog_offsets)})"
        )
    retry, dlq = retry_topic(group), dlq_topic(group)
    batch, outcome = await broker.run(
        build_send_back,
        broker.store,
        group,
        list(commitlog_offsets),
        max_reconsume_times,
        None if reconsume_times is None else list(reconsume_times),
    )
    if batch is None:
        return outcome
    if SENT_TO_RETRY in outcome:
        await create_retry_topic(broker, group)
        broker.topics.for_write(retry, 0)
    if SENT_TO_DLQ in outcome:
        await ensure_topic(broker, TopicConfig(dlq, DLQ_QUEUE_NUMS, DLQ_QUEUE_NUMS, DLQ_PERM))
        broker.topics.for_write(dlq, 0)
    await put(batch)  # through the broker's role, as every write
    stats: dict[str, Any] = broker.stats
    stats["send_back_calls"] = stats.get("send_back_calls", 0) + 1
    stats["send_back_msgs"] = stats.get("send_back_msgs", 0) + len(batch)
    dead = outcome.count(SENT_TO_DLQ)
    if dead:
        stats["dlq_msgs"] = stats.get("dlq_msgs", 0) + dead
        log.warning(
            "group %s: %d message(s) reached max_reconsume_times=%d and went to %s",
            group,
            dead,
            max_reconsume_times,
            dlq,
        )
    return outcome
