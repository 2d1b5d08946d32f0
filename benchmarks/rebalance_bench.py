"""Rebalance benchmark of consumer fleets (not a test; prints figures).

One run measures, on a 2-broker cluster with 8 queues and a steady producer
(one message per queue every ~20 ms, each carrying its send time):

* handoff time per membership change of a ConsumerFleet: scale up (2 -> 3), scale
  down (3 -> 2), and a crash (one member actor killed; the fleet replaces it).
  Handoff time is the longest pause in any queue's consumption during the change
  (from the last delivery by the old owner to the first by the next one; a
  steady phase with no change gives the floor, ~the send interval). Target < 1 s;
  RocketMQ's clients rebalance every 20 s;
* duplicates per change: deliveries of a message already delivered before
  (target 0 for scale up/down; a crash redelivers what the dead member had not
  committed);
* the same changes with RocketMQ-style client-side rebalancing
  (``coordinated=False``, ``rebalance_interval_s=20``) as the baseline, in the
  same run (``--skip-baseline`` to leave it out);
* consume throughput of fleets of 1, 2 and 4 members on a backlog, with a no-op
  listener (CPU-bound: consumers, brokers and the producer share the machine's
  cores) and with a listener that waits 5 ms per batch of 32 (I/O-bound: scales
  until the cores are busy); ratios against the 1-member fleet.

    python benchmarks/rebalance_bench.py [--quick] [--skip-baseline] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from typing import Any

import ray
from _local import start_local_ray

import actors
from actors import ConsumerFleet, ConsumeStatus, PushConsumerConfig
from storage import Message

log = logging.getLogger("raymq.bench.rebalance")

TOPIC, BACKLOG_TOPIC = "RbSteady", "RbBacklog"
MEMBER = {
    "heartbeat_interval_s": 1.0,
    "persist_offset_interval_s": 0.5,
    "pull_suspend_s": 2.0,
    "pull_retry_delay_s": 0.2,
    "consume_from": "FIRST",
}
FLEET = {"interval_s": 0.2, "num_cpus": 0.5, "member_shutdown_timeout_s": 30.0}
COORDINATED = "coordinated" in {f.name for f in dataclasses.fields(PushConsumerConfig)}
if not COORDINATED:  # no GroupCoordinator yet: the members rebalance on their own, often
    MEMBER["rebalance_interval_s"] = 1.0


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ------------------------------------------------------------ recording deliveries
@ray.remote(num_cpus=0)
class Recorder:
    """Every delivery: (seq, queue, sent, consumed, member pid)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, float, float, int]] = []
        self.count = 0

    def add(self, rows: list[tuple[int, str, float, float, int]]) -> None:
        self.rows.extend(rows)
        self.count += len(rows)

    def total(self) -> int:
        return self.count

    def dump(self) -> list[tuple[int, str, float, float, int]]:
        return list(self.rows)


class RecordingListener:
    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

    def __call__(self, messages: list[Any]) -> ConsumeStatus:
        now, pid = time.time(), os.getpid()
        rows = []
        for m in messages:
            seq, sent = m.body.split(b",")
            rows.append((int(seq), f"{m.store_host}/{m.queue_id}", float(sent), now, pid))
        self.recorder.add.remote(rows)
        return ConsumeStatus.SUCCESS


class WorkListener:
    """Consumes and waits ``work_s`` per batch (an I/O-bound listener) or nothing."""

    def __init__(self, work_s: float) -> None:
        self.work_s = work_s

    def __call__(self, messages: list[Any]) -> ConsumeStatus:
        if self.work_s:
            time.sleep(self.work_s)
        return ConsumeStatus.SUCCESS


class SteadyProducer(threading.Thread):
    """One message per send, round robin over the queues, paced to ``rate`` msg/s."""

    def __init__(self, cluster: actors.Cluster, rate: float) -> None:
        super().__init__(daemon=True)
        self.cluster, self.rate = cluster, rate
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        # every queue gets its share: no broker is skipped for a slow answer (the
        # machine is shared, and a skipped broker would starve its queues' owner)
        producer = self.cluster.producer("rb-steady", send_latency_fault_enable=False)
        interval, nxt = 1.0 / self.rate, time.monotonic()
        try:
            while not self.stop.is_set():
                body = b"%d,%.6f" % (self.sent, time.time())
                producer.send_batch([Message(TOPIC, body)])
                self.sent += 1
                nxt += interval
                delay = nxt - time.monotonic()
                if delay > 0:
                    self.stop.wait(delay)
                else:
                    nxt = time.monotonic()
        finally:
            producer.close()


