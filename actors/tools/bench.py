"""``raymq bench``: RocketMQ's producer/consumer benchmark against a running cluster.

Producer threads send batches as fast as the cluster takes them; a consumer
(optional) pulls everything back. Every second a line shows what the last
second did, as RocketMQ's benchmark prints it::

    Send TPS: 182,304  Max RT(ms): 14.2  Average RT(ms): 2.9  Send Failed: 0  Consume TPS: ...

and a summary closes the run (``--json`` prints it as JSON instead).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from actors.cluster import Cluster
from storage import Message


@dataclass
class _Window:
    sent: int = 0
    failed: int = 0
    calls: int = 0
    rt_sum: float = 0.0
    rt_max: float = 0.0
    consumed: int = 0


@dataclass
class BenchSummary:
    seconds: float
    sent: int
    failed: int
    consumed: int
    send_tps: float
    consume_tps: float
    avg_rt_ms: float
    max_rt_ms: float
    per_second: list[dict[str, float]] = field(default_factory=list)


class _Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.window = _Window()
        self.total = _Window()

    def sent(self, n: int, rt: float) -> None:
        with self.lock:
            for w in (self.window, self.total):
                w.sent += n
                w.calls += 1
                w.rt_sum += rt
                w.rt_max = max(w.rt_max, rt)

    def failed(self, n: int) -> None:
        with self.lock:
            self.window.failed += n
            self.total.failed += n

    def consumed(self, n: int) -> None:
        with self.lock:
            self.window.consumed += n
            self.total.consumed += n

    def roll(self) -> _Window:
        with self.lock:
            window, self.window = self.window, _Window()
        return window


def run_bench(
    cluster: Cluster,
    topic: str,
    *,
    seconds: float = 10.0,
    producers: int = 1,
    body_size: int = 128,
    batch: int = 32,
    consume: bool = True,
    report: Callable[[str], None] | None = print,
) -> BenchSummary:
    """Run for ``seconds``; ``report`` gets one line per second (None: silent)."""
    if seconds <= 0 or producers <= 0 or body_size <= 0 or batch <= 0:
        raise ValueError("seconds, producers, body_size and batch must be > 0")
    stats = _Stats()
    stop = threading.Event()
    body = os.urandom(body_size)

    def produce(i: int) -> None:
        with cluster.producer(f"raymq-bench-{os.getpid()}-{i}") as producer:
            msgs = [Message(topic, body) for _ in range(batch)]
            while not stop.is_set():
                started = time.perf_counter()
                try:
                    producer.send_batch(msgs)
                except Exception:  # noqa: BLE001 - counted, the benchmark goes on
                    stats.failed(batch)
                    continue
                stats.sent(batch, time.perf_counter() - started)

    def pull() -> None:
        consumer = cluster.pull_consumer(f"raymq-bench-consumer-{os.getpid()}")
        queues = consumer.fetch_subscribe_queues(topic)
        offsets = {q: consumer.max_offset(q) for q in queues}
        while not stop.is_set():
            results = consumer.pull_many([(q, offsets[q]) for q in queues], 1024, long_poll_s=0.2)
            for q, r in zip(queues, results):
                stats.consumed(r.count)
                offsets[q] = r.next_offset
        consumer.close()

    threads = [threading.Thread(target=produce, args=(i,), daemon=True) for i in range(producers)]
    if consume:
        threads.append(threading.Thread(target=pull, daemon=True))
    started = time.perf_counter()
    for t in threads:
        t.start()
    per_second: list[dict[str, float]] = []
    next_tick = started + 1.0
    while (now := time.perf_counter()) < started + seconds:
        time.sleep(max(0.0, min(next_tick, started + seconds) - now))
        w = stats.roll()
        row = {
            "send_tps": float(w.sent),
            "max_rt_ms": w.rt_max * 1e3,
            "avg_rt_ms": (w.rt_sum / w.calls * 1e3) if w.calls else 0.0,
            "send_failed": float(w.failed),
            "consume_tps": float(w.consumed),
        }
        per_second.append(row)
        if report is not None:
            report(
                f"Send TPS: {row['send_tps']:>10,.0f}  Max RT(ms): {row['max_rt_ms']:7.1f}  "
                f"Average RT(ms): {row['avg_rt_ms']:6.2f}  Send Failed: {int(row['send_failed'])}"
                + (f"  Consume TPS: {row['consume_tps']:>10,.0f}" if consume else "")
            )
        next_tick += 1.0
    stop.set()
    for t in threads:
        t.join(timeout=30)
    elapsed = time.perf_counter() - started
    total = stats.total
    return BenchSummary(
        seconds=elapsed,
        sent=total.sent,
        failed=total.failed,
        consumed=total.consumed,
        send_tps=total.sent / elapsed,
        consume_tps=total.consumed / elapsed,
        avg_rt_ms=(total.rt_sum / total.calls * 1e3) if total.calls else 0.0,
        max_rt_ms=total.rt_max * 1e3,
        per_second=per_second,
    )


def summary_dict(summary: BenchSummary) -> dict[str, Any]:
    return asdict(summary)
