"""Where produce -> consume latency goes at a fixed rate: CPU per message in each
process, and the garbage collector's pauses in the two client processes, beside the
latency and beside a TCP echo round trip paced the same way in the same run.

    python benchmarks/latency_split.py [--rounds 3] [--rate 1000] [--seconds 3]

One broker (ASYNC_FLUSH); single ``send_async`` messages of 100 B from this process
at ``--rate``, to a long-polling PushConsumer in its own process (an actor, as
``peers.py`` measures RayMQ's latency). For each round it prints the latency
(p50/p99), the CPU each process spent per message (user and system, all its
threads, read from ``/proc/<pid>/stat``: broker, producer, consumer), and the full
(generation 2) collections in the producer's and the consumer's processes with their
longest pause. Beside them, each round runs the ``py-relay`` floor of ``peers.py``:
the same three processes (this one, an actor relaying over TCP, a reading actor)
with nothing but asyncio sockets, its latency and its CPU per message. A first
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
import time
from typing import Any

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (the PushConsumer latency actor, the pacing, the TCP echo)
from _local import actor_pids, cpu_s, start_local_ray  # noqa: E402

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
    """The PushConsumer actor of ``peers.py``, telling its pid and its collections."""

    def __init__(self, namespace: str, topic: str, data_path: str) -> None:
        self.gc_timer = GcTimer()
        super().__init__(namespace, topic, data_path)

    def pid(self) -> int:
        return os.getpid()

    def gc_pauses(self) -> tuple[int, float]:
        return self.gc_timer.take()


def _spy(pids: dict[str, int], args: argparse.Namespace) -> list[subprocess.Popen[bytes]]:
    """``py-spy record`` of each process for the round's length (raw stacks, active
    threads only: where the CPU goes), written to ``args.profile``."""
    os.makedirs(args.profile, exist_ok=True)
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
                "--format",
                "raw",
                "--nonblocking",
                "--output",
                os.path.join(args.profile, f"{name}.txt"),
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
        help="py-spy each process through the last round: DIR/<process>.txt (raw stacks)",
    )
    args = parser.parse_args()
    if args.profile and shutil.which("py-spy") is None:
        parser.error("--profile needs py-spy (pip install py-spy)")
    start_local_ray()
    root = tempfile.mkdtemp(prefix="raymq-split-")
    namespace = "raymq-split"
    cluster = actors.start_cluster(
        namespace=namespace,
        nameservers=1,
        brokers=1,
        store_root=root,
        topics=[actors.TopicConfig("Split", 4, 4)],
        broker_options={"store": {"flush_disk_type": "ASYNC_FLUSH"}},
    )
    echo = peers.RawLimit("tcp-echo")
    relay = peers.RawLimit("py-relay")
    consumer: Any = None
    try:
        echo.start()
        relay.start()
        consumer = ray.remote(num_cpus=0)(_Consumer).remote(namespace, "Split", "socket")
        producer = cluster.producer("split")
        body = b"x" * 100
        peers.warm_up(producer, consumer, "Split", body)
        pids = {
            "broker": actor_pids("Broker")[0],
            "producer": os.getpid(),
            "consumer": ray.get(consumer.pid.remote()),
        }
        mine = GcTimer()
        rows: dict[str, list[float]] = {}
        for rnd in range(args.rounds + 1):
            echo_ms = echo.latency(body, args.rate, min(1.0, args.seconds))
            relay_ms = relay.latency(body, args.rate, args.seconds)
            ray.get(consumer.gc_pauses.remote())
            mine.take()
            spies = _spy(pids, args) if args.profile and rnd == args.rounds else []
            before = {k: cpu_s(p) for k, p in pids.items()}
            sends = peers.Settled()
            peers.paced(
                args.rate,
                args.seconds,
                lambda i, out=sends: out.track(
                    producer.send_async(Message("Split", peers.stamp(body)))
                ),
            )
            sends.wait()
            if sends.errors:
                raise sends.errors[0]
            n = sends.sent
            lat: list[float] = ray.get(consumer.take_when.remote(n, 30.0))
            after = {k: cpu_s(p) for k, p in pids.items()}
            for spy in spies:
                spy.wait()
            per = {k: tuple(1e6 * (a - b) / n for a, b in zip(after[k], before[k])) for k in pids}
            full_p, long_p = mine.take()
            full_c, long_c = ray.get(consumer.gc_pauses.remote())
            line = (
                f"latency p50 {peers.percentile(lat, 0.5):.2f} ms p99 {peers.percentile(lat, 0.99):.2f} ms"
                f" (tcp echo p50 {peers.percentile(echo_ms, 0.5):.2f} ms); CPU us/msg user+sys: "
                + ", ".join(f"{k} {u:.0f}+{s:.0f}" for k, (u, s) in per.items())
                + f"; full GCs: producer {full_p} (longest {long_p:.1f} ms),"
                f" consumer {full_c} (longest {long_c:.1f} ms)"
            )
            relay_cpu = relay.cpu_per_message_us
            line += (
                f"; py-relay (the same three processes, sockets alone): p50"
                f" {peers.percentile(relay_ms, 0.5):.2f} ms p99 {peers.percentile(relay_ms, 0.99):.2f}"
                f" ms, CPU us/msg {', '.join(f'{k} {v:.0f}' for k, v in relay_cpu.items())}"
            )
            print(f"round {rnd}{' (warm-up)' if rnd == 0 else ''}: {line}", flush=True)
            if rnd == 0:
                continue
            rows.setdefault("py-relay latency p50 (ms)", []).append(peers.percentile(relay_ms, 0.5))
            rows.setdefault("py-relay latency p99 (ms)", []).append(
                peers.percentile(relay_ms, 0.99)
            )
            rows.setdefault("py-relay, all three, CPU per message (us)", []).append(
                sum(relay_cpu.values())
            )
            rows.setdefault("latency p50 (ms)", []).append(peers.percentile(lat, 0.5))
            rows.setdefault("latency p99 (ms)", []).append(peers.percentile(lat, 0.99))
            rows.setdefault("tcp echo p50 (ms)", []).append(peers.percentile(echo_ms, 0.5))
            for k, (u, s) in per.items():
                rows.setdefault(f"{k} CPU per message (us)", []).append(u + s)
            rows.setdefault("all three, CPU per message (us)", []).append(
                sum(u + s for u, s in per.values())
            )
        producer.close()
    finally:
        if consumer is not None:
            ray.get(consumer.close.remote())
            ray.kill(consumer)
        echo.stop()
        relay.stop()
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nmedians of {args.rounds} rounds at {args.rate} msg/s")
    for name, values in rows.items():
        print(f"  {name:<40}{statistics.median(values):>10.2f}")
    latency = statistics.median(rows["latency p50 (ms)"])
    floor = statistics.median(rows["tcp echo p50 (ms)"])
    busy = statistics.median(rows["all three, CPU per message (us)"]) * args.rate / 1e6
    print(f"  latency p50 / tcp echo p50: {latency / floor:.1f}x")
    relay_p50 = statistics.median(rows["py-relay latency p50 (ms)"])
    relay_cpu = statistics.median(rows["py-relay, all three, CPU per message (us)"])
    cpu = statistics.median(rows["all three, CPU per message (us)"])
    print(f"  latency p50 / py-relay p50: {latency / relay_p50:.1f}x")
    print(f"  CPU per message / py-relay's: {cpu / relay_cpu:.1f}x")
    print(f"  cores kept busy by the three processes: {busy:.2f} of {os.cpu_count()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
