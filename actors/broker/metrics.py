"""Broker metrics through ``ray.util.metrics``: Ray's Prometheus endpoint shows them.

Every series carries the broker's name and id; per-topic series carry the
topic, lag series the consumer group. In Prometheus the names gain Ray's
``ray_`` prefix, e.g. ``ray_raymq_messages_in_total{broker="broker-a",topic="Orders"}``.

| metric | kind | what |
|---|---|---|
| ``raymq_messages_in_total`` / ``raymq_bytes_in_total`` | counter | stored by puts, per topic |
| ``raymq_messages_out_total`` / ``raymq_bytes_out_total`` | counter | served by pulls, per topic |
| ``raymq_put_latency_seconds`` | histogram | one batch put, store (and replication) included |
| ``raymq_flush_latency_seconds`` | histogram | one CommitLog fsync |
| ``raymq_consumer_lag`` | gauge | messages not yet consumed, per group and topic |
| ``raymq_store_disk_used_ratio`` | gauge | used share of the store's disk |
| ``raymq_commitlog_bytes`` | gauge | CommitLog bytes on disk (max - min offset) |
| ``raymq_master_epoch`` | gauge | the broker group's master epoch: one more at each failover |
| ``raymq_transactions_total`` | counter | half messages ended, per ``state``: ``committed``, ``rolled_back`` (by the producer, a check or the coordinator), ``discarded`` (checked ``transaction_check_max`` times); and ``one_phase``: multi-message transactions this broker committed alone (``actors.broker.transaction.one_phase``) |

The data path only adds to plain dicts and a deque, once per batch (a put or a
pull), never per message (~1 us): a ``ray.util.metrics`` call costs ~5 us, which
a small batch's put would feel. :class:`BrokerMetricsService` hands what
accumulated to Ray on a short timer (``metrics_export_interval_s``; Ray itself
reports every ``metrics_report_interval_ms``, 10 s by default), observing the
latencies in chunks so a busy second never stalls the event loop, drains the
store's flush times, and every ``metrics_lag_interval_s`` recomputes the lag
gauges from the offsets table and the queues' max offsets (in-memory lookups).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from ray.util import metrics

from storage.codec import EncodedBatch

if TYPE_CHECKING:
    from actors.broker.runtime import BrokerRuntime

log = logging.getLogger("raymq.actors.broker.metrics")

_TXN_STATES = ("committed", "rolled_back", "discarded", "one_phase")
_OBSERVE_CHUNK = 16
"""Histogram observations per turn of the event loop: 3 us each warm, up to 16 once a
second has cooled the caches, so a turn holds the loop 0.05-0.25 ms. At 256 a turn
(~1-4 ms), the once-a-second export of 1,000 puts' latencies showed in
``benchmarks/peers.py`` as a burst of late messages every second."""
_LATENCY_BOUNDS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]


class BrokerMetrics:
    """The metrics of one broker actor (create it inside the actor).

    ``on_put`` / ``on_get`` only accumulate; :meth:`export` records into Ray."""

    def __init__(self, broker_name: str, broker_id: int) -> None:
        base = {"broker": broker_name, "broker_id": str(broker_id)}
        topic_keys = ("broker", "broker_id", "topic")
        self.messages_in = metrics.Counter(
            "raymq_messages_in_total", "Messages stored by puts", tag_keys=topic_keys
        )
        self.bytes_in = metrics.Counter(
            "raymq_bytes_in_total", "Record bytes stored by puts", tag_keys=topic_keys
        )
        self.messages_out = metrics.Counter(
            "raymq_messages_out_total", "Messages served by pulls", tag_keys=topic_keys
        )
        self.bytes_out = metrics.Counter(
            "raymq_bytes_out_total", "Record bytes served by pulls", tag_keys=topic_keys
        )
        broker_keys = ("broker", "broker_id")
        self.put_latency = metrics.Histogram(
            "raymq_put_latency_seconds",
            "Time to store one batch",
            boundaries=_LATENCY_BOUNDS,
            tag_keys=broker_keys,
        )
        self.flush_latency = metrics.Histogram(
            "raymq_flush_latency_seconds",
            "Time of one CommitLog flush (fsync)",
            boundaries=_LATENCY_BOUNDS,
            tag_keys=broker_keys,
        )
        self.lag = metrics.Gauge(
            "raymq_consumer_lag",
            "Messages stored but not yet consumed",
            tag_keys=("broker", "broker_id", "group", "topic"),
        )
        self.disk_used_ratio, self.commitlog_bytes, self.master_epoch = (
            metrics.Gauge(name, doc, tag_keys=broker_keys)
            for name, doc in (
                ("raymq_store_disk_used_ratio", "Used share of the disk holding the store"),
                ("raymq_commitlog_bytes", "CommitLog bytes kept on disk"),
                (
                    "raymq_master_epoch",
                    "The broker group's master epoch as this broker knows it "
                    "(one more per failover)",
                ),
            )
        )
        self.transactions = metrics.Counter(
            "raymq_transactions_total",
            "Half messages ended, per state (committed, rolled_back, discarded), and "
            "transactions committed by this broker alone (one_phase)",
            tag_keys=("broker", "broker_id", "state"),
        )
        for metric in (
            self.transactions,
            self.master_epoch,
            self.messages_in,
            self.bytes_in,
            self.messages_out,
            self.bytes_out,
            self.put_latency,
            self.flush_latency,
            self.lag,
            self.disk_used_ratio,
            self.commitlog_bytes,
        ):
            metric.set_default_tags(base)
        # accumulated since the last export: topic -> [messages, bytes]
        self._in: dict[str, list[int]] = {}
        self._out: dict[str, list[int]] = {}
        # bounded: a stalled export loses latency samples, never memory
        self._put_seconds: deque[float] = deque(maxlen=1 << 17)
        self._lag_series: set[tuple[str, str]] = set()
        self._txn_seen: dict[str, int] = {}  # the broker's txn_* stats at the last export

    # ------------------------------------------------------------ data path (cheap)
    def on_put(self, batch: EncodedBatch, seconds: float) -> None:
        """One stored batch: its messages and bytes per topic, and how long it took."""
        topics = batch.topics
        if len(topics) == 1:
            self._add(self._in, topics[0], len(batch), len(batch.data))
        else:
            idx = batch.topic_idx
            counts = np.bincount(idx, minlength=len(topics))
            nbytes = np.bincount(idx, weights=batch.sizes, minlength=len(topics))
            for i, topic in enumerate(topics):
                if counts[i]:
                    self._add(self._in, topic, int(counts[i]), int(nbytes[i]))
        self._put_seconds.append(seconds)

    def on_put_one(self, topic: str, nbytes: int, seconds: float) -> None:
        """:meth:`on_put` of a single send's record."""
        self._add(self._in, topic, 1, nbytes)
        self._put_seconds.append(seconds)

    def on_get(self, topic: str, count: int, nbytes: int) -> None:
        """One pull that served ``count`` records (``nbytes`` of them)."""
        if count:
            self._add(self._out, topic, count, nbytes)

    @staticmethod
    def _add(table: dict[str, list[int]], topic: str, count: int, nbytes: int) -> None:
        row = table.get(topic)
        if row is None:
            table[topic] = [count, nbytes]
        else:
            row[0] += count
            row[1] += nbytes

    # ------------------------------------------------------------ export (on a timer)
    def export_counters(self) -> None:
        """Add what the puts and pulls accumulated since the last call to Ray's counters."""
        pending_in, self._in = self._in, {}
        pending_out, self._out = self._out, {}
        for topic, (count, nbytes) in pending_in.items():
            tags = {"topic": topic}
            self.messages_in.inc(count, tags)
            self.bytes_in.inc(nbytes, tags)
        for topic, (count, nbytes) in pending_out.items():
            tags = {"topic": topic}
            self.messages_out.inc(count, tags)
            self.bytes_out.inc(nbytes, tags)

    def export_transactions(self, stats: dict[str, int]) -> None:
        """Add the transaction ends the broker counted (``stats``' ``txn_*``) since the
        last call to ``raymq_transactions_total``."""
        for state in _TXN_STATES:
            now = stats.get(f"txn_{state}", 0)
            delta = now - self._txn_seen.get(state, 0)
            if delta > 0:
                self.transactions.inc(delta, {"state": state})
            self._txn_seen[state] = now

    def observe_pending(self, flush_durations: deque[float], limit: int | None = None) -> bool:
        """Observe up to ``limit`` pending put latencies and store fsync times (drained
        from ``flush_durations``); True when some remain. Each observation costs a few
        microseconds, so the caller yields between chunks rather than stall its loop."""
        budget = limit if limit is not None else len(self._put_seconds) + len(flush_durations)
        seconds = self._put_seconds
        while seconds and budget > 0:
            self.put_latency.observe(seconds.popleft())
            budget -= 1
        while flush_durations and budget > 0:
            self.flush_latency.observe(flush_durations.popleft())
            budget -= 1
        return bool(seconds or flush_durations)

    def set_lags(self, lags: dict[tuple[str, str], int]) -> None:
        """``{(group, topic): lag}``; a series that disappeared (topic deleted, group
        gone) drops to 0 rather than keeping its last value forever."""
        for group, topic in self._lag_series - lags.keys():
            self.lag.set(0, {"group": group, "topic": topic})
        for (group, topic), lag in lags.items():
            self.lag.set(lag, {"group": group, "topic": topic})
        self._lag_series = set(lags)

    def set_store(self, disk_used_ratio: float, commitlog_bytes: int) -> None:
        self.disk_used_ratio.set(disk_used_ratio)
        self.commitlog_bytes.set(commitlog_bytes)

    def set_master_epoch(self, epoch: int) -> None:
        self.master_epoch.set(epoch)


