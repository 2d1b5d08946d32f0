"""Where produce -> consume latency goes at a fixed rate: CPU per message in each
process, and the garbage collector's pauses in the two client processes, beside the
latency and beside a TCP echo round trip paced the same way in the same run.

    python benchmarks/latency_split.py [--rounds 3] [--rate 1000] [--seconds 3]

One broker (ASYNC_FLUSH); single ``send_async`` messages of 100 B from this process
at ``--rate``, to a PushConsumer in its own process (an actor, as ``peers.py``
measures RayMQ's latency): each round measures one consumer with held pulls
(``delivery="pull"``) and one on the broker's subscription stream
(``delivery="stream"``), each on its own topic, in alternating order from round to
round, and reports the stream's figures beside the pulls' with their ratio. For each
round and each it prints the latency
(p50/p99), the CPU each process spent per message (user and system, all its
threads, read from ``/proc/<pid>/stat``: broker, producer, consumer), the time their
threads spent runnable but waiting for a core (``/proc/<pid>/task/*/schedstat``), and the full
(generation 2) collections in the producer's and the consumer's processes with their
longest pause. Beside them, each round runs the ``py-relay`` floor of ``peers.py``:
the same three processes (this one, an actor relaying over TCP, a reading actor)
with nothing but asyncio sockets, its latency, its CPU and its wait per message. A first
warm-up round is not reported (a fresh broker faults its CommitLog in for its first
seconds). Linux only (``/proc``).

Read it as: at 1,000 msg/s on a 2-core machine, the CPU per message times the rate
is the share of the machine the three processes keep busy; the latency is mostly
waiting for a core and for the GIL when that share is high. The relay says what
Python itself allows here: the ratio of the CPU per message to the relay's is the
depth of RayMQ's own per-message work, the part a leaner path would remove.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (the PushConsumer latency actor, the pacing, the TCP echo)
from _local import actor_pids, cpu_s, run_wait_s, start_local_ray  # noqa: E402

import actors  # noqa: E402
from storage import Message  # noqa: E402


class GcTimer:
    """Full collections of this process and their longest pause (ms)."""

    def __init__(self) -> None:
        self.full = 0
        self.longest_ms = 0.0
        self._started = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif info.get("generation") == 2 and self._started:
            self.full += 1
            self.longest_ms = max(self.longest_ms, (time.perf_counter() - self._started) * 1e3)

    def take(self) -> tuple[int, float]:
        out = (self.full, self.longest_ms)
        self.full, self.longest_ms = 0, 0.0
        return out


class _Consumer(peers._RayMQPushLatency):
    """The PushConsumer actor of ``peers.py`` (in a group of its own, with ``delivery``),
    telling its pid and its collections."""

    def __init__(self, namespace: str, topic: str, delivery: str, **options: Any) -> None:
        from actors import ConsumeStatus, PushConsumer

        self.gc_timer = GcTimer()
        self.samples: list[float] = []
        self.stamps: set[bytes] = set()
        self.duplicates = 0
        self.arrived = threading.Condition()
        self.success = ConsumeStatus.SUCCESS
        self.consumer = PushConsumer(
            f"split-{delivery}",
            topic,
            listener=self._on,
            namespace=namespace,
            delivery=delivery,
            consume_threads=2,
            **options,
        )
        self.consumer.start()

    def pid(self) -> int:
        return os.getpid()

    def gc_pauses(self) -> tuple[int, float]:
        return self.gc_timer.take()


def _spy(pids: dict[str, int], args: argparse.Namespace, out: str) -> list[subprocess.Popen[bytes]]:
    """``py-spy record`` of each process for the round's length (raw stacks of the thread
    holding the GIL: where the Python CPU goes), written to ``out``."""
    os.makedirs(out, exist_ok=True)
    return [
        subprocess.Popen(
            [
                "py-spy",
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(max(1, int(args.seconds))),
                "--rate",
                "500",
                "--gil",
                "--format",
                "raw",
                "--nonblocking",
                "--output",
                os.path.join(out, f"{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="reported rounds (after a warm-up)")
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="py-spy each process through the last round: DIR/<pull|stream>/<process>.txt (raw stacks)",
    )
    args = parser.parse_args()
    if args.profile and shutil.which("py-spy") is None:
        parser.error("--profile needs py-spy (pip install py-spy)")
    start_local_ray()
    root = tempfile.mkdtemp(prefix="raymq-split-")
    namespace = "raymq-split"
    topics = {"pull": "Split", "stream": "SplitStream"}
    cluster = actors.start_cluster(
        namespace=namespace,
        nameservers=1,
        brokers=1,
        store_root=root,
        topics=[actors.TopicConfig(t, 4, 4) for t in topics.values()],
        broker_options={"store": {"flush_disk_type": "ASYNC_FLUSH"}},
    )
    echo = peers.RawLimit("tcp-echo")
    relay = peers.RawLimit("py-relay")
    consumers: dict[str, Any] = {}
    rows: dict[str, list[float]] = {}
    try:
        echo.start()
        relay.start()
        producer = cluster.producer("split")
        body = b"x" * 100
        for mode, topic in topics.items():
            consumers[mode] = ray.remote(num_cpus=0)(_Consumer).remote(namespace, topic, mode)
            peers.warm_up(producer, consumers[mode], topic, body)
        broker_pid = actor_pids("Broker")[0]
        consumer_pids = {m: ray.get(c.pid.remote()) for m, c in consumers.items()}
        mine = GcTimer()
        for rnd in range(args.rounds + 1):
            echo_ms = echo.latency(body, args.rate, min(1.0, args.seconds))
            relay_ms = relay.latency(body, args.rate, args.seconds)
            relay_cpu = relay.cpu_per_message_us
            relay_wait = relay.run_wait_per_message_us
            print(
                f"round {rnd}{' (warm-up)' if rnd == 0 else ''}: tcp echo p50"
                f" {peers.percentile(echo_ms, 0.5):.2f} ms; py-relay (the same three processes,"
                f" sockets alone): p50 {peers.percentile(relay_ms, 0.5):.2f} ms p99"
                f" {peers.percentile(relay_ms, 0.99):.2f} ms, CPU us/msg"
                f" {', '.join(f'{k} {v:.0f}' for k, v in relay_cpu.items())}, waiting for a"
                f" core us/msg {', '.join(f'{k} {v:.0f}' for k, v in relay_wait.items())}",
                flush=True,
            )
            if rnd:
                rows.setdefault("py-relay latency p50 (ms)", []).append(
                    peers.percentile(relay_ms, 0.5)
                )
                rows.setdefault("py-relay latency p99 (ms)", []).append(
                    peers.percentile(relay_ms, 0.99)
                )
                rows.setdefault("py-relay, all three, CPU per message (us)", []).append(
                    sum(relay_cpu.values())
                )
                rows.setdefault(
                    "py-relay, all three, waiting for a core per message (us)", []
                ).append(sum(relay_wait.values()))
                rows.setdefault("tcp echo p50 (ms)", []).append(peers.percentile(echo_ms, 0.5))
            order = list(topics) if rnd % 2 else list(reversed(topics))
            for mode in order:
                pids = {
                    "broker": broker_pid,
                    "producer": os.getpid(),
                    "consumer": consumer_pids[mode],
                }
                profile = (
                    os.path.join(args.profile, mode) if args.profile and rnd == args.rounds else ""
                )
                got = _phase(
                    args, producer, consumers[mode], topics[mode], body, pids, mine, profile
                )
                print(f"  {mode:<6}: {got.pop('line')}", flush=True)
                if rnd:
                    for name, value in got.items():
                        rows.setdefault(f"{mode}: {name}", []).append(value)
        producer.close()
    finally:
        for consumer in consumers.values():
            ray.get(consumer.close.remote())
            ray.kill(consumer)
        echo.stop()
        relay.stop()
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nmedians of {args.rounds} rounds at {args.rate} msg/s")
    for name, values in rows.items():
        print(f"  {name:<48}{statistics.median(values):>10.2f}")

    def med(name: str) -> float:
        return statistics.median(rows[name])

    floor = med("tcp echo p50 (ms)")
    relay_p50 = med("py-relay latency p50 (ms)")
    relay_cpu = med("py-relay, all three, CPU per message (us)")
    for mode in topics:
        latency = med(f"{mode}: latency p50 (ms)")
        cpu = med(f"{mode}: all three, CPU per message (us)")
        busy = cpu * args.rate / 1e6
        print(
            f"  {mode}: latency p50 / tcp echo p50 {latency / floor:.1f}x, / py-relay p50"
            f" {latency / relay_p50:.1f}x; CPU per message / py-relay's {cpu / relay_cpu:.1f}x;"
            f" cores kept busy by the three processes {busy:.2f} of {os.cpu_count()}"
        )
    for name in (
        "latency p50 (ms)",
        "latency p99 (ms)",
        "consumer CPU per message (us)",
        "broker CPU per message (us)",
        "all three, CPU per message (us)",
    ):
        print(f"  stream / pull, {name}: {med(f'stream: {name}') / med(f'pull: {name}'):.2f}")
    return 0


def _phase(
    args: argparse.Namespace,
    producer: Any,
    consumer: Any,
    topic: str,
    body: bytes,
    pids: dict[str, int],
    mine: GcTimer,
    profile: str,
) -> dict[str, Any]:
    """One consumer's latency phase: its figures, and the line that prints them."""
    ray.get(consumer.gc_pauses.remote())
    mine.take()
    spies = _spy(pids, args, profile) if profile else []
    before = {k: cpu_s(p) for k, p in pids.items()}
    waited = {k: run_wait_s(p) for k, p in pids.items()}
    sends = peers.Settled()
    peers.paced(
        args.rate,
        args.seconds,
        lambda i, out=sends: out.track(producer.send_async(Message(topic, peers.stamp(body)))),
    )
    sends.wait()
    if sends.errors:
        raise sends.errors[0]
    n = sends.sent
    lat: list[float] = ray.get(consumer.take_when.remote(n, 30.0))
    after = {k: cpu_s(p) for k, p in pids.items()}
    wait = {k: 1e6 * (run_wait_s(p) - waited[k]) / n for k, p in pids.items()}
    for spy in spies:
        spy.wait()
    per = {k: tuple(1e6 * (a - b) / n for a, b in zip(after[k], before[k])) for k in pids}
    full_p, long_p = mine.take()
    full_c, long_c = ray.get(consumer.gc_pauses.remote())
    got: dict[str, Any] = {
        "line": (
            f"latency p50 {peers.percentile(lat, 0.5):.2f} ms p99"
            f" {peers.percentile(lat, 0.99):.2f} ms p99.9 {peers.percentile(lat, 0.999):.2f} ms;"
            " CPU us/msg user+sys: "
            + ", ".join(f"{k} {u:.0f}+{s:.0f}" for k, (u, s) in per.items())
            + "; waiting for a core us/msg: "
            + ", ".join(f"{k} {w:.0f}" for k, w in wait.items())
            + f"; full GCs: producer {full_p} (longest {long_p:.1f} ms),"
            f" consumer {full_c} (longest {long_c:.1f} ms)"
        ),
        "latency p50 (ms)": peers.percentile(lat, 0.5),
        "latency p99 (ms)": peers.percentile(lat, 0.99),
        "latency p99.9 (ms)": peers.percentile(lat, 0.999),
    }
    for k, (u, s) in per.items():
        got[f"{k} CPU per message (us)"] = u + s
    got["all three, CPU per message (us)"] = sum(u + s for u, s in per.values())
    got["all three, waiting for a core per message (us)"] = sum(wait.values())
    return got


if __name__ == "__main__":
    raise SystemExit(main())
