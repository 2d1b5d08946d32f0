"""Overload: a producer that never waits, a consumer that cannot keep up.

A service calls ``send_async`` with 64 messages at a time in a loop and never waits
for the answers (the producer's own backpressure, ``async_send_max_messages`` /
``_bytes``, paces it), while a slow consumer pulls a trickle. What a user wants to
know: how much the producer offers in that state, whether it holds up over a minute
(the CommitLog rolls over its 1 GiB files meanwhile: the broker runs the default
sizes), and whether memory stays flat, the producer's and the broker's anonymous
memory (RSS less the mapped files).

Each run goes twice, idempotence on and off (the default, and RocketMQ's
at-least-once), so the ratio between them is measured on the same machine minutes
apart; windows of ``--window`` seconds show the rate and memory as they go.

    python benchmarks/overload_bench.py --seconds 60
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Any

import ray
from _local import actor_pids, start_local_ray

import actors
from storage import Message

TOPIC = "Overload"


def anon_mib(pid: int) -> float:
    """A process's anonymous resident memory (``RssAnon``), MiB: what it allocated, not
    the pages of files it maps (a broker's CommitLog)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


def slow_consumer(cluster: actors.Cluster, stop: threading.Event, pulled: list[int]) -> None:
    """Pulls 32 messages from one queue every 10 ms: far behind the producer."""
    consumer = cluster.pull_consumer("overload-slow")
    mq = consumer.fetch_subscribe_queues(TOPIC)[0]
    offset = 0
    while not stop.is_set():
        r = consumer.pull(mq, offset, 32)
        if r.messages:
            offset = r.next_offset
            pulled[0] += len(r.messages)
        stop.wait(0.01)


def run(
    cluster: actors.Cluster, idempotent: bool, seconds: float, window: float, broker_pid: int
) -> dict[str, Any]:
    producer = cluster.producer(f"overload-{idempotent}", enable_idempotence=idempotent)
    batch = [Message(TOPIC, b"o" * 100) for _ in range(64)]
    producer.send_batch(batch)  # routed, numbered, connected
    stop = threading.Event()
    pulled = [0]
    reader = threading.Thread(target=slow_consumer, args=(cluster, stop, pulled), daemon=True)
    reader.start()
    windows: list[dict[str, float]] = []
    pending: deque[Any] = deque()
    sent = 0
    started = mark = time.perf_counter()
    mark_sent = 0
    me = os.getpid()
    while True:
        now = time.perf_counter()
        if now - mark >= window:
            windows.append(
                {
                    "msg_s": (sent - mark_sent) / (now - mark),
                    "producer_mib": anon_mib(me),
                    "broker_mib": anon_mib(broker_pid),
                }
            )
            w = windows[-1]
            print(
                f"    {'on ' if idempotent else 'off'} t={now - started:5.1f}s "
                f"{w['msg_s']:>12,.0f} msg/s  producer {w['producer_mib']:7.1f} MiB  "
                f"broker {w['broker_mib']:7.1f} MiB",
                file=sys.stderr,
                flush=True,
            )
            mark, mark_sent = now, sent
            if now - started >= seconds:
                break
        pending.append(producer.send_async(batch))
        sent += len(batch)
        while pending and pending[0].done():
            pending.popleft().result()  # raises what the send raised
    for f in pending:
        f.result()
    stop.set()
    reader.join()
    producer.close()
    return {"windows": windows, "pulled": pulled[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="each run's length")
    parser.add_argument("--window", type=float, default=5.0, help="seconds per printed window")
    args = parser.parse_args(argv)
    start_local_ray()
    root = tempfile.mkdtemp(prefix="raymq-overload-")
    results: dict[bool, dict[str, Any]] = {}
    try:
        cluster = actors.start_cluster(
            namespace="raymq-overload",
            nameservers=1,
            brokers=1,
            store_root=root,
            topics=[actors.TopicConfig(TOPIC, 4, 4)],
        )
        try:
            (broker_pid,) = actor_pids("Broker")
            for idempotent in (True, False):
                results[idempotent] = run(
                    cluster, idempotent, args.seconds, args.window, broker_pid
                )
        finally:
            cluster.shutdown()
    finally:
        shutil.rmtree(root, ignore_errors=True)  # gigabytes of default-size CommitLog
        ray.shutdown()
    print(f"== Overload: send_async of 64 x 100 B without waiting, {args.seconds:g} s per run")
    for idempotent, r in results.items():
        w = r["windows"]
        rates = [x["msg_s"] for x in w]
        print(
            f"  idempotence {'on ' if idempotent else 'off'}: offered median "
            f"{statistics.median(rates):,.0f} msg/s (windows {min(rates):,.0f}..{max(rates):,.0f}); "
            f"producer memory {w[0]['producer_mib']:.0f} -> {w[-1]['producer_mib']:.0f} MiB, "
            f"broker {w[0]['broker_mib']:.0f} -> {w[-1]['broker_mib']:.0f} MiB; "
            f"the slow consumer pulled {r['pulled']:,}"
        )
    on = statistics.median(x["msg_s"] for x in results[True]["windows"])
    off = statistics.median(x["msg_s"] for x in results[False]["windows"])
    print(f"  on/off {on / off:.2f} (target >= 0.90)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
