"""The admin client's consumer groups: their lag, members, FIFO setting and status,
offset resets (through the group's coordinator when it has one), and their dead
letters, read and sent again."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from actors.client import dlq as _dlq
from actors.client.admin_base import ADMIN_TIMEOUT_S, RESET_POSITIONS, epoch_ms
from actors.client.admin_topics import TopicAdmin
from actors.client.send_result import SendResult
from actors.coordinator.host import find_coordinator
from actors.protocol import rpc as _rpc
from actors.protocol.checks import validate_group
from actors.protocol.topic import (
    dlq_topic,
    retry_topic,
)
from rebalance import MessageQueue
from storage import codec
from storage.errors import (
    InvalidMessageError,
    RayMQError,
    TopicNotFoundError,
)
from storage.message import Message, MessageExt

log = logging.getLogger("raymq.actors.admin")


class GroupAdmin(TopicAdmin):
    """Consumer groups, their offsets and dead letters (see the module doc), on top of
    the topics' operations they read through."""

    # ------------------------------------------------------------ consumers
    def consumer_lag(self, group: str, topic: str | None = None) -> list[dict[str, Any]]:
        """Per queue: broker max offset, the group's committed offset and the lag."""
        brokers = self._topic_brokers(topic) if topic else self.brokers()
        rows: list[dict[str, Any]] = []
        for _, part in sorted(self._on_all(brokers, "consumer_lag", group, topic).items()):
            rows.extend(part)
        return rows

    def consumer_list(self, group: str) -> list[str]:
        members: set[str] = set()
        for part in self._on_all(self.brokers(), "consumer_list", group).values():
            members.update(part)
        return sorted(members)

    def set_group_fifo(
        self, group: str, fifo: bool = True, *, brokers: Sequence[str] | None = None
    ) -> None:
        """Make ``group`` a FIFO group on the given brokers (default: every live master):
        its POP consumers (the SimpleConsumer, RocketMQ 5's clients, told so in their
        settings) get each queue in order, one batch in flight at a time; kept across
        restarts (RocketMQ's subscription group ``consumeMessageOrderly``)."""
        self._on_all(self._brokers_for(brokers), "set_group_fifo", group, fifo)

    def group_status(self, group: str) -> dict[str, Any]:
        """What ``group``'s coordinator holds: members, generation, strategy, target and
        current owners, pending revokes and fences, and the generation log."""
        handle = self._coordinator(group)
        if handle is None:
            raise RayMQError(
                f"group={group!r} has no coordinator in namespace {self.namespace!r} "
                "(no coordinated consumer joined it)"
            )
        status: dict[str, Any] = _rpc.get(handle.status.remote(), ADMIN_TIMEOUT_S)
        return status

    def reset_offset(
        self,
        group: str,
        topic: str,
        to: int | str | datetime,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[MessageQueue, int]:
        """Move ``group`` on ``topic`` to ``to``: the first message stored at or after a
        time (epoch ms or a datetime), or ``"earliest"`` / ``"latest"``; its running
        consumers drop their offsets in memory and go on from there. A group with a
        coordinator is reset through it, which restarts the owners at once; otherwise the
        brokers fence the queues, and each consumer sees it on its next rebalance (or its
        next refused commit) and starts again from the new offsets. Returns the offsets.

        ``progress(queues_done, queues)`` is called as brokers answer (once for a
        group with a coordinator, which resets every queue in one step)."""
        timestamp_ms, offsets = self._reset_target(topic, to)
        coordinator = self._coordinator(group)
        if coordinator is not None:
            done: dict[MessageQueue, int] = _rpc.get(
                coordinator.reset_offsets.remote(topic, timestamp_ms, offsets), ADMIN_TIMEOUT_S
            )
            if progress is not None:
                progress(len(done), len(done))
            return done
        brokers = self._topic_brokers(topic)
        route = self.ns.require_route(topic)
        total = sum(q.read_queue_nums for q in route.queue_datas if q.broker_name in brokers)
        refs = {}
        for name, handle in brokers.items():
            mine = None
            if offsets is not None:
                mine = {mq.queue_id: off for mq, off in offsets.items() if mq.broker_name == name}
            refs[name] = handle.reset_offsets.remote(group, topic, timestamp_ms, mine)
        out = {}
        for name, ref in refs.items():
            for qid, off in _rpc.get(ref, ADMIN_TIMEOUT_S).items():
                out[MessageQueue(topic, name, qid)] = off
            if progress is not None:
                progress(len(out), max(total, len(out)))
        return out

    def _reset_target(
        self, topic: str, to: int | str | datetime
    ) -> tuple[int | None, dict[MessageQueue, int] | None]:
        """``to`` as a time in ms, or as explicit offsets for earliest / latest."""
        if isinstance(to, str) and to in RESET_POSITIONS:
            column = "min_offset" if to == "earliest" else "max_offset"
            offsets = {
                MessageQueue(topic, row["broker"], row["queue_id"]): row[column]
                for row in self.topic_status(topic)
            }
            return None, offsets
        if isinstance(to, str):
            raise InvalidMessageError(
                f"reset to={to!r}: a time (epoch ms or a datetime) or one of {RESET_POSITIONS}"
            )
        return epoch_ms(to, "to"), None

    def _coordinator(self, group: str) -> Any:
        """``group``'s coordinator, or None when it has none (none of its consumers
        joined since its coordinator host started)."""
        return find_coordinator(group, self.namespace, ADMIN_TIMEOUT_S)

    # ------------------------------------------------------------ dead letters and perms
    def dlq_messages(self, group: str, max_count: int = 1000) -> list[MessageExt]:
        """The dead letters of ``group`` (``%DLQ%<group>`` on every broker), oldest first."""
        return _dlq.dlq_messages(self._dlq_brokers(group), group, max_count, ADMIN_TIMEOUT_S)

    def resend_dlq(
        self,
        group: str,
        msg_ids: Sequence[str] | None = None,
        max_count: int = 10_000,
        progress: Callable[[int, int], None] | None = None,
        chunk: int = 256,
    ) -> list[SendResult]:
        """Send dead letters of ``group`` (all, or those with the given message ids) back
        to their original topics; one ``SendResult`` per message resent.
        ``progress(resent, letters)`` is called after each batch of ``chunk``."""
        return _dlq.resend_dlq(
            self._dlq_brokers(group),
            group,
            msg_ids,
            max_count,
            ADMIN_TIMEOUT_S,
            namespace=self.namespace,
            nameservers=self.ns.nameservers,
            progress=progress,
            chunk=chunk,
        )

    def resend_to_group(self, msg_id: str, group: str, topic: str | None = None) -> SendResult:
        """Deliver a stored message once more to ``group`` alone: a copy (same id, keys,
        tags and body, ``RETRY_TOPIC`` = its topic) goes to ``%RETRY%<group>``, which the
        group's consumers read besides their topics (RocketMQ Dashboard's resend)."""
        from actors.client.producer import Producer

        validate_group(group)
        m = self.query_by_id(msg_id, topic)
        retry = retry_topic(group)
        made = self._on_all(self.brokers(), "create_retry_topic", group)
        if any(made.values()):
            log.info(
                "created %s for a resend on %s", retry, sorted(n for n, v in made.items() if v)
            )
        props = {k: v for k, v in m.properties.items() if k not in _dlq.NOT_RESENT}
        props[codec.PROP_RETRY_TOPIC] = m.properties.get(codec.PROP_RETRY_TOPIC, m.topic)
        props[codec.PROP_ORIGIN_MESSAGE_ID] = m.msg_id
        copy = Message(retry, m.body, tags=m.tags, keys=m.keys, properties=props, flag=m.flag)
        producer = Producer(
            _dlq.RESEND_GROUP, namespace=self.namespace, nameservers=self.ns.nameservers
        )
        try:
            result = producer.send(copy)
        finally:
            producer.close()
        log.info("resent %s of %s to group %s", m.msg_id, m.topic, group)
        return result

    def _dlq_brokers(self, group: str) -> dict[str, Any]:
        try:
            return self._topic_brokers(dlq_topic(group))
        except TopicNotFoundError:
            return {}
