"""Topics, lookups and status on a broker (RocketMQ's ``AdminBrokerProcessor``).

Control plane only: none of these is on a message's path. Creating or deleting a
topic registers with every NameServer before it returns, so the change is
routable everywhere once the caller hears back.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from actors.broker.ha import Replication
from actors.broker.processor.dlq import read_dlq as read_dead_letters
from actors.broker.runtime import BrokerRuntime
from actors.protocol.checks import check_int, check_str, validate_group
from actors.protocol.topic import TopicConfig, is_system_topic
from storage.codec import decode_records, validate_queue_id, validate_topic
from storage.errors import PermissionDeniedError, TopicNotFoundError
from storage.message import MessageExt
from storage.store import disk_used_ratio

MAX_QUERY = 4096
"""The most messages one lookup by key returns."""


class AdminBrokerProcessor:
    """Topic admin, lookups by key, id and time, dead letters and the broker's status."""

    def __init__(self, runtime: BrokerRuntime, role: Replication) -> None:
        self.rt = runtime
        self.role = role

    def _refuse_system(self, topic: str, what: str) -> None:
        c = self.rt.config
        if is_system_topic(topic, c.cluster_name, c.broker_name):
            raise PermissionDeniedError(
                f"topic={topic!r} is a system topic of broker {c.broker_name}: it cannot be {what}"
            )

    # ------------------------------------------------------------ topics (admin)
    async def create_topic(self, config: TopicConfig) -> TopicConfig:
        """Create or update a topic and tell every NameServer before returning. The
        config is validated anew here, whatever the caller built; system topics refuse."""
        config = TopicConfig.checked(config)
        self._refuse_system(config.topic_name, "created or changed")
        self.rt.topics.put(config)
        if not self.role.is_master:
            # created here and on the master at once (start_cluster, admin tools): a metadata
            # snapshot the master took just before its own create must not delete it here,
            # or a failover in that window would lose the topic for good
            self.role.learned.add(config.topic_name)
        await self.rt.register_all()
        return config

    async def delete_topic(self, topic: str) -> bool:
        validate_topic(topic)
        self._refuse_system(topic, "deleted")
        removed = self.rt.topics.delete(topic)
        self.role.learned.discard(topic)
        if removed:
            self.rt.offsets.remove_topic(topic)
            await self.rt.register_all()
        return removed

    async def get_topic_config(self, topic: str) -> TopicConfig | None:
        validate_topic(topic)
        return self.rt.topics.get(topic)

    async def topic_configs(self) -> dict[str, TopicConfig]:
        return self.rt.topics.snapshot()

    async def topic_status(self, topic: str) -> list[dict[str, Any]]:
        """Per queue: min and max offset and when its last message was stored."""
        validate_topic(topic)
        tc = self.rt.topics.get(topic)
        if tc is None:
            raise TopicNotFoundError(
                f"topic={topic!r} does not exist on broker {self.rt.config.broker_name}"
            )
        rows = []
        for q in range(max(tc.read_queue_nums, tc.write_queue_nums)):
            min_off, max_off = (
                self.rt.store.min_offset(topic, q),
                self.rt.store.max_offset(topic, q),
            )
            last = 0
            if max_off > min_off:
                raw = await self.rt.run(self.rt.store.get_raw, "", topic, q, max_off - 1, 1, None)
                if raw.count:
                    last = decode_records(raw.data, check_crc=False)[0].store_timestamp
            rows.append(
                {
                    "topic": topic,
                    "broker": self.rt.config.broker_name,
                    "queue_id": q,
                    "min_offset": min_off,
                    "max_offset": max_off,
                    "last_update_ms": last,
                }
            )
        return rows

    # ------------------------------------------------------------ lookups (admin)
    async def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        validate_topic(topic)
        validate_queue_id(queue_id)
        check_int("timestamp_ms", timestamp_ms, 0)
        return await self.rt.run(self.rt.store.offset_by_time, topic, queue_id, timestamp_ms)

    async def min_max_offset(self, topic: str, queue_id: int) -> tuple[int, int]:
        validate_topic(topic)
        validate_queue_id(queue_id)
        return self.rt.store.min_offset(topic, queue_id), self.rt.store.max_offset(topic, queue_id)

    async def query_by_key(
        self,
        topic: str,
        key: str,
        max_count: int = 64,
        begin_ms: int = 0,
        end_ms: int | None = None,
    ) -> list[MessageExt]:
        validate_topic(topic)
        check_str("key", key)
        check_int("max_count", max_count, 1, MAX_QUERY)
        check_int("begin_ms", begin_ms, 0)
        if end_ms is not None:
            check_int("end_ms", end_ms, 0)
        return await self.rt.run(
            self.rt.store.query_by_key, topic, key, max_count, begin_ms, end_ms
        )

    async def message_by_id(self, msg_id: str, topic: str | None = None) -> MessageExt:
        check_str("msg_id", msg_id, 64)
        if topic is not None:
            validate_topic(topic)
        return await self.rt.run(self.rt.store.message_by_id, msg_id, topic)

    async def read_dlq(
        self, group: str, offset: int = 0, max_count: int = 256
    ) -> tuple[list[MessageExt], int]:
        """Dead letters of ``group`` from ``offset``, whatever the DLQ's perm (admin)."""
        validate_group(group)
        check_int("offset", offset, 0)
        return await read_dead_letters(self.rt, group, offset, max_count)

    async def delay_levels(self) -> tuple[int, ...]:
        """The delay of each level in ms (``message_delay_level``)."""
        return self.rt.store.config.delay_levels_ms

    async def counters(self) -> dict[str, Any]:
        """The broker's running totals, for a sampler (the console) to turn into rates:
        messages put and served, puts timed and their total time (us), and per topic the
        sum of its queues' max offsets (messages ever stored) and of max - min (held),
        per group and topic the sum of the committed offsets and the lag, per group the
        messages pulls and pops served it. Only
        in-memory lookups (as the lag gauges make)."""
        rt = self.rt
        store = rt.store
        topics: dict[str, list[int]] = {}
        for name, tc in rt.topics.snapshot().items():
            stored = held = 0
            for q in range(max(tc.read_queue_nums, tc.write_queue_nums)):
                hi = store.max_offset(name, q)
                stored += hi
                held += hi - store.min_offset(name, q)
            topics[name] = [stored, held]
        groups: dict[str, dict[str, list[int]]] = {}
        for (topic, group), committed in rt.offsets.snapshot().items():
            config = rt.topics.get(topic)
            if config is None:
                continue
            done = lag = 0
            for q in range(config.read_queue_nums):
                hi, lo = store.max_offset(topic, q), store.min_offset(topic, q)
                mine = committed.get(q, -1)
                done += max(mine, 0)
                lag += max(hi - max(mine, lo), 0)
            groups.setdefault(group, {})[topic] = [done, lag]
        s = rt.stats
        return {
            "time": time.time(),
            "broker_name": rt.config.broker_name,
            "incarnation": rt.incarnation,
            "put_msgs": s["put_msgs"],
            "get_msgs": s["get_msgs"],
            "put_timed": s["put_timed"],
            "put_micros": s["put_micros"],
            "topics": topics,
            "groups": groups,
            "group_gets": dict(rt.group_gets),
        }

    async def status(self) -> dict[str, Any]:
        c = self.rt.config
        disk = shutil.disk_usage(self.rt.store_dir)
        ratio = disk_used_ratio(self.rt.store_dir)
        return {
            "cluster": c.cluster_name,
            "broker_name": c.broker_name,
            "broker_id": c.broker_id,
            **self.role.status(),  # role, registered id, replication progress
            "addr": self.rt.addr,
            "actor_name": c.actor_name,
            "namespace": c.namespace,
            "node_id": self.rt.node_id,
            "node_ip": self.rt.node_ip,
            "pid": os.getpid(),
            "process_nice": os.getpriority(os.PRIO_PROCESS, 0),  # its event loop's thread
            "store_dir": self.rt.store_dir,
            "flush_disk_type": self.rt.store.config.flush_disk_type,
            "disk_total": disk.total,
            "disk_used": disk.used,
            "disk_used_ratio": round(ratio, 4),
            # writes are refused until there is room (a put notices at once; this looks too)
            "fenced": self.rt.fenced,  # why it takes no writes (its cluster lease lapsed)
            "disk_full": self.rt.store.disk_full
            or ratio > self.rt.store.config.disk_space_warning_level_ratio,
            "commitlog_min_offset": self.rt.store.commitlog.min_offset,
            "commitlog_max_offset": self.rt.store.commitlog.max_offset,
            "topics": len(self.rt.topics.snapshot()),
            "held_pulls": self.rt.holds.held,
            "abnormal_start": self.rt.store.abnormal_start,
            "incarnation": self.rt.incarnation,
            "uptime_s": round(time.time() - self.rt.started, 1),
            **self.rt.stats,
        }
