"""Dead letters: reading a group's ``%DLQ%<group>`` and resending its messages.

The DLQ is write-only for consumers (perm 2), so operators read it through the
broker's store directly (``Broker.read_dlq``) rather than by pulling; the admin
client hands these functions the brokers holding the DLQ. A resend stores each
dead letter again in the topic it was first consumed from, with the same message
id and keys and its reconsume count back at 0, so the group consumes it (and may
retry it) as if new. RocketMQ's console does the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from actors.client.producer import Producer
from actors.client.send_result import SendResult
from actors.protocol import rpc as _rpc
from actors.protocol.topic import origin_topic
from actors.protocol.wire import DLQ_MAX_READ as MAX_READ
from storage import codec
from storage.message import Message, MessageExt

log = logging.getLogger("raymq.actors.dlq")

RESEND_GROUP = "raymq-dlq-resend"
"""The producer group dead letters are resent under."""

NOT_RESENT = frozenset(
    {
        codec.PROP_RETRY_TOPIC,
        codec.PROP_ORIGIN_MESSAGE_ID,
        codec.PROP_RECONSUME_TIME,
        codec.PROP_MAX_RECONSUME_TIMES,
        codec.PROP_DELAY,
        codec.PROP_REAL_TOPIC,
        codec.PROP_REAL_QID,
    }
)


def dlq_messages(
    brokers: Mapping[str, Any], group: str, max_count: int, timeout_s: float
) -> list[MessageExt]:
    """Every dead letter of ``group`` (up to ``max_count``), oldest first, read from
    ``brokers`` (the handles of the brokers holding ``%DLQ%<group>``, by broker name),
    each call waited for up to ``timeout_s``."""
    found: list[MessageExt] = []
    for _, handle in sorted(brokers.items()):
        offset = 0
        while len(found) < max_count:
            ref = handle.read_dlq.remote(group, offset, min(MAX_READ, max_count - len(found)))
            msgs, nxt = _rpc.get(ref, timeout_s)
            found.extend(msgs)
            if not msgs or nxt <= offset:
                break
            offset = nxt
    return sorted(found, key=lambda m: (m.store_timestamp, m.queue_offset))[:max_count]


def resend_copy(m: MessageExt) -> Message:
    """A dead letter as a new message to its original topic (same id, tags, keys)."""
    props = {k: v for k, v in m.properties.items() if k not in NOT_RESENT}
    return Message(origin_topic(m), m.body, tags=m.tags, keys=m.keys, properties=props, flag=m.flag)


def matches_id(m: MessageExt, ids: Collection[str]) -> bool:
    return (
        m.msg_id in ids
        or m.offset_msg_id in ids
        or m.properties.get(codec.PROP_ORIGIN_MESSAGE_ID, "") in ids
    )


def resend_dlq(
    brokers: Mapping[str, Any],
    group: str,
    msg_ids: Collection[str] | None,
    max_count: int,
    timeout_s: float,
    *,
    namespace: str,
    nameservers: Sequence[str],
    progress: Callable[[int, int], None] | None = None,
    chunk: int = 256,
) -> list[SendResult]:
    """Send dead letters of ``group`` (all, or those named by message id, unique key or
    offset id) back to their original topics; one result per message resent. They are
    read from ``brokers`` as :func:`dlq_messages` reads them and sent by a producer of
    the cluster at ``namespace`` / ``nameservers``."""
    letters = dlq_messages(brokers, group, max_count, timeout_s)
    if msg_ids is not None:
        wanted = set(msg_ids)
        letters = [m for m in letters if matches_id(m, wanted)]
    if progress is not None:
        progress(0, len(letters))
    if not letters:
        return []
    results: list[SendResult] = []
    producer = Producer(RESEND_GROUP, namespace=namespace, nameservers=nameservers)
    try:
        for start in range(0, len(letters), max(chunk, 1)):
            part = letters[start : start + max(chunk, 1)]
            results.extend(producer.send_batch([resend_copy(m) for m in part]))
            if progress is not None:
                progress(len(results), len(letters))
    finally:
        producer.close()
    log.info("resent %d dead letter(s) of group %s", len(results), group)
    return results
