"""The client's thread hand-overs, each way in one run: what writing frames from the
caller's thread, handing small pull answers straight to the consume threads and sending
the next pull from the thread that got the answer buy.

    python benchmarks/hops_ab.py [--rounds 3] [--sends 3000] [--rate 1000] [--seconds 3]
                                 [--push-switch issue|answers]

Three switches (read by each client process at start; see ``actors/protocol/connection.py``
and ``actors/client/push/pull_service.py``):

* ``RAYMQ_CLIENT_DIRECT_WRITES``: a caller writes its own frame to the socket (1) or
  hands it to the client I/O loop (0). Measured as back-to-back sync sends of 100 B in a
  Ray task with the switch in its environment: round trip p50/p99 and the task process's
  CPU per send (every thread of it).
* ``RAYMQ_PUSH_INLINE_ANSWERS``: a PushConsumer's small pull answer is handed to the
  consume threads by the I/O thread (1) or by the pull thread (0). Measured as
  produce -> listener latency of single ``send_async`` messages at ``--rate`` through a
  PushConsumer in its own process (an actor with the switch in its environment), as
  ``peers.py`` measures RayMQ's latency (``--push-switch answers``).
* ``RAYMQ_PUSH_ISSUE_INLINE``: the pulls a small answer makes due leave from the I/O
  thread that got it (1) or from the pull thread, woken by an event (0). Measured as the
  one before (``--push-switch issue``, the default).

Both ways alternate round by round on one broker (ASYNC_FLUSH); the first round is a
warm-up (a fresh broker's store faults its CommitLog in the background for its first
seconds) and is not reported. Figures are medians over the rounds, with the ratio
on/off: on a shared machine read a ratio, not an absolute.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (the PushConsumer latency actor and the pacing of peers.py)
from _local import start_local_ray  # noqa: E402

import actors  # noqa: E402
from storage import Message  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _env(name: str, on: bool) -> dict[str, Any]:
    path = os.pathsep.join([HERE, ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {"env_vars": {name: "1" if on else "0", "PYTHONPATH": path}}


@ray.remote(num_cpus=0)
def _sync_sends(namespace: str, topic: str, n: int) -> tuple[list[float], float]:
    """``n`` back-to-back sync sends after a warm-up: round trips (s), CPU per send (s)."""
    producer = actors.connect(namespace).producer(f"hops-{os.getpid()}")
    body = b"x" * 100
    for _ in range(300):  # routes, the connection
        producer.send(Message(topic, body))
    rtts = []
    cpu = time.process_time()
    for _ in range(n):
        t = time.perf_counter()
        producer.send(Message(topic, body))
        rtts.append(time.perf_counter() - t)
    cpu = (time.process_time() - cpu) / n
    producer.close()
    return rtts, cpu


PUSH_SWITCHES = {
    "answers": ("RAYMQ_PUSH_INLINE_ANSWERS", "inline answers"),
    "issue": ("RAYMQ_PUSH_ISSUE_INLINE", "next pull from the I/O thread"),
}


def _push_latency(
    cluster: actors.Cluster, topic: str, switch: str, on: bool, rate: int, seconds: float
) -> list[float]:
    cluster.admin.create_topic(topic, 4, 4)
    consumer = (
        ray.remote(num_cpus=0)(peers._RayMQPushLatency)
        .options(runtime_env=_env(switch, on))
        .remote(cluster.namespace, topic, "socket")
    )
    producer = cluster.producer("hops-latency")
    body = b"x" * 100
    peers.warm_up(producer, consumer, topic, body)
    sends = peers.Settled()
    peers.paced(
        rate, seconds, lambda i: sends.track(producer.send_async(Message(topic, peers.stamp(body))))
    )
    sends.wait()
    if sends.errors:
        raise sends.errors[0]
    samples: list[float] = ray.get(consumer.take_when.remote(sends.sent, 30.0))
    ray.get(consumer.close.remote())
    ray.kill(consumer)
    producer.close()
    return samples


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=3, help="reported rounds (a warm-up comes first)"
    )
    parser.add_argument("--sends", type=int, default=3000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--push-switch",
        choices=sorted(PUSH_SWITCHES),
        default="issue",
        help="the PushConsumer switch the latency rounds compare",
    )
    args = parser.parse_args()
    switch, label = PUSH_SWITCHES[args.push_switch]
    start_local_ray()
    root = tempfile.mkdtemp(prefix="raymq-hops-")
    cluster = actors.start_cluster(
        namespace="raymq-hops",
        nameservers=1,
        brokers=1,
        store_root=root,
        topics=[actors.TopicConfig("HopsSync", 1, 1)],
        broker_options={"store": {"flush_disk_type": "ASYNC_FLUSH"}},
    )
    rows: dict[str, dict[bool, list[float]]] = {}

    def add(name: str, on: bool, value: float) -> None:
        rows.setdefault(name, {True: [], False: []})[on].append(value)

    try:
        for rnd in range(args.rounds + 1):
            for on in (False, True) if rnd % 2 else (True, False):
                task = _sync_sends.options(runtime_env=_env("RAYMQ_CLIENT_DIRECT_WRITES", on))
                rtts, cpu = ray.get(task.remote(cluster.namespace, "HopsSync", args.sends))
                lat = _push_latency(
                    cluster, f"Hops{rnd}{int(on)}", switch, on, args.rate, args.seconds
                )
                print(
                    f"round {rnd}{' (warm-up)' if rnd == 0 else ''} {'on ' if on else 'off'}: "
                    f"sync send p50 {1e3 * _pct(rtts, 0.5):.3f} ms p99 {1e3 * _pct(rtts, 0.99):.3f} ms "
                    f"CPU {1e6 * cpu:.0f} us; push latency p50 {_pct(lat, 0.5):.2f} ms "
                    f"p99 {_pct(lat, 0.99):.2f} ms",
                    flush=True,
                )
                if rnd == 0:
                    continue
                add("sync send p50 (ms), direct writes", on, 1e3 * _pct(rtts, 0.5))
                add("sync send p99 (ms), direct writes", on, 1e3 * _pct(rtts, 0.99))
                add("client CPU per sync send (us), direct writes", on, 1e6 * cpu)
                add(f"push latency p50 (ms), {label}", on, _pct(lat, 0.5))
                add(f"push latency p99 (ms), {label}", on, _pct(lat, 0.99))
    finally:
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nmedians of {args.rounds} rounds{'':<40}off        on    on/off")
    for name, by in rows.items():
        off, on_ = statistics.median(by[False]), statistics.median(by[True])
        print(f"  {name:<56}{off:>9.2f}{on_:>10.2f}{on_ / off:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
