"""RayMQ quickstart: a local cluster, 100 000 messages out and back.

Starts a private local Ray instance, 2 NameServers and 2 brokers (stores in a
temporary directory), one topic of 8 queues (4 on each broker); sends 100 000
messages in batches, pulls them all back, checks that every message arrived
exactly once and in order within its queue, prints a summary and exits 0.

    python examples/quickstart.py [--messages N]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time

import ray

import actors
from actors import PullStatus
from storage import Message

TOPIC = "QuickStart"


def produce(cluster: actors.Cluster, n: int, batch: int) -> float:
    producer = cluster.producer("quickstart-producer", max_batch_messages=1024)
    started = time.perf_counter()
    for first in range(0, n, batch):
        msgs = [
            Message(TOPIC, b"message-%08d" % i, tags="TagA" if i % 2 else "TagB")
            for i in range(first, min(first + batch, n))
        ]
        producer.send_batch(msgs)
    return time.perf_counter() - started


def consume(cluster: actors.Cluster, n: int) -> tuple[float, dict[str, list[int]]]:
    """Pull every queue from offset 0 to its end; return the sequence numbers per queue."""
    consumer = cluster.pull_consumer("quickstart-consumer")
    queues = consumer.fetch_subscribe_queues(TOPIC)
    offsets = dict.fromkeys(queues, 0)
    seen: dict[str, list[int]] = {f"{q.broker_name}:{q.queue_id}": [] for q in queues}
    started = time.perf_counter()
    while offsets:
        for result in consumer.pull_many(list(offsets.items()), 4096):
            if result.status is not PullStatus.FOUND:
                del offsets[result.queue]
                continue
            seen[f"{result.queue.broker_name}:{result.queue.queue_id}"].extend(
                int(m.body[8:]) for m in result.messages
            )
            offsets[result.queue] = result.next_offset
    consumer.commit_offsets({q: consumer.max_offset(q) for q in queues})
    return time.perf_counter() - started, seen


def check(seen: dict[str, list[int]], n: int) -> list[str]:
    problems = []
    everything = [s for seqs in seen.values() for s in seqs]
    if sorted(everything) != list(range(n)):
        problems.append(
            f"got {len(everything)} messages ({len(set(everything))} distinct), "
            f"expected {n} distinct"
        )
    for queue, seqs in seen.items():
        if seqs != sorted(seqs):
            problems.append(f"queue {queue} is out of order")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=10_000, help="messages per send_batch call")
    parser.add_argument(
        "--address",
        default="local",
        help="Ray to use: 'local' starts one for this run (default); 'auto' joins the running "
        "cluster (e.g. on a `ray up cluster.yaml` head)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    t0 = time.perf_counter()
    local = args.address == "local"
    ray.init(
        address=args.address,
        num_cpus=2 if local else None,
        include_dashboard=False if local else None,
        logging_level="WARNING",
        log_to_driver=False,
    )
    with tempfile.TemporaryDirectory(prefix="raymq-quickstart-") as store_root:
        cluster = actors.start_cluster(
            namespace="raymq-quickstart",
            nameservers=2,
            brokers=2,
            store_root=store_root,
            topics=[actors.TopicConfig(TOPIC, read_queue_nums=4, write_queue_nums=4)],
            broker_options={
                "store": {
                    "commitlog_file_size": 64 << 20,
                    "index_hash_slots": 500_000,
                    "index_max_entries": 2_000_000,
                }
            },
        )
        started_in = time.perf_counter() - t0
        try:
            send_s = produce(cluster, args.messages, args.batch)
            pull_s, seen = consume(cluster, args.messages)
            status = cluster.admin.topic_status(TOPIC)
        finally:
            cluster.shutdown()
    ray.shutdown()

    problems = check(seen, args.messages)
    n = args.messages
    print(f"RayMQ quickstart: Ray + 2 NameServers + 2 brokers up in {started_in:.1f}s")
    print(f"  sent     {n:>9,} messages in {send_s:6.2f}s  ({n / send_s:>10,.0f} msg/s)")
    print(
        f"  consumed {sum(map(len, seen.values())):>9,} messages in {pull_s:6.2f}s  "
        f"({n / pull_s:>10,.0f} msg/s)"
    )
    print(
        "  per queue: "
        + ", ".join(f"{r['broker']}:{r['queue_id']}={r['max_offset']}" for r in status)
    )
    if problems:
        print("FAILED: " + "; ".join(problems))
        return 1
    print("  every message arrived exactly once, in order within its queue")
    return 0


if __name__ == "__main__":
    sys.exit(main())
