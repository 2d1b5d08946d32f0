"""Transactional messages (RocketMQ's: half message, local transaction, end) beside plain
sync sends measured in the same run, and how fast the check service resolves a backlog.

    python benchmarks/txn_bench.py [--quick] [--count N] [--pending N] [--multi N]
                                   [--size N] [--producers K] [--skip-check-back]
                                   [--json FILE]

A local Ray cluster (started here) with one broker on a temp directory (ASYNC_FLUSH, or
SYNC_FLUSH with ``--sync-flush``).

* **Throughput**: ``count`` single 100-byte messages sent one after another with
  ``Producer.send`` (plain) and with ``TransactionProducer.send_message_in_transaction``
  (a local transaction that commits at once: a half message, then an end), in three
  alternated rounds; medians and their ratio (issue #24's target: >= 0.5).
* **Multi-message transactions** (``TransactionalProducer``, issue #24 beyond RocketMQ):
  transactions of ``--size`` (100) messages each (``begin``, ``send``, ``commit``: the
  messages go as one batch of half messages through the data path; the coordinator
  names the broker, logs the decision with fsync and has the broker commit all of them
  in one append) against plain ``send_batch`` calls of the same size, alternated in
  three rounds; messages per second and the ratio (target: >= 0.3); also with
  ``commit(wait=False)`` (the commit answered once decided, applied in the background);
  and *one-phase* transactions of the same size (held by the producer until
  ``commit()``, then stored by their one broker in one append with a commit marker,
  no coordinator: ``actors.broker.transaction.one_phase``), the figure the target is read against
  when one broker holds the transaction (the two phases stay for several brokers).
  ``--producers K``: K threads on each side, each with its own producer, at once.
  Each round also prints where a call's time goes (median ms of a plain batch, of a
  transaction's send and of its commit) and the CPU each process spent per call
  (broker, coordinator, this process; user + system from ``/proc``): on a small
  machine the processes take turns on its cores, and the CPU per call bounds the rate.
* **Check-back**: ``pending`` transactions left UNKNOW (as if their producer crashed
  between the half message and the end); the broker's check service asks the producer's
  ``check_local_transaction``, which commits. Reported: how long after the last of them
  became old enough to check (``transaction_timeout_s``) every one was committed, in
  check intervals (target: within 2).

Not a test: figures drift on shared machines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import ray

import actors
from actors import LocalTransactionState, TransactionalProducer, TransactionProducer
from storage import Message

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _local import actor_pids, start_local_ray, total_cpu_s  # noqa: E402

TOPIC = "TxnBench"
CHECK_INTERVAL_S = 2.0
TIMEOUT_S = 1.0


class Committer:
    """Commits at once, or (``later``) answers UNKNOW and commits when checked."""

    def __init__(self, later: bool = False) -> None:
        self.later = later
        self.checked = 0
        self.lock = threading.Lock()

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW if self.later else LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        with self.lock:
            self.checked += 1
        return LocalTransactionState.COMMIT_MESSAGE


def rate(n: int, send: Any) -> float:
    body = b"x" * 100
    started = time.perf_counter()
    for _ in range(n):
        send(Message(TOPIC, body))
    return n / (time.perf_counter() - started)


def bench_throughput(cluster: actors.Cluster, count: int) -> dict[str, Any]:
    """Single messages: plain sync sends against RocketMQ-style transactions (a half
    message, the local transaction, the end sent oneway), and the CPU each process
    spent per message meanwhile (the broker's is what a transaction doubles)."""
    plain = cluster.producer("txn-bench-plain")
    txn = TransactionProducer("txn-bench", Committer(), namespace=cluster.namespace)
    try:
        rate(200, plain.send)  # warm: routes, connections, producer ids
        rate(200, txn.send_message_in_transaction)
        pids = {"broker": actor_pids("Broker")[0], "this process": os.getpid()}
        rounds: dict[str, list[float]] = {"plain": [], "txn": []}
        for r in range(3):
            cpu: dict[str, dict[str, float]] = {}
            for kind, send in (("plain", plain.send), ("txn", txn.send_message_in_transaction)):
                before = {k: total_cpu_s(p) for k, p in pids.items()}
                rounds[kind].append(rate(count, send))
                cpu[kind] = {k: (total_cpu_s(p) - before[k]) * 1e3 / count for k, p in pids.items()}
                for k, ms in cpu[kind].items():
                    rounds.setdefault(f"cpu_{kind}_{k}", []).append(ms)
            print(
                f"  round {r + 1}: plain {rounds['plain'][-1]:,.0f} msg/s, "
                f"transactions {rounds['txn'][-1]:,.0f} txn/s; CPU ms per message, plain / "
                "transaction: "
                + ", ".join(f"{k} {cpu['plain'][k]:.2f} / {cpu['txn'][k]:.2f}" for k in pids),
                flush=True,
            )
    finally:
        txn.close()
        plain.close()
    out = {k: statistics.median(v) for k, v in rounds.items()}
    out["ratio"] = out["txn"] / out["plain"]
    out["rounds"] = rounds
    return out


def bench_multi(
    cluster: actors.Cluster, log_dir: str, txns: int, size: int, producers: int = 1
) -> dict[str, Any]:
    """Messages per second: transactions of ``size`` messages vs plain batches of ``size``;
    ``producers`` threads on each side at once, each with its own producer (and its own
    ``transactional_id``), ``txns`` calls each per round."""
    plains = [cluster.producer(f"txn-bench-batch-{i}") for i in range(producers)]
    txn_producers = [  # the two phases: the half messages go at send(), the decision after
        TransactionalProducer(
            "txn-bench-multi",
            transactional_id=f"txn-bench-{i}",
            namespace=cluster.namespace,
            coordinator_log_dir=log_dir,
            flush_messages=size,
            one_phase=False,
        )
        for i in range(producers)
    ]
    one_phase_producers = [  # held until commit(), then one broker's one append
        TransactionalProducer(
            "txn-bench-multi",
            transactional_id=f"txn-bench-one-{i}",
            namespace=cluster.namespace,
            coordinator_log_dir=log_dir,
            flush_messages=max(1000, size + 1),
        )
        for i in range(producers)
    ]
    producer = txn_producers[0]
    batch = [Message(TOPIC, b"z" * 100) for _ in range(size)]

    def in_threads(n: int, one: Any) -> float:
        """``one(i)`` ``n`` times on each of ``producers`` threads: messages per second."""

        def run(i: int) -> None:
            for _ in range(n):
                one(i)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(producers)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return producers * n * size / (time.perf_counter() - started)

    # where a call's time goes (ms), the latest round's: what bounds the ratio
    phases: dict[str, list[float]] = {"plain": [], "send": [], "commit": [], "one_phase": []}

    def plain_one(i: int) -> None:
        started = time.perf_counter()
        plains[i].send_batch(batch)
        phases["plain"].append((time.perf_counter() - started) * 1e3)

    def plain_round(n: int) -> float:
        phases["plain"].clear()
        return in_threads(n, plain_one)

    def txn_round(n: int, wait: bool = True) -> float:
        if wait:
            phases["send"].clear()
            phases["commit"].clear()

        def one(i: int) -> None:
            started = time.perf_counter()
            txn = txn_producers[i].begin()
            txn.send(batch)  # flush_messages=size: the half messages go here
            sent = time.perf_counter()
            txn.commit(wait=wait)
            if wait:
                phases["send"].append((sent - started) * 1e3)
                phases["commit"].append((time.perf_counter() - sent) * 1e3)

        return in_threads(n, one)

    def one_phase_round(n: int) -> float:
        phases["one_phase"].clear()

        def one(i: int) -> None:
            started = time.perf_counter()
            txn = one_phase_producers[i].begin()
            txn.send(batch)  # held here until the commit
            txn.commit()
            phases["one_phase"].append((time.perf_counter() - started) * 1e3)

        return in_threads(n, one)

    def cpu_of(calls: int, fn: Any) -> tuple[float, dict[str, float]]:
        """``fn()``'s figure and each process's CPU ms per call meanwhile."""
        before = {k: total_cpu_s(p) for k, p in pids.items()}
        figure = fn()
        return figure, {k: (total_cpu_s(p) - before[k]) * 1e3 / calls for k, p in pids.items()}

    try:
        plain_round(20)  # warm: routes, connections, producer ids, the coordinator
        txn_round(20)
        one_phase_round(20)
        pids = {"broker": actor_pids("Broker")[0], "this process": os.getpid()}
        pids["coordinator"] = actor_pids("TransactionCoordinator")[0]
        rounds: dict[str, list[float]] = {
            "plain": [],
            "txn": [],
            "txn_nowait": [],
            "one_phase": [],
        }
        for r in range(3):
            figure, plain_cpu = cpu_of(producers * txns, lambda: plain_round(txns))
            rounds["plain"].append(figure)
            figure, txn_cpu = cpu_of(producers * txns, lambda: txn_round(txns))
            rounds["txn"].append(figure)
            rounds["txn_nowait"].append(txn_round(txns, wait=False))
            figure, one_cpu = cpu_of(producers * txns, lambda: one_phase_round(txns))
            rounds["one_phase"].append(figure)
            med = {k: statistics.median(v) for k, v in phases.items()}
            print(
                f"  round {r + 1}: plain batches {rounds['plain'][-1]:,.0f} msg/s, "
                f"transactions of {size} {rounds['txn'][-1]:,.0f} msg/s "
                f"({rounds['txn'][-1] / size:,.0f} txn/s), with commit(wait=False) "
                f"{rounds['txn_nowait'][-1]:,.0f} msg/s; median ms: a plain batch "
                f"{med['plain']:.2f}, a transaction's send {med['send']:.2f} and "
                f"commit {med['commit']:.2f}",
                flush=True,
            )
            print(
                f"    one-phase transactions of {size} {rounds['one_phase'][-1]:,.0f} msg/s; "
                f"median ms a transaction {med['one_phase']:.2f}; CPU ms per call "
                + ", ".join(f"{k} {one_cpu[k]:.2f}" for k in pids),
                flush=True,
            )
            print(
                "    CPU ms per call, a plain batch / a transaction: "
                + ", ".join(f"{k} {plain_cpu[k]:.2f} / {txn_cpu[k]:.2f}" for k in pids),
                flush=True,
            )
            for k, v in med.items():
                rounds.setdefault(f"{k}_ms", []).append(v)
            for k in pids:
                rounds.setdefault(f"cpu_plain_{k}", []).append(plain_cpu[k])
                rounds.setdefault(f"cpu_txn_{k}", []).append(txn_cpu[k])
                rounds.setdefault(f"cpu_one_phase_{k}", []).append(one_cpu[k])
        stats = ray.get(producer.coordinator.status.remote())["stats"]
    finally:
        one_phase_commits = sum(p.one_phase_commits for p in one_phase_producers)
        for closing in (*txn_producers, *one_phase_producers, *plains):
            closing.close()
    out: dict[str, Any] = {k: statistics.median(v) for k, v in rounds.items()}
    out["ratio"] = out["txn"] / out["plain"]
    out["ratio_nowait"] = out["txn_nowait"] / out["plain"]
    out["ratio_one_phase"] = out["one_phase"] / out["plain"]
    out["one_phase_commits"] = one_phase_commits
    out["size"] = size
    out["producers"] = producers
    out["rounds"] = rounds
    out["coordinator"] = stats
    return out


def pending(cluster: actors.Cluster) -> int:
    return len(cluster.admin.pending_transactions("txn-bench-later"))


def bench_check_back(cluster: actors.Cluster, n: int) -> dict[str, Any]:
    listener = Committer(later=True)
    txn = TransactionProducer("txn-bench-later", listener, namespace=cluster.namespace)
    try:
        body = b"y" * 100
        started = time.perf_counter()
        for i in range(n):
            txn.send_message_in_transaction(Message(TOPIC, body), None)
            if (i + 1) % max(1, n // 5) == 0:
                print(f"  {i + 1:,} of {n:,} half messages left UNKNOW", flush=True)
        sent_s = time.perf_counter() - started
        checkable = time.perf_counter() + TIMEOUT_S  # the last one is old enough then
        left = pending(cluster)
        while left:
            time.sleep(0.2)
            left = pending(cluster)
            print(f"  {left:,} pending", flush=True) if left else None
        resolved_s = max(0.0, time.perf_counter() - checkable)
    finally:
        txn.close()
    return {
        "pending": n,
        "send_s": sent_s,
        "resolved_after_s": resolved_s,
        "check_intervals": resolved_s / CHECK_INTERVAL_S,
        "checks_answered": listener.checked,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    parser.add_argument("--count", type=int, default=2000, help="sends per round and kind")
    parser.add_argument("--pending", type=int, default=10_000, help="UNKNOW transactions")
    parser.add_argument("--multi", type=int, default=200, help="multi-message txns per round")
    parser.add_argument("--size", type=int, default=100, help="messages per multi-message txn")
    parser.add_argument(
        "--producers", type=int, default=1, help="concurrent producers on each side (multi)"
    )
    parser.add_argument("--skip-check-back", action="store_true", help="no check-back part")
    parser.add_argument(
        "--sync-flush", action="store_true", help="the broker flushes every put (SYNC_FLUSH)"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    count, n_pending = (300, 500) if args.quick else (args.count, args.pending)
    n_multi = 30 if args.quick else args.multi
    start_local_ray()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="raymq-txn-bench-") as root:
        cluster = actors.start_cluster(
            namespace="raymq-txn-bench",
            nameservers=1,
            brokers=1,
            store_root=root,
            topics=[actors.TopicConfig(TOPIC, 4, 4)],
            broker_options={
                "store": {
                    "commitlog_file_size": 256 << 20,
                    "flush_disk_type": "SYNC_FLUSH" if args.sync_flush else "ASYNC_FLUSH",
                },
                "transaction_check_interval_s": CHECK_INTERVAL_S,
                "transaction_timeout_s": TIMEOUT_S,
            },
        )
        try:
            print(f"== throughput: {count:,} single messages per round and kind", flush=True)
            results["throughput"] = bench_throughput(cluster, count)
            print(
                f"== multi-message: {n_multi:,} transactions of {args.size} per round",
                flush=True,
            )
            results["multi"] = bench_multi(
                cluster, f"{root}/txn-log", n_multi, args.size, args.producers
            )
            if not args.skip_check_back:
                print(f"== check-back of {n_pending:,} UNKNOW transactions", flush=True)
                results["check_back"] = bench_check_back(cluster, n_pending)
        finally:
            cluster.shutdown()
    ray.shutdown()
    t, m = results["throughput"], results["multi"]
    print("\n== Against the targets (issue #24)")
    print(
        f"  single-message transactions {t['txn']:,.0f} txn/s vs plain sync sends "
        f"{t['plain']:,.0f} msg/s: {t['ratio']:.2f} (target >= 0.50)"
    )
    single = [k.removeprefix("cpu_txn_") for k in t if k.startswith("cpu_txn_")]
    print(
        "    median CPU ms per message, a plain send / a transaction: "
        + ", ".join(f"{k} {t['cpu_plain_' + k]:.2f} / {t['cpu_txn_' + k]:.2f}" for k in single)
    )
    print(
        f"  transactions of {m['size']} messages ({m['producers']} producer(s) on each side) "
        f"{m['txn']:,.0f} msg/s vs plain batches "
        f"{m['plain']:,.0f} msg/s: {m['ratio']:.2f} (target >= 0.30); with "
        f"commit(wait=False) {m['txn_nowait']:,.0f} msg/s: {m['ratio_nowait']:.2f}"
    )
    print(
        f"    median ms per call: a plain batch {m['plain_ms']:.2f}; a transaction's send "
        f"{m['send_ms']:.2f} (the half messages) and commit {m['commit_ms']:.2f} (the "
        "coordinator's fsynced decision, then the brokers' committed copies)"
    )
    print(
        f"  one-phase transactions of {m['size']} messages (held until the commit, one "
        f"broker's one append; {m['one_phase_commits']:,} committed so) {m['one_phase']:,.0f} "
        f"msg/s vs plain batches: {m['ratio_one_phase']:.2f} (target >= 0.30)"
    )
    procs = [k.removeprefix("cpu_txn_") for k in m if k.startswith("cpu_txn_")]
    print(
        "    median CPU ms per call, a plain batch / a transaction: "
        + ", ".join(f"{k} {m['cpu_plain_' + k]:.2f} / {m['cpu_txn_' + k]:.2f}" for k in procs)
        + f" (together {sum(m['cpu_plain_' + k] for k in procs):.2f} / "
        f"{sum(m['cpu_txn_' + k] for k in procs):.2f}); one-phase "
        + ", ".join(f"{k} {m['cpu_one_phase_' + k]:.2f}" for k in procs)
    )
    c = results.get("check_back")
    if c is not None:
        print(
            f"  {c['pending']:,} UNKNOW transactions committed by check-back "
            f"{c['resolved_after_s']:.1f} s after the last was old enough: "
            f"{c['check_intervals']:.1f} check intervals of {CHECK_INTERVAL_S:.0f} s "
            "(target <= 2)"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
