"""Consumer groups on a broker (RocketMQ's ``ConsumerManageProcessor``): offsets,
fences, members, lag, resets and stream checkpoints.

Offset commits are all or nothing: every queue's offset is checked (topic known,
0 <= offset <= the queue's max offset) and every fencing token compared with its
queue's fence before any is applied (``actors.broker.offset.fence_table``).

An offset reset writes the new offsets and raises the queues' fences in one step (no
await between), so a commit a consumer sends from before the reset is refused: the
consumer learns of the reset from the fence (a coordinated one from its coordinator,
which chose the fence; an uncoordinated one from the fences it reads every rebalance)
and starts again from the reset offsets, where RocketMQ's broker tells its clients
(``RESET_CONSUMER_CLIENT_OFFSET``).
"""

from __future__ import annotations

from typing import Any

from actors.broker.ha import Replication
from actors.broker.runtime import BrokerRuntime
from actors.protocol.checks import (
    check_int,
    check_number,
    check_queue_offsets,
    check_str,
    validate_group,
)
from actors.protocol.fencing import FencingToken, OffsetFencedError, check_token
from storage.codec import validate_queue_id, validate_topic
from storage.errors import InvalidMessageError, OffsetOutOfRangeError, TopicNotFoundError


class ConsumerManageProcessor:
    """Offsets, fences and members of the consumer groups that read from one broker."""

    def __init__(self, runtime: BrokerRuntime, role: Replication) -> None:
        self.rt = runtime
        self.role = role

    def _check_offset(self, topic: str, queue_id: int, offset: int) -> None:
        validate_topic(topic)
        validate_queue_id(queue_id)
        if self.rt.topics.get(topic) is None:
            raise TopicNotFoundError(
                f"topic={topic!r} does not exist on broker {self.rt.config.broker_name}"
            )
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise OffsetOutOfRangeError(
                f"offset={offset!r} for {topic}:{queue_id}: must be an int >= 0"
            )
        max_off = self.rt.store.max_offset(topic, queue_id)
        if offset > max_off:
            raise OffsetOutOfRangeError(
                f"offset={offset} for {topic}:{queue_id} on {self.rt.config.broker_name}: "
                f"beyond the queue's max offset {max_off}"
            )

    def check_offsets(
        self, group: str, offsets: dict[tuple[str, int], int]
    ) -> dict[tuple[str, int], int]:
        """What :meth:`commit_offsets` would refuse of ``group``'s ``offsets``, refused
        now (a transaction's decision checks its offsets before it ends anything)."""
        validate_group(group)
        offsets = check_queue_offsets("offsets", offsets)
        for (topic, qid), off in offsets.items():
            self._check_offset(topic, qid, off)
        return offsets

    async def commit_offsets(
        self,
        group: str,
        offsets: dict[tuple[str, int], int],
        client_id: str = "",
        tokens: dict[tuple[str, int], FencingToken] | None = None,
    ) -> int:
        """Commit ``{(topic, queue_id): next offset to consume}`` for ``group``; all or nothing.
        ``tokens``: the committer's fencing token per queue; one below the queue's fence
        (``fence_offsets``) refuses the whole commit with OffsetFencedError."""
        offsets = self.check_offsets(group, offsets)
        check_str("client_id", client_id, empty=True)
        if tokens is not None:
            tokens = check_queue_offsets("tokens", tokens)
        self.rt.fences.check(group, offsets, tokens)
        for (topic, qid), off in offsets.items():
            self.rt.offsets.commit(group, topic, qid, off)
        self.role.on_commit_offsets(group, offsets)
        self.rt.consumers.touch(group, client_id, frozenset(t for t, _ in offsets))
        if self.rt.store.config.sync_flush:  # answered once on disk, as a SYNC_FLUSH write
            await self.rt.run(self.rt.offsets.sync)
        return len(offsets)

    async def fence_offsets(self, group: str, fences: dict[tuple[str, int], FencingToken]) -> int:
        """Refuse from now on commits of ``group`` on these ``(topic, queue_id)`` whose
        token is below the given one (a group coordinator taking queues from an owner
        that did not hand them over); fences only rise. Returns how many rose."""
        validate_group(group)
        return self.rt.fences.raise_fences(group, check_queue_offsets("fences", fences))

    async def offset_fences(self, group: str) -> dict[tuple[str, int], FencingToken]:
        validate_group(group)
        return self.rt.fences.snapshot(group)

    async def query_offsets(self, group: str, topic: str) -> dict[int, int]:
        validate_group(group)
        validate_topic(topic)
        return self.rt.offsets.query_topic(group, topic)

    async def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        validate_group(group)
        validate_topic(topic)
        validate_queue_id(queue_id)
        return self.rt.offsets.query(group, topic, queue_id)

    async def save_stream_checkpoint(
        self, group: str, topic: str, checkpoint: dict[str, Any]
    ) -> None:
        """Persist (fsynced) a micro-batch stream's checkpoint (``actors.bridge.streaming``)."""
        validate_group(group)
        validate_topic(topic)
        if not isinstance(checkpoint, dict):
            raise InvalidMessageError(
                f"checkpoint: expected a dict, got {type(checkpoint).__name__}"
            )
        await self.rt.run(self.rt.stream_checkpoints.save, group, topic, checkpoint)

    async def load_stream_checkpoint(self, group: str, topic: str) -> dict[str, Any] | None:
        validate_group(group)
        validate_topic(topic)
        return self.rt.stream_checkpoints.load(group, topic)

    async def reset_offsets(
        self,
        group: str,
        topic: str,
        timestamp_ms: int | None = None,
        offsets: dict[int, int] | None = None,
        fence: FencingToken | None = None,
    ) -> dict[int, int]:
        """Move ``group`` on ``topic`` to the first message stored at or after
        ``timestamp_ms``, or to explicit ``offsets`` by queue id, fencing the queues in the
        same step. ``fence``: the token of the group's coordinator, which gives the queues
        to their owners again above it (refused with OffsetFencedError if a queue is
        fenced higher already: a newer coordinator runs the group). Without one (a group
        with no coordinator) each queue's fence rises one generation. A group with a live
        coordinator must be reset through it, or its owners' commits stay refused."""
        validate_group(group)
        validate_topic(topic)
        if timestamp_ms is not None:
            check_int("timestamp_ms", timestamp_ms, 0)
        if offsets is not None and not isinstance(offsets, dict):
            raise InvalidMessageError(f"offsets: expected a dict, got {type(offsets).__name__}")
        if fence is not None:
            fence = check_token(fence, f"{group}:{topic} reset")
        tc = self.rt.topics.get(topic)
        if tc is None:
            raise TopicNotFoundError(
                f"topic={topic!r} does not exist on broker {self.rt.config.broker_name}"
            )
        if offsets is None:
            if timestamp_ms is None:
                raise InvalidMessageError("reset_offsets needs timestamp_ms or offsets")
            offsets = {
                q: await self.rt.run(self.rt.store.offset_by_time, topic, q, timestamp_ms)
                for q in range(tc.read_queue_nums)
            }
        table = check_queue_offsets("offsets", {(topic, q): o for q, o in offsets.items()})
        for (t, qid), off in table.items():
            self._check_offset(t, qid, off)
        # from here to the commit nothing awaits: no commit can slip in between
        current = self.rt.fences.snapshot(group)
        if fence is not None:
            newer = sorted(
                f"{t}:{q} at {current[(t, q)]}"
                for t, q in table
                if current.get((t, q), fence) > fence
            )
            if newer:
                raise OffsetFencedError(
                    f"group {group!r}: reset at fence {fence} refused, a newer coordinator "
                    f"fenced {'; '.join(newer[:8])}"
                )
            fences = dict.fromkeys(table, fence)
        else:
            fences = {key: _above(current.get(key)) for key in table}
        self.rt.fences.raise_fences(group, fences)
        for (t, qid), off in table.items():
            self.rt.offsets.commit(group, t, qid, off)
        self.role.on_commit_offsets(group, table)
        if self.rt.store.config.sync_flush:
            await self.rt.run(self.rt.offsets.sync)
        return {qid: off for (_, qid), off in table.items()}

    async def consumer_list(self, group: str) -> list[str]:
        validate_group(group)
        return self.rt.consumers.members(group)

    async def heartbeat(
        self, group: str, client_id: str, topics: list[str], ttl_s: float | None = None
    ) -> None:
        """``ttl_s``: drop the client this long after its last sign of life (at most
        ``channel_expired_s``), so a dead consumer's queues move on soon."""
        validate_group(group)
        check_str("client_id", client_id)
        if not isinstance(topics, (list, tuple, set, frozenset)):
            raise InvalidMessageError(f"topics: expected a list, got {type(topics).__name__}")
        names = frozenset(validate_topic(t) for t in topics)
        if ttl_s is not None:
            check_number("ttl_s", ttl_s)
        self.rt.consumers.touch(group, client_id, names, ttl_s)

    async def unregister_consumer(self, group: str, client_id: str) -> None:
        """A consumer leaving cleanly: off the group's list at once, so the others rebalance."""
        validate_group(group)
        check_str("client_id", client_id)
        self.rt.consumers.unregister(group, client_id)

    async def consumer_lag(self, group: str, topic: str | None = None) -> list[dict[str, Any]]:
        validate_group(group)
        if topic is not None:
            validate_topic(topic)
        rows = []
        topics = [topic] if topic else self.rt.offsets.topics_of(group)
        for t in topics:
            tc = self.rt.topics.get(t)
            if tc is None:
                continue
            committed = self.rt.offsets.query_topic(group, t)
            for q in range(tc.read_queue_nums):
                max_off = self.rt.store.max_offset(t, q)
                min_off = self.rt.store.min_offset(t, q)
                mine = committed.get(q, -1)
                lag = max_off - max(mine, min_off) if mine >= 0 else max_off - min_off
                rows.append(
                    {
                        "topic": t,
                        "broker": self.rt.config.broker_name,
                        "queue_id": q,
                        "broker_offset": max_off,
                        "consumer_offset": mine,
                        "lag": max(lag, 0),
                    }
                )
        return rows


def _above(fence: FencingToken | None) -> FencingToken:
    """The next generation's fence: a broker's own, for a reset of a group with no
    coordinator (a coordinator starts at an epoch above every fence it finds)."""
    epoch, generation = fence if fence is not None else (0, 0)
    return (epoch, generation + 1)
