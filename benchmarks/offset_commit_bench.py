"""What a consumer offset commit costs, and whether it slows sends (not a timed test).

A broker keeps committed offsets in memory and appends each change to a journal beside
``consumerOffset.json`` (page cache: it outlives a SIGKILL); under SYNC_FLUSH it
answers a commit only once the journal is fsynced. One run prints:

* the offset table alone, no Ray: a commit as a bare table update (a dict under a
  lock: the table without a journal, the baseline), a commit with its journal line,
  and a commit followed by ``sync()`` (the fsync a SYNC_FLUSH commit waits for);
* a broker under ASYNC_FLUSH, then one under SYNC_FLUSH, through the public API: a
  pull consumer's ``commit`` (p50/p99, ms), and a producer's ``send`` (p50/p99, ms)
  alone and while another thread commits without pause, with the ratio of the two.

    python benchmarks/offset_commit_bench.py [--commits 2000] [--sends 2000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import actors
from actors.broker.offset.consumer_offset_manager import ConsumerOffsetManager
from storage import Message
from storage.config_files import JsonConfigFile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _local import start_local_ray  # noqa: E402

TOPIC = "OffsetBench"
STORE = {
    "commitlog_file_size": 64 << 20,
    "consume_queue_file_entries": 100_000,
    "index_hash_slots": 50_021,
    "index_max_entries": 200_000,
}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def table_alone(n: int) -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        offsets = ConsumerOffsetManager(JsonConfigFile(Path(d) / "consumerOffset.json"))
        bare: dict[tuple[str, str], dict[int, int]] = {}
        lock = threading.Lock()
        t = time.perf_counter()
        for i in range(n):
            with lock:
                bare.setdefault(("T", "g"), {})[i % 16] = i
        base_us = (time.perf_counter() - t) / n * 1e6
        t = time.perf_counter()
        for i in range(n):
            offsets.commit("g", "T", i % 16, i)
        journal_us = (time.perf_counter() - t) / n * 1e6
        m = max(1, n // 10)
        t = time.perf_counter()
        for i in range(m):
            offsets.commit("g", "T", i % 16, i)
            offsets.sync()
        sync_us = (time.perf_counter() - t) / m * 1e6
    print(f"offset table alone, {n} commits (us per commit):")
    print(f"  bare table update (baseline)  {base_us:8.2f}")
    print(f"  commit + journal line         {journal_us:8.2f}   x{journal_us / base_us:.1f}")
    print(f"  commit + journal + fsync      {sync_us:8.1f}   ({m} commits)")


def timed(fn: Any, n: int) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def broker_run(flush: str, commits: int, sends: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(dir="/tmp") as root:
        cluster = actors.start_cluster(
            namespace=f"offset-bench-{flush.lower()}",
            nameservers=1,
            brokers=1,
            store_root=root,
            topics=[actors.TopicConfig(TOPIC, 4, 4)],
            broker_options={"store": {**STORE, "flush_disk_type": flush}},
        )
        try:
            producer = cluster.producer("offset-bench-p")
            consumer = cluster.pull_consumer("offset-bench-g")
            for _ in range(4):  # a few hundred messages per queue: offsets to commit
                producer.send_batch([Message(TOPIC, b"warm")] * 400)
            mqs = consumer.fetch_subscribe_queues(TOPIC)
            for i in range(50):  # connections open, code warm
                consumer.commit(mqs[i % len(mqs)], i % 200)
            out = {"commit": timed(lambda i: consumer.commit(mqs[i % len(mqs)], i % 200), commits)}
            body = b"x" * 256
            out["send alone"] = timed(lambda i: producer.send(Message(TOPIC, body)), sends)
            stop = threading.Event()
            done = [0]

            def commit_all_along() -> None:
                other = cluster.pull_consumer("offset-bench-g2")
                while not stop.is_set():
                    other.commit(mqs[done[0] % len(mqs)], done[0] % 200)
                    done[0] += 1

            th = threading.Thread(target=commit_all_along, daemon=True)
            th.start()
            out["send + commits"] = timed(lambda i: producer.send(Message(TOPIC, body)), sends)
            stop.set()
            th.join(timeout=30)
            out["commits meanwhile"] = [float(done[0])]
            producer.close()
        finally:
            cluster.shutdown(timeout_s=10.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commits", type=int, default=2000)
    ap.add_argument("--sends", type=int, default=2000)
    args = ap.parse_args()
    table_alone(max(args.commits * 10, 10_000))
    start_local_ray()
    results = {
        flush: broker_run(flush, args.commits, args.sends)
        for flush in ("ASYNC_FLUSH", "SYNC_FLUSH")
    }
    print(f"\na broker through the public API (ms), {args.commits} commits, {args.sends} sends:")
    print(f"{'':<12} {'commit p50':>10} {'p99':>7} {'send p50':>9} {'p99':>7} "
          f"{'+commits p50':>12} {'p99':>7} {'ratio p50':>9} {'commits meanwhile':>17}")  # fmt: skip
    for flush, r in results.items():
        alone, busy = pct(r["send alone"], 0.5), pct(r["send + commits"], 0.5)
        print(
            f"{flush:<12} {pct(r['commit'], 0.5):>10.3f} {pct(r['commit'], 0.99):>7.3f} "
            f"{alone:>9.3f} {pct(r['send alone'], 0.99):>7.3f} {busy:>12.3f} "
            f"{pct(r['send + commits'], 0.99):>7.3f} {busy / alone:>9.2f} "
            f"{int(r['commits meanwhile'][0]):>17}"
        )
    a, s = results["ASYNC_FLUSH"]["commit"], results["SYNC_FLUSH"]["commit"]
    print(f"\ncommit p50 SYNC_FLUSH / ASYNC_FLUSH: {pct(s, 0.5) / pct(a, 0.5):.2f}")


if __name__ == "__main__":
    main()
