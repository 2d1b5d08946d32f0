"""A steady produce -> consume load to hold a profiler against: one broker (ASYNC_FLUSH),
single ``send_async`` messages of 100 B from this process at ``--rate`` to a
PushConsumer actor (``delivery``), for ``--seconds``, after a warm-up.

    python benchmarks/steady_load.py [--rate 1000] [--seconds 20] [--delivery stream]
        [--pids FILE] [--broker-option KEY=VALUE ...]

When the load starts it prints (and writes to ``--pids``) the pids of the broker,
this producer and the consumer, so a profiler can be attached for the run::

    perf record -g -p $(jq .broker pids.json) -- sleep 10
    strace -c -f -p <pid>

At the end it prints the latency (p50/p99/p99.9) and each process's CPU per message
(``/proc``). ``--broker-option cluster_lease_s=0`` sets a broker option (a number or
a word) for an A/B run of one setting. Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from typing import Any

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
from _local import actor_pids, cpu_s, start_local_ray  # noqa: E402
from latency_split import _Consumer  # noqa: E402

import actors  # noqa: E402
from storage import Message  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--delivery", choices=("stream", "pull"), default="stream")
    parser.add_argument("--pids", metavar="FILE", help="write the pids here as JSON")
    parser.add_argument(
        "--broker-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a BrokerConfig option for this run (repeatable)",
    )
    args = parser.parse_args()
    options: dict[str, Any] = {"store": {"flush_disk_type": "ASYNC_FLUSH"}}
    for item in args.broker_option:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--broker-option takes KEY=VALUE, got {item!r}")
        try:  # a number, true/false, a JSON object; anything else is a word
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    start_local_ray()
    root = tempfile.mkdtemp(prefix="raymq-steady-")
    namespace, topic = "raymq-steady", "Steady"
    cluster = actors.start_cluster(
        namespace=namespace,
        nameservers=1,
        brokers=1,
        store_root=root,
        topics=[actors.TopicConfig(topic, 4, 4)],
        broker_options=options,
    )
    consumer: Any = None
    try:
        producer = cluster.producer("steady")
        body = b"x" * 100
        consumer = ray.remote(num_cpus=0)(_Consumer).remote(namespace, topic, args.delivery)
        peers.warm_up(producer, consumer, topic, body)
        # a fresh CommitLog is faulted in over the first seconds: let that pass
        sends = peers.Settled()
        peers.paced(
            args.rate, 3.0, lambda i: sends.track(producer.send_async(Message(topic, body)))
        )
        sends.wait()
        ray.get(consumer.take_when.remote(sends.sent, 30.0))
        pids = {
            "broker": actor_pids("Broker")[0],
            "producer": os.getpid(),
            "consumer": ray.get(consumer.pid.remote()),
        }
        if args.pids:
            with open(args.pids, "w") as f:
                json.dump(pids, f)
        print(f"load: {json.dumps(pids)}", flush=True)
        before = {k: cpu_s(p) for k, p in pids.items()}
        sends = peers.Settled()
        peers.paced(
            args.rate,
            args.seconds,
            lambda i: sends.track(producer.send_async(Message(topic, peers.stamp(body)))),
        )
        sends.wait()
        lat: list[float] = ray.get(consumer.take_when.remote(sends.sent, 30.0))
        after = {k: cpu_s(p) for k, p in pids.items()}
        n = sends.sent
        print(
            f"latency p50 {peers.percentile(lat, 0.5):.2f} ms p99 {peers.percentile(lat, 0.99):.2f}"
            f" ms p99.9 {peers.percentile(lat, 0.999):.2f} ms; CPU us/msg user+sys: "
            + ", ".join(
                f"{k} {1e6 * (after[k][0] - before[k][0]) / n:.0f}"
                f"+{1e6 * (after[k][1] - before[k][1]) / n:.0f}"
                for k in pids
            ),
            flush=True,
        )
        producer.close()
    finally:
        if consumer is not None:
            ray.get(consumer.close.remote())
            ray.kill(consumer)
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
