"""Where the ``raymq-grpc`` peer's time goes: its latency phase alone, measured.

    PYTHONPATH=$PWD flock /tmp/raymq-ray.lock python benchmarks/grpc_peer_profile.py \
        [--rate 300] [--seconds 3] [--py-spy /tmp/grpc-profile]

Starts ``benchmarks/peers.py``'s ``RayMQGrpcPeer`` (one broker, the official Python
client), warms the store with a produce and a consume phase, then runs the peer's
latency phase (``--rate`` messages a second for ``--seconds``, the official Producer's
``send_async`` in this process, its SimpleConsumer in a thread) on a fresh topic, and
prints: the produce-to-receive latency, the CPU per message of this process (client:
send, receive, ack) and of the broker's process (from ``/proc``), and how many gRPC calls
the broker served per message (``grpc_endpoint()["stats"]["calls"]``). With
``--py-spy DIR`` (py-spy installed) the broker's Python stacks are sampled at 200 Hz
during the phase into ``DIR/broker-<pid>.txt`` (collapsed stacks). docs/rocketmq5.md
reads its figures. Not a test.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import peers  # noqa: E402 - the benchmark next to this one


def _proc_cpu_s(pid: str) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _broker_pids() -> list[str]:
    found = subprocess.run(["pgrep", "-f", "ray::Broker"], capture_output=True, text=True)
    return found.stdout.split()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--py-spy", dest="py_spy", default="")
    args = ap.parse_args()

    peer = peers.RayMQGrpcPeer()
    peer.start()
    try:
        peer.produce(os.urandom(100), 1, 2.0)  # a warm store, as the full run's phases
        peer.consume(10**9, 4.0)
        peer.reset()  # a fresh topic: the latency consumer reads only stamped messages
        pids = _broker_pids()
        spies: list[Any] = []
        if args.py_spy:
            Path(args.py_spy).mkdir(parents=True, exist_ok=True)
            spies = [
                subprocess.Popen(
                    [
                        "py-spy", "record", "-p", pid, "-r", "200", "--nonblocking",
                        "-d", str(int(args.seconds) + 2), "-f", "raw",
                        "-o", f"{args.py_spy}/broker-{pid}.txt",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for pid in pids
            ]  # fmt: skip

        def calls() -> int:
            return sum(e["stats"]["calls"] for e in peer.cluster.grpc_endpoints().values())

        n = args.rate * args.seconds
        calls0, broker0, client0 = calls(), {p: _proc_cpu_s(p) for p in pids}, os.times()
        started = time.perf_counter()
        samples = peer.latency(os.urandom(100), args.rate, args.seconds)
        wall = time.perf_counter() - started
        client1, broker1, calls1 = os.times(), {p: _proc_cpu_s(p) for p in pids}, calls()
        for spy in spies:
            spy.wait()
        client_cpu = client1.user - client0.user + client1.system - client0.system
        print(
            f"{args.rate}/s for {args.seconds}s: {len(samples)} received in {wall:.1f}s, "
            f"p50 {peers.percentile(samples, 0.5):.1f} ms, "
            f"p99 {peers.percentile(samples, 0.99):.1f} ms"
        )
        print(f"client process CPU {client_cpu / n * 1e6:.0f} us per message")
        for pid in pids:
            print(f"broker {pid} CPU {(broker1[pid] - broker0[pid]) / n * 1e6:.0f} us per message")
        print(f"gRPC calls served per message {(calls1 - calls0) / n:.2f}")
    finally:
        peer.stop()


if __name__ == "__main__":
    main()
