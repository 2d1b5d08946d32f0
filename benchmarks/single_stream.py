"""What a stream of single ``send_async(message)`` calls costs the producer.

    python benchmarks/single_stream.py [--seconds 2] [--rounds 3] [--size 100]

One broker (ASYNC_FLUSH) on this machine's local Ray, a topic of 16 queues. In
each round, alternating, the driver streams for ``--seconds``:

* ``single``: ``Producer.send_async(Message)`` one message a call, as fast as the
  producer takes them (its ``async_send_max_messages`` paces it), each future
  counted as it settles and not kept (as ``peers.py``'s one-per-call row);
* ``list100``: the baseline, ``send_async`` of lists of 100 messages, the same
  producer and broker: what the machine does when the per-call cost is shared.

For each it prints acknowledged msg/s and the CPU this process spent per message
(all its threads), medians of the rounds, and ``single``'s ratio to the baseline.
To compare two trees, run it alternately with ``PYTHONPATH=<tree>``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _local import start_local_ray, total_cpu_s  # noqa: E402
from peers import Settled  # noqa: E402

import actors  # noqa: E402
from storage import Message  # noqa: E402

TOPIC = "SingleStream"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--only-single", action="store_true", help="no baseline row")
    parser.add_argument(
        "--no-idempotence", action="store_true", help="a producer without idempotent numbering"
    )
    args = parser.parse_args()
    start_local_ray()
    root = tempfile.mkdtemp(prefix="raymq-single-")
    cluster = actors.start_cluster(
        namespace=f"raymq-single-{os.getpid()}",
        nameservers=1,
        brokers=1,
        store_root=root,
        topics=[actors.TopicConfig(TOPIC, 16, 16)],
        broker_options={
            "store": {"flush_disk_type": "ASYNC_FLUSH", "commitlog_file_size": 256 << 20}
        },
    )
    body = b"x" * args.size
    rows: dict[str, list[tuple[float, float]]] = {"single": []}
    if not args.only_single:
        rows["list100"] = []
    try:
        producer = cluster.producer("single", enable_idempotence=not args.no_idempotence)
        for _ in range(100):  # routes, the connection, the producer id
            producer.send(Message(TOPIC, body))
        batch = [Message(TOPIC, body) for _ in range(100)]

        def single(sends: Settled) -> int:
            sends.track(producer.send_async(Message(TOPIC, body)))
            return 1

        def list100(sends: Settled) -> int:
            sends.track(producer.send_async(batch))
            return len(batch)

        runs: dict[str, Callable[[Settled], int]] = {"single": single, "list100": list100}
        me = os.getpid()
        for rnd in range(args.rounds + 1):
            for name in rows:
                fn = runs[name]
                sends = Settled()
                count = 0
                cpu0, t0 = total_cpu_s(me), time.perf_counter()
                stop = time.monotonic() + args.seconds
                while time.monotonic() < stop:
                    count += fn(sends)
                sends.wait(120.0)
                if sends.failed:
                    raise RuntimeError(f"{sends.failed} sends failed: {sends.errors}")
                elapsed = time.perf_counter() - t0
                cpu = total_cpu_s(me) - cpu0
                if rnd:  # round 0 warms up
                    rows[name].append((count / elapsed, 1e6 * cpu / count))
            if rnd:
                print(f"round {rnd}: " + _line(rows, -1), flush=True)
        producer.close()
    finally:
        cluster.shutdown()
        import ray

        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nmedians of {args.rounds} rounds, {args.size} B, {args.seconds:g} s each")
    print(f"  {'row':<10}{'msg/s':>10}{'CPU us/msg':>12}")
    med: dict[str, tuple[float, float]] = {}
    for name, got in rows.items():
        rate = statistics.median(r for r, _ in got)
        cpu = statistics.median(c for _, c in got)
        med[name] = (rate, cpu)
        print(f"  {name:<10}{rate:>10.0f}{cpu:>12.1f}")
    if "list100" in med:
        print(f"  single / list100 msg/s: {med['single'][0] / med['list100'][0]:.3f}")
    return 0


def _line(rows: dict[str, list[tuple[float, float]]], at: int) -> str:
    out: list[Any] = []
    for name, got in rows.items():
        rate, cpu = got[at]
        out.append(f"{name} {rate:.0f} msg/s {cpu:.1f} us/msg")
    return ", ".join(out)


if __name__ == "__main__":
    sys.exit(main())
