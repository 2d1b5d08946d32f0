"""Where an :class:`~actors.aio.consumer.AsyncConsumer`'s queues start and how their
offsets are committed: the group's offsets at the brokers (a coordinated group's with
its queues' fencing tokens), or the consumer's own file when it broadcasts."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from actors.aio.connection import within
from actors.protocol.fencing import FencingToken, OffsetFencedError
from rebalance import MessageQueue

log = logging.getLogger("raymq.actors.aio.consumer")

CALL_TIMEOUT_S = 10.0


class GroupOffsets:
    """An AsyncConsumer's offsets: :meth:`start` of a queue it takes, :meth:`commit` of
    the queues whose offsets moved."""

    def __init__(self, consumer: Any) -> None:
        self.c = consumer  # the AsyncConsumer (its group, queues, brokers and file)

    async def commit(self, items: list[tuple[Any, int]]) -> set[str]:
        """Commit each (queue, offset) that moved: one call per broker (a coordinated
        group's with the queues' fencing tokens, only queues holding one), or the
        consumer's own file (broadcasting). The brokers that refused or failed."""
        c = self.c
        assert c._commit_lock is not None
        tokens = c._group.tokens if c._group is not None else None
        failed: set[str] = set()
        async with c._commit_lock:
            c._dirty = False
            moved = [(q, off) for q, off in items if off != q.committed]
            if tokens is not None:
                moved = [(q, off) for q, off in moved if q.mq in tokens]
            if not moved:
                return failed
            if c._local is not None:  # written and fsynced off the loop
                offsets = {q.mq: off for q, off in moved}
                await asyncio.to_thread(c._local.commit, offsets, wait=True)
                for q, off in moved:
                    q.committed = off
                return failed
            by_broker: dict[str, list[tuple[Any, int]]] = {}
            for q, off in moved:
                by_broker.setdefault(q.mq.broker_name, []).append((q, off))
            for broker_name, queues in by_broker.items():
                table = {(q.mq.topic, q.mq.queue_id): off for q, off in queues}
                args: list[Any] = [c.group, table, c.client_id]
                if tokens is not None:
                    args.append({(q.mq.topic, q.mq.queue_id): tokens[q.mq] for q, _ in queues})
                try:
                    actor, handle = await c._master(queues[0][0].mq)
                    answer = await c._brokers.request(actor, handle, "commit_offsets", *args)
                    await within(answer, CALL_TIMEOUT_S)
                except OffsetFencedError as exc:  # another member holds them now
                    log.warning("group %s: commit on %s fenced: %s", c.group, broker_name, exc)
                    failed.add(broker_name)
                    continue
                except Exception:
                    if tokens is None:
                        raise
                    log.warning("group %s: commit on %s failed", c.group, broker_name)
                    failed.add(broker_name)
                    continue
                for q, off in queues:
                    q.committed = off
        return failed

    async def start(self, mq: MessageQueue, token: FencingToken | None = None) -> int:
        """Where ``mq`` starts: the group's committed offset (broadcasting: the one in
        the consumer's file, if it lies within the queue); with none, its first message
        (``consume_from="first"``, and the retry topic) or its end. A group's start is
        committed at once (with ``token``), so a member dying before its first commit
        skips nothing."""
        c = self.c
        actor, handle = await c._master(mq)
        if c._local is None:
            stored = await within(
                handle.query_offset.remote(c.group, mq.topic, mq.queue_id), CALL_TIMEOUT_S
            )
            if stored is not None and stored >= 0:
                return int(stored)
        low, high = await within(
            c._brokers.call(actor, handle, "min_max_offset", mq.topic, mq.queue_id),
            CALL_TIMEOUT_S,
        )
        if c._local is not None:
            kept = c._local.read(mq)
            if low <= kept <= high:
                return kept
            if kept >= 0:  # a file of another cluster's, or a queue cleaned since
                log.warning(
                    "group %s: kept offset %d of %s is outside %d..%d: starting anew",
                    c.group,
                    kept,
                    mq,
                    low,
                    high,
                )
        start = int(low) if c.consume_from == "first" or mq.topic != c.topic else int(high)
        if c._local is None:
            args: list[Any] = [c.group, {(mq.topic, mq.queue_id): start}, c.client_id]
            if token is not None:
                args.append({(mq.topic, mq.queue_id): token})
            await within(c._brokers.call(actor, handle, "commit_offsets", *args), CALL_TIMEOUT_S)
        return start
