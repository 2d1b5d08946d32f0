"""RayMQ quickstart: a local cluster, 100 000 messages out and back.

Starts a private local Ray instance, 2 NameServers and 2 brokers (stores in a
temporary directory), one topic of 8 queues (4 on each broker); sends 100 000
messages in batches, pulls them all back, checks that every message arrived
exactly once and in order within its queue, prints a summary and exits 0.

With ``--console`` it then keeps the cluster up with its web console and prints its
URL: 20 orders sent with keys (find ``order-7`` on the Messages page), a consumer group
``quickstart-audit`` whose lag shows on its page, and one order its listener refused,
dead-lettered (resend it from the Dead letters page). Ctrl-C stops it all.

    python examples/quickstart.py [--messages N] [--console [--console-port P]]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import threading
import time
from typing import Any

import ray

import actors
from actors import ConsumeStatus, PullStatus, PushConsumer
from actors.config import ConsoleConfig
from actors.config.cluster import LOCAL_RAY_WORKER_NICENESS
from storage import Message
from storage.message import MessageExt

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


AUDIT_GROUP = "quickstart-audit"
ORDERS = 20
REFUSED = "order-13"  # the audit's listener refuses it: it ends in the group's DLQ


def show_console(cluster: actors.Cluster, port: int, hold_s: float | None) -> None:
    """Keyed orders, a consumer group that refuses one of them (dead-lettered at the
    first failure: ``max_reconsume_times=0``), and the console, until Ctrl-C or
    ``hold_s``."""
    seen = threading.Event()
    consumed: set[str] = set()

    def audit(msgs: list[MessageExt]) -> ConsumeStatus:
        keys = {k for m in msgs for k in m.keys}
        if REFUSED in keys:
            return ConsumeStatus.RECONSUME_LATER
        consumed.update(keys)
        if len(consumed) >= ORDERS - 1:
            seen.set()
        return ConsumeStatus.SUCCESS

    consumer = PushConsumer(
        AUDIT_GROUP,
        TOPIC,
        listener=audit,
        namespace=cluster.namespace,
        subscription="Order",  # tags: the job's own messages are filtered out by the broker
        consume_from="FIRST",  # a new group: from each queue's start, so no order is missed
        max_reconsume_times=0,
    )
    consumer.start()
    producer = cluster.producer("quickstart-orders")
    for i in range(ORDERS):
        producer.send(
            Message(
                TOPIC, b'{"order": %d, "amount": %d}' % (i, 10 * i), tags="Order", keys=f"order-{i}"
            )
        )
    producer.close()
    if not seen.wait(60):
        print("  (the audit group is still consuming; the console shows its progress)")
    url = cluster.start_console(ConsoleConfig(namespace=cluster.namespace, port=port))
    print(f"console: {url}")
    print("  Messages: find key order-7 in topic QuickStart")
    print(f"  Consumer groups: {AUDIT_GROUP}, its lag per queue")
    print(f"  Dead letters: group {AUDIT_GROUP} holds {REFUSED}; resend it from there")
    print("Ctrl-C to stop" if hold_s is None else f"(up for {hold_s:g}s)", flush=True)
    try:
        time.sleep(hold_s) if hold_s is not None else threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        consumer.shutdown()


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
    parser.add_argument(
        "--console",
        action="store_true",
        help="then keep the cluster up with its web console (prints its URL) until Ctrl-C",
    )
    parser.add_argument("--console-port", type=int, default=8280, help="0: any free port")
    parser.add_argument("--hold", type=float, default=None, help=argparse.SUPPRESS)  # tests
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    t0 = time.perf_counter()
    local = args.address == "local"
    # Ray's logger opens a start with how it connects and whether token authentication
    # is on: errors only, as the raymq command shows without --verbose
    logging.getLogger("ray").setLevel(logging.ERROR)
    ray.init(
        address=args.address,
        num_cpus=2 if local else None,
        include_dashboard=False if local else None,
        logging_level="ERROR",
        log_to_driver=False,
        # a Ray of its own: its workers at a server's priority, not Ray's nice 15
        _system_config={"worker_niceness": LOCAL_RAY_WORKER_NICENESS} if local else None,
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
            problems = check(seen, args.messages)
            report(args.messages, started_in, send_s, pull_s, seen, status, problems)
            if args.console and not problems:
                show_console(cluster, args.console_port, args.hold)
        finally:
            cluster.shutdown()
    ray.shutdown()
    return 1 if problems else 0


def report(
    n: int,
    started_in: float,
    send_s: float,
    pull_s: float,
    seen: dict[str, list[int]],
    status: list[dict[str, Any]],
    problems: list[str],
) -> None:
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
    else:
        print("  every message arrived exactly once, in order within its queue", flush=True)


if __name__ == "__main__":
    sys.exit(main())
