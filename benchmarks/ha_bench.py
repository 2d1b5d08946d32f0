"""High-availability benchmark of RayMQ (not a timed test).

One run prints:

* put throughput of a broker group, the same load on each: a master with one
  slave as ASYNC_MASTER, the same as SYNC_MASTER (a put waits for the slave),
  and a 3-member DLedger (Raft) group (a put waits for a majority). The load is
  pre-encoded batches sent straight to the master's ``send`` with a window of
  calls in flight (so the client's encoding does not hide the broker's cost);
  the ratio SYNC/ASYNC is what the seeds put at 60-80% for RocketMQ;
* the failover time distribution: under a steady producer, the group's leader
  (or master) is killed, and the time to the first acknowledged write on the new
  leader is measured, trial after trial (the killed member is started again from
  its store and rejoins before the next trial). For DLedger the survivors learn
  of the death from Ray at once and elect a new leader; for master/slave an
  operator's ``promote`` is issued as soon as the master leaves the routes.

    python benchmarks/ha_bench.py [--quick] [--trials 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import actors
from actors import BrokerConfig, BrokerSpec, SendStatus
from actors.cluster import ACTOR_MAX_CONCURRENCY
from actors.protocol.wire import SendAck
from storage import Message, codec, encode_batch
from storage.message import PutStatus

TOPIC = "HABench"
STORE = {
    "commitlog_file_size": 256 << 20,
    "consume_queue_file_entries": 300_000,
    "index_hash_slots": 500_009,
    "index_max_entries": 2_000_000,
    "flush_interval_commitlog_ms": 200,
}
RAFT = {"enable_dledger": True}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def start(
    kind: str, root: str, members: int = 2, **extra: Any
) -> tuple[actors.Cluster, dict[str, Any]]:
    ns = f"habench-{uuid.uuid4().hex[:8]}"
    if kind == "raft":
        brokers = [BrokerSpec("broker-a", i) for i in range(3)]
        options: dict[str, Any] = dict(RAFT)
    else:
        brokers = [BrokerSpec("broker-a", i) for i in range(members)]
        options = {"broker_role": kind}
    options.update({"store": STORE, "heartbeat_interval_s": 2.0, **extra})
    cluster = actors.start_cluster(
        namespace=ns,
        nameservers=1,
        brokers=brokers,
        store_root=f"{root}/{ns}",
        broker_options=options,
        topics=[actors.TopicConfig(TOPIC, 4, 4)],
    )
    return cluster, options


def master_handle(cluster: actors.Cluster) -> Any:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = ray.get(cluster.nameserver(0).get_cluster_info.remote())
        master = info["brokers"].get("broker-a", {}).get("members", {}).get(0)
        if master:
            return ray.get_actor(master["actor_name"], namespace=cluster.namespace)
        time.sleep(0.05)
    raise TimeoutError("no master registered")


# ------------------------------------------------------------ throughput
def measure(broker: Any, blobs: list[bytes], calls: int, window: int) -> tuple[float, list, dict]:
    """Send ``calls`` batches, ``window`` in flight: (batches/s, latencies, statuses)."""
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    inflight: list[tuple[float, Any]] = []
    started = time.perf_counter()
    for i in range(calls + window):
        if i < calls:
            inflight.append((time.perf_counter(), broker.send.remote(blobs[i % len(blobs)])))
        if len(inflight) >= window or (i >= calls and inflight):
            t0, ref = inflight.pop(0)
            ack = SendAck.from_wire(ray.get(ref))
            latencies.append(time.perf_counter() - t0)
            statuses[ack.status.value] = statuses.get(ack.status.value, 0) + 1
    return calls / (time.perf_counter() - started), latencies, statuses


def wait_in_sync(group: list[Any], timeout_s: float = 120.0) -> float:
    """Seconds until every member holds the whole CommitLog (a slave or follower that fell
    behind during a run catches up before the next run starts)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        ends = {ray.get(h.status.remote())["commitlog_max_offset"] for h in group}
        if len(ends) == 1:
            break
        time.sleep(0.01)
    return time.perf_counter() - started


