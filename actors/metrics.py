"""Broker metrics through ``ray.util.metrics``: Ray's Prometheus endpoint shows them.

Every series carries the broker's name and id; per-topic series carry the
topic, lag series the consumer group. Recording happens once per batch (a put
or a pull), never per message. In Prometheus the names gain Ray's ``ray_``
prefix, e.g. ``ray_raymq_messages_in_total{broker="broker-a",topic="Orders"}``.

| metric | kind | what |
|---|---|---|
| ``raymq_messages_in_total`` / ``raymq_bytes_in_total`` | counter | stored by puts, per topic |
| ``raymq_messages_out_total`` / ``raymq_bytes_out_total`` | counter | served by pulls, per topic |
| ``raymq_put_latency_seconds`` | histogram | one batch put, store included |
| ``raymq_flush_latency_seconds`` | histogram | one CommitLog fsync |
| ``raymq_consumer_lag`` | gauge | messages not yet consumed, per group and topic |
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ray.util import metrics

log = logging.getLogger("raymq.actors.metrics")

_LATENCY_BOUNDS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]


class BrokerMetrics:
    """The metrics of one broker actor (create it inside the actor)."""

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
        self.put_latency = metrics.Histogram(
            "raymq_put_latency_seconds",
            "Time to store one batch",
            boundaries=_LATENCY_BOUNDS,
            tag_keys=("broker", "broker_id"),
        )
        self.flush_latency = metrics.Histogram(
            "raymq_flush_latency_seconds",
            "Time of one CommitLog flush (fsync)",
            boundaries=_LATENCY_BOUNDS,
            tag_keys=("broker", "broker_id"),
        )
        self.lag = metrics.Gauge(
            "raymq_consumer_lag",
            "Messages stored but not yet consumed",
            tag_keys=("broker", "broker_id", "group", "topic"),
        )
        for metric in (
            self.messages_in,
            self.bytes_in,
            self.messages_out,
            self.bytes_out,
            self.put_latency,
            self.flush_latency,
            self.lag,
        ):
            metric.set_default_tags(base)

    def on_put(self, topic: str, count: int, nbytes: int, seconds: float) -> None:
        tags = {"topic": topic}
        self.messages_in.inc(count, tags)
        self.bytes_in.inc(nbytes, tags)
        self.put_latency.observe(seconds)

    def on_get(self, topic: str, count: int, nbytes: int) -> None:
        if count:
            tags = {"topic": topic}
            self.messages_out.inc(count, tags)
            self.bytes_out.inc(nbytes, tags)

    def on_flushes(self, durations: Iterable[float]) -> int:
        n = 0
        for seconds in durations:
            self.flush_latency.observe(seconds)
            n += 1
        return n

    def set_lag(self, group: str, topic: str, lag: int) -> None:
        self.lag.set(lag, {"group": group, "topic": topic})