# ------------------------------------------------------------ one change, measured
def analyse(rows: list[tuple[int, str, float, float, int]], t0: float, t1: float) -> dict[str, Any]:
    """Figures of the deliveries consumed in ``[t0, t1]``."""
    seen_before: set[int] = set()
    by_queue: dict[str, list[tuple[float, int]]] = defaultdict(list)
    dups, latency = 0, 0.0
    for seq, queue, sent, consumed, pid in sorted(rows, key=lambda r: r[3]):
        if consumed < t0:
            seen_before.add(seq)
            if consumed >= t0 - 1.0:
                by_queue[queue].append((consumed, pid))
            continue
        if consumed > t1:
            break
        if seq in seen_before:
            dups += 1
        seen_before.add(seq)
        by_queue[queue].append((consumed, pid))
        latency = max(latency, consumed - sent)
    gaps, moved = {}, 0
    for queue, events in by_queue.items():
        gaps[queue] = max((b[0] - a[0] for a, b in zip(events, events[1:])), default=0.0)
        moved += len({pid for _, pid in events}) > 1
    return {
        "handoff_s": max(gaps.values(), default=float("nan")),
        "queues_seen": len(gaps),
        "queues_moved": moved,
        "duplicates": dups,
        "max_latency_s": latency,
    }


def owners_cover(fleet: ConsumerFleet, n: int, queues: int) -> bool:
    st = fleet.status()
    owned = [q for qs in st["assignment"].values() for q in qs]
    return (
        st["running"] == n
        and len(owned) == queues
        and len(set(owned)) == queues
        and all(st["assignment"].values())
    )


def wait_for(pred: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s}s")
        time.sleep(0.05)


def bench_handoffs(
    cluster: actors.Cluster, label: str, member: dict[str, Any], tail_s: float
) -> dict[str, Any]:
    """A fleet of 2 on the steady topic: steady, 2->3, 3->2, crash of one member."""
    recorder = Recorder.remote()
    group = f"rb-{label}"
    fleet = ConsumerFleet(
        group,
        TOPIC,
        RecordingListener(recorder),
        namespace=cluster.namespace,
        min_consumers=2,
        max_consumers=4,
        consumer_options=member,
        **FLEET,
    )
    settle_s = 5.0 + 3 * float(member.get("rebalance_interval_s", 0.0))
    phases: dict[str, tuple[float, float]] = {}
    try:
        fleet.scale(2, timeout_s=120)
        wait_for(lambda: owners_cover(fleet, 2, 8), 60 + settle_s, "2 members owning all")
        time.sleep(tail_s)  # the consumption is steady from here

        t0 = time.time()
        time.sleep(tail_s)
        phases["steady (no change)"] = (t0, time.time())
        progress(f"  [{label}] steady phase measured")

        t0 = time.time()
        fleet.scale(3, timeout_s=120)
        wait_for(lambda: owners_cover(fleet, 3, 8), 60 + settle_s, "3 members owning all")
        time.sleep(tail_s)
        phases["scale up 2->3"] = (t0, time.time())
        progress(f"  [{label}] scale up measured")

        t0 = time.time()
        fleet.scale(2, timeout_s=120)
        wait_for(lambda: owners_cover(fleet, 2, 8), 60 + settle_s, "2 members owning all")
        time.sleep(tail_s)
        phases["scale down 3->2"] = (t0, time.time())
        progress(f"  [{label}] scale down measured")

        victim = fleet.status()["members"][0]["name"]
        t0 = time.time()
        ray.kill(ray.get_actor(victim, namespace=cluster.namespace), no_restart=True)
        wait_for(
            lambda: victim not in fleet.status()["assignment"] and owners_cover(fleet, 2, 8),
            90 + settle_s,
            "the crash replaced",
        )
        time.sleep(tail_s)
        phases["crash of 1 of 2"] = (t0, time.time())
        progress(f"  [{label}] crash measured")
        time.sleep(1.0)  # the last deliveries reach the recorder
        rows = ray.get(recorder.dump.remote())
    finally:
        fleet.shutdown()
        ray.kill(recorder)
    return {name: analyse(rows, a, b) for name, (a, b) in phases.items()}


# ------------------------------------------------------------ throughput by fleet size
def produce_backlog(cluster: actors.Cluster, n: int) -> float:
    producer = cluster.producer("rb-backlog", max_batch_messages=20_000)
    body = b"x" * 64
    t = time.perf_counter()
    try:
        for start in range(0, n, 100_000):
            producer.send_batch([Message(BACKLOG_TOPIC, body)] * min(100_000, n - start))
    finally:
        producer.close()
    return n / (time.perf_counter() - t)


def fleet_rate(
    cluster: actors.Cluster, size: int, work_s: float, window_s: float, tag: str
) -> dict[str, Any]:
    group = f"rb-tp-{tag}-{size}"
    fleet = ConsumerFleet(
        group,
        BACKLOG_TOPIC,
        WorkListener(work_s),
        namespace=cluster.namespace,
        min_consumers=size,
        max_consumers=size,
        consumer_options={
            **MEMBER,
            "consume_threads": 4,
            "consume_batch_size": 32,
            "pull_batch_size": 256,
        },
        **FLEET,
    )
    try:
        fleet.wait_stable(size, timeout_s=120)
        wait_for(lambda: owners_cover(fleet, size, 8), 60, f"{size} members owning all")
        time.sleep(0.5)
        a = fleet.status()
        t = time.perf_counter()
        time.sleep(window_s)
        b = fleet.status()
        elapsed = time.perf_counter() - t
    finally:
        fleet.shutdown()
    return {
        "size": size,
        "msg_s": (b["consumed"] - a["consumed"]) / elapsed,
        "backlog_left": b["lag"],
    }