def throughput(
    kinds: list[str], root: str, mb: int, body: int, batch: int, windows: list[int], reps: int
) -> list[dict[str, Any]]:
    """Every mode's group up at once; runs interleaved (mode after mode, ``reps`` rounds) so
    all modes see the same machine; per mode and window the median of the runs. After each
    run the group is let catch up (an ASYNC_MASTER's slave lags) before the next one."""
    groups = {kind: start(kind, root)[0] for kind in kinds}
    try:
        brokers = {kind: master_handle(c) for kind, c in groups.items()}
        members = {
            kind: [c.broker("broker-a", i) for i in range(3 if kind == "raft" else 2)]
            for kind, c in groups.items()
        }
        blobs = [
            encode_batch([Message(TOPIC, b"x" * body) for _ in range(batch)])
            .with_queue(q)
            .to_bytes()
            for q in range(4)
        ]
        calls = max(64, (mb << 20) // (body * batch))
        for broker in brokers.values():  # warm up: files mapped, processes hot
            measure(broker, blobs, 32, 8)
        runs: dict[tuple[str, int], list[tuple[float, list, dict]]] = {}
        lags: dict[tuple[str, int], list[float]] = {}
        for _ in range(reps):
            for window in windows:
                for kind in kinds:
                    runs.setdefault((kind, window), []).append(
                        measure(brokers[kind], blobs, calls, window)
                    )
                    lags.setdefault((kind, window), []).append(wait_in_sync(members[kind]))
    finally:
        for cluster in groups.values():
            cluster.shutdown()
    rows = []
    for (kind, window), got in runs.items():
        rates = [r * batch for r, _, _ in got]
        latencies = [x for _, lat, _ in got for x in lat]
        statuses: dict[str, int] = {}
        for _, _, st in got:
            for k, v in st.items():
                statuses[k] = statuses.get(k, 0) + v
        rate = statistics.median(rates)
        # every member holding the data: the run's time plus the catch-up after it
        replicated = [
            calls * batch / (calls / r + lag) for (r, _, _), lag in zip(got, lags[(kind, window)])
        ]
        rows.append(
            {
                "mode": kind,
                "window": window,
                "msgs_per_s": round(rate),
                "replicated_msgs_per_s": round(statistics.median(replicated)),
                "catch_up_s": round(statistics.median(lags[(kind, window)]), 3),
                "mb_per_s": round(rate * body / 1e6, 1),
                "runs_msgs_per_s": [round(r) for r in rates],
                "put_p50_ms": round(1000 * statistics.median(latencies), 1),
                "statuses": statuses,
            }
        )
    return sorted(rows, key=lambda r: (kinds.index(r["mode"]), r["window"]))


# ------------------------------------------------------------ failover
class Load:
    def __init__(self, producer: actors.Producer) -> None:
        self.producer = producer
        self.ok_times: list[tuple[float, str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            msgs = [Message(TOPIC, b"f%09d" % (i + j)) for j in range(16)]
            i += 16
            try:
                results = self.producer.send_batch(msgs)
            except Exception:  # noqa: BLE001 - failing over
                time.sleep(0.01)
                continue
            if all(r.status is SendStatus.SEND_OK for r in results):
                # which broker stored it: the store host in the offset message id
                self.ok_times.append((time.monotonic(), results[0].offset_msg_id[:16]))

    def first_ok_after(self, t: float, not_by: str, timeout_s: float = 60.0) -> float:
        """Seconds from ``t`` to the first acknowledged batch stored by another broker
        than ``not_by`` (a store host, as hex)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            later = [x for x, host in self.ok_times if x > t and host != not_by]
            if later:
                return min(later) - t
            time.sleep(0.005)
        raise TimeoutError("no acknowledged write after the failure")


def restart(cluster: actors.Cluster, options: dict[str, Any], root: str, name: str) -> Any:
    bid = int(name.rsplit("-", 1)[1])
    values = dict(options)
    if values.get("enable_dledger"):
        values["dledger_peers"] = (0, 1, 2)
    config = BrokerConfig(
        broker_name="broker-a",
        broker_id=bid,
        listen_port=10911 + 10 * bid,  # as start_cluster gave it: the same store host
        namespace=cluster.namespace,
        nameservers=tuple(cluster.nameserver_names),
        store_dir=f"{root}/{cluster.namespace}/{name}",
        **values,
    )
    handle = (
        ray.remote(actors.Broker)
        .options(
            name=name,
            namespace=cluster.namespace,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=ACTOR_MAX_CONCURRENCY,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False
            ),
        )
        .remote(config)
    )
    ray.get(handle.ping.remote(), timeout=60)
    return handle


def members(cluster: actors.Cluster) -> dict[int, str]:
    info = ray.get(cluster.nameserver(0).get_cluster_info.remote())
    entry = info["brokers"].get("broker-a", {}).get("members", {})
    return {bid: m["actor_name"] for bid, m in entry.items()}


def caught_up(cluster: actors.Cluster, names: list[str]) -> bool:
    try:
        statuses = [
            ray.get(ray.get_actor(n, namespace=cluster.namespace).status.remote(), timeout=5)
            for n in names
        ]
    except Exception:  # noqa: BLE001
        return False
    return len({s["commitlog_max_offset"] for s in statuses}) == 1


def failover(kind: str, root: str, trials: int) -> dict[str, Any]:
    extra = {"sync_replication_timeout_s": 1.0}
    if kind == "SYNC_MASTER":
        extra.update({"slave_sync_interval_s": 0.5, "ha_slave_timeout_s": 2.0})
    # a master with two slaves: once one is promoted, the other keeps puts acknowledged
    cluster, options = start(kind, root, members=3, **extra)
    names = ["broker-a-0", "broker-a-1", "broker-a-2"]
    load = Load(cluster.producer("habench-failover", send_timeout_s=2.0))
    times: list[float] = []
    try:
        for trial in range(trials):
            t0 = time.monotonic()
            while len([x for x, _ in load.ok_times if x > t0]) < 20:
                time.sleep(0.01)
            victim = members(cluster)[0]
            handle = ray.get_actor(victim, namespace=cluster.namespace)
            host = codec.host_to_bytes(ray.get(handle.status.remote())["addr"]).hex().upper()
            ray.kill(handle, no_restart=True)
            killed = time.monotonic()
            while members(cluster).get(0) in (victim, None):
                if kind != "raft" and 0 not in members(cluster):
                    cluster.admin.promote("broker-a")  # the operator, as soon as it can
                time.sleep(0.005)
            routed = time.monotonic() - killed
            took = load.first_ok_after(killed, host)
            times.append(took)
            print(
                f"  {kind} trial {trial + 1}: {victim} lost; new master routed after "
                f"{routed:.3f}s, first acknowledged write after {took:.3f}s",
                flush=True,
            )
            restart(cluster, options, root, victim)  # rejoins as follower / slave
            deadline = time.monotonic() + 60
            while not caught_up(cluster, names) and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        load.stop.set()
        load.thread.join(timeout=10)
        cluster.shutdown()
    return {
        "mode": kind,
        "trials": len(times),
        "p50_s": round(statistics.median(times), 3),
        "p90_s": round(pct(times, 0.9), 3),
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
        "all_s": [round(t, 3) for t in times],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--mb", type=int, default=None, help="MB sent per measurement")
    ap.add_argument("--reps", type=int, default=3, help="measurements per point (median)")
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--windows", default="8,32", help="send calls in flight, comma-separated")
    ap.add_argument("--skip-failover", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if not ray.is_initialized():
        ray.init(
            address="local",
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    mb = args.mb or (20 if args.quick else 50)
    windows = [int(w) for w in args.windows.split(",")]
    reps = 1 if args.quick else args.reps
    out: dict[str, Any] = {"throughput": [], "failover": []}
    with tempfile.TemporaryDirectory(prefix="ha-bench-") as root:
        print(
            f"throughput: {args.body} B bodies, batches of {args.batch}, {mb} MB per run, "
            f"median of {reps}, windows of {windows} send calls in flight",
            flush=True,
        )
        kinds = [] if args.skip_throughput else ["ASYNC_MASTER", "SYNC_MASTER", "raft"]
        if kinds:
            for row in throughput(kinds, root, mb, args.body, args.batch, windows, reps):
                out["throughput"].append(row)
                print(
                    f"  {row['mode']:13s} window {row['window']:>3}: {row['msgs_per_s']:>9,} "
                    f"msg/s acknowledged ({row['mb_per_s']} MB/s, put p50 {row['put_p50_ms']} "
                    f"ms), {row['replicated_msgs_per_s']:>9,} msg/s on every member (catch-up "
                    f"{row['catch_up_s']} s)  runs {row['runs_msgs_per_s']}  {row['statuses']}",
                    flush=True,
                )
        base = {
            r["window"]: r["msgs_per_s"] for r in out["throughput"] if r["mode"] == "ASYNC_MASTER"
        }
        base_rep = {
            r["window"]: r["replicated_msgs_per_s"]
            for r in out["throughput"]
            if r["mode"] == "ASYNC_MASTER"
        }
        for row in out["throughput"]:
            if row["mode"] != "ASYNC_MASTER":
                ratio = row["msgs_per_s"] / base[row["window"]]
                rep = row["replicated_msgs_per_s"] / base_rep[row["window"]]
                row["vs_async"] = round(ratio, 3)
                row["vs_async_replicated"] = round(rep, 3)
                print(
                    f"  {row['mode']} / ASYNC_MASTER at window {row['window']}: {ratio:.0%} "
                    f"acknowledged, {rep:.0%} on every member"
                )
        if not args.skip_failover:
            trials = 3 if args.quick else args.trials
            for kind in ("raft", "SYNC_MASTER"):
                print(f"failover ({kind}), {trials} trials:", flush=True)
                row = failover(kind, root, trials)
                out["failover"].append(row)
                print(
                    f"  {kind}: p50 {row['p50_s']}s  p90 {row['p90_s']}s  "
                    f"min {row['min_s']}s  max {row['max_s']}s",
                    flush=True,
                )
    assert PutStatus.PUT_OK  # the statuses above are PutStatus values
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