def consumer_lags(broker: BrokerRuntime) -> dict[tuple[str, str], int]:
    """``{(group, topic): messages not yet consumed}`` over every committed offset on
    ``broker`` (a queue the group never committed counts from its min offset, as
    ``raymq lag`` does). Only in-memory lookups: offsets table and queue offsets."""
    store = broker.store
    lags: dict[tuple[str, str], int] = {}
    for (topic, group), committed in broker.offsets.snapshot().items():
        tc = broker.topics.get(topic)
        if tc is None:
            continue
        total = 0
        for q in range(tc.read_queue_nums):
            max_off = store.max_offset(topic, q)
            mine = committed.get(q, -1)
            total += max(max_off - max(mine, store.min_offset(topic, q)), 0)
        lags[(group, topic)] = total
    return lags


class BrokerMetricsService:
    """The broker's metrics loop: export every ``export_interval_s``, lag and store
    gauges every ``lag_interval_s``. Runs on the broker's event loop."""

    def __init__(
        self, broker: BrokerRuntime, export_interval_s: float, lag_interval_s: float
    ) -> None:
        self.broker = broker
        self.metrics = BrokerMetrics(broker.config.broker_name, broker.config.broker_id)
        self.export_interval_s = export_interval_s
        self.lag_interval_s = lag_interval_s
        self._task: asyncio.Task[None] | None = None
        self.role_status: Callable[[], dict[str, Any]] | None = None
        """The broker's role status (set once its role exists): the epoch gauge reads it."""

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._task = loop.create_task(self._loop())

    def stop(self) -> None:
        """Cancel the loop and export what is pending (Ray reports it if it still can)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        try:
            self.metrics.export_counters()
            self.metrics.export_transactions(self.broker.stats)
            self.metrics.observe_pending(self.broker.store.commitlog.flush_durations)
        except Exception:  # noqa: BLE001
            log.exception("exporting broker metrics failed")

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_gauges = loop.time()
        while True:
            try:
                await self._export()
                if loop.time() >= next_gauges:
                    self._update_gauges()
                    next_gauges = loop.time() + self.lag_interval_s
            except Exception:  # noqa: BLE001 - a missed sample, not a broken broker
                log.exception("exporting broker metrics failed")
            await asyncio.sleep(self.export_interval_s)

    async def _export(self) -> None:
        self.metrics.export_counters()
        self.metrics.export_transactions(self.broker.stats)
        flushes = self.broker.store.commitlog.flush_durations
        while self.metrics.observe_pending(flushes, _OBSERVE_CHUNK):
            await asyncio.sleep(0)  # let puts and pulls in between chunks

    def _update_gauges(self) -> None:
        self.metrics.set_lags(consumer_lags(self.broker))
        store = self.broker.store
        disk = shutil.disk_usage(self.broker.store_dir)
        self.metrics.set_store(
            disk.used / disk.total if disk.total else 0.0,
            store.commitlog.max_offset - store.commitlog.min_offset,
        )
        if self.role_status is not None:
            self.metrics.set_master_epoch(int(self.role_status().get("master_epoch", 0)))