def bench_throughput(cluster: actors.Cluster, quick: bool) -> dict[str, list[dict[str, Any]]]:
    cluster.admin.create_topic(BACKLOG_TOPIC, 4, 4)
    n = 600_000 if quick else 1_500_000
    rate = produce_backlog(cluster, n)
    progress(f"  backlog of {n:,} messages produced at {rate:,.0f} msg/s")
    out: dict[str, list[dict[str, Any]]] = {}
    window = 3.0 if quick else 5.0
    for tag, work_s in (("noop", 0.0), ("io5ms", 0.005)):
        rows = []
        for size in (1, 2, 4):
            row = fleet_rate(cluster, size, work_s, window, tag)
            progress(f"  {tag} listener, {size} member(s): {row['msg_s']:,.0f} msg/s")
            rows.append(row)
        out[tag] = rows
    return out


# ------------------------------------------------------------ report
def report(results: dict[str, Any]) -> None:
    mode = "coordinated (GroupCoordinator)" if results["coordinated"] else "client-side"
    for label, title in (
        ("fleet", f"Fleet membership changes, {mode} rebalance"),
        ("baseline", "Baseline: RocketMQ-style client-side rebalance, rebalance_interval_s=20"),
    ):
        phases = results.get(label)
        if not phases:
            continue
        print(f"\n== {title}")
        print("  change                 handoff s   moved queues   duplicates   max latency s")
        for name, f in phases.items():
            print(
                f"  {name:<22}{f['handoff_s']:>10.3f}{f['queues_moved']:>15}"
                f"{f['duplicates']:>13}{f['max_latency_s']:>16.3f}"
            )
    fleet, base = results.get("fleet"), results.get("baseline")
    if fleet:
        print("\n== Against the targets")
        for name in ("scale up 2->3", "scale down 3->2", "crash of 1 of 2"):
            f = fleet[name]
            graceful = not name.startswith("crash")
            line = f"  {name}: handoff {f['handoff_s']:.3f} s (target < 1 s)"
            if graceful:
                line += f", {f['duplicates']} duplicates (target 0)"
            else:
                line += f", {f['duplicates']} redeliveries (uncommitted work of the dead member)"
            if base and name in base:
                b = base[name]["handoff_s"]
                line += f"; client-side at 20 s: {b:.3f} s ({b / max(f['handoff_s'], 1e-9):.1f}x)"
            print(line)
    tp = results.get("throughput")
    if tp:
        print("\n== Consume throughput by fleet size (8 queues, backlog)   msg/s   vs 1 member")
        for tag, rows in tp.items():
            one = rows[0]["msg_s"] or 1.0
            cells = "   ".join(
                f"{r['size']}: {r['msg_s']:>9,.0f} ({r['msg_s'] / one:.2f}x)" for r in rows
            )
            print(f"  {tag:<6} {cells}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="shorter phases, smaller backlog")
    parser.add_argument("--skip-baseline", action="store_true", help="no client-side baseline")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    start_local_ray(4)
    results: dict[str, Any] = {"coordinated": COORDINATED, "cpus": os.cpu_count()}
    tail = 1.5 if args.quick else 3.0
    with tempfile.TemporaryDirectory(prefix="raymq-rb-bench-") as root:
        cluster = actors.start_cluster(
            namespace="raymq-rb-bench",
            nameservers=1,
            brokers=2,
            store_root=root,
            broker_options={"store": {"commitlog_file_size": 256 << 20}},
        )
        try:
            cluster.admin.create_topic(TOPIC, 4, 4)
            steady = SteadyProducer(cluster, rate=400.0)
            steady.start()
            try:
                progress("handoffs of a fleet ...")
                results["fleet"] = bench_handoffs(cluster, "fleet", MEMBER, tail)
                if not args.skip_baseline and COORDINATED:
                    progress("handoffs, client-side rebalance every 20 s (baseline) ...")
                    base = {**MEMBER, "coordinated": False, "rebalance_interval_s": 20.0}
                    results["baseline"] = bench_handoffs(cluster, "baseline", base, tail)
                elif not COORDINATED:
                    progress("(no coordinator in this build: the fleet rebalances client-side)")
            finally:
                steady.stop.set()
                steady.join(10)
            if not args.skip_throughput:
                progress("throughput by fleet size ...")
                results["throughput"] = bench_throughput(cluster, args.quick)
        finally:
            cluster.shutdown()
    ray.shutdown()
    report(results)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
