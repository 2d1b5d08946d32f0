"""Exactly once from topic to topic: a billing service that crashes mid-transaction.

Starts a private local Ray instance with one NameServer and one broker (its store in
a temporary directory) and sends 1 000 orders to ``Orders``. A billing service then
runs as a Ray task (a process of its own): it pulls orders, and for each batch writes
one invoice per order to ``Invoices`` and moves its consumer group's offset in one
transaction (``TransactionalProducer``; the offset goes with ``send_offsets``, Kafka's
``sendOffsetsToTransaction``). Each run but the last exits at a random point, in the
middle of a transaction; the next run takes the same ``transactional_id`` over (the
crashed instance is fenced and what it left open is aborted) and goes on from the
group's committed offset. At the end every order has exactly one invoice, and the
script exits 0.

    python examples/exactly_once.py [--orders N] [--crashes K] [--seed S]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
from collections import Counter
from typing import Any

import ray

import actors
from actors import PullConsumer, PullStatus, TransactionalProducer
from storage import Message

ORDERS, INVOICES = "Orders", "Invoices"
GROUP = "billing"  # the consumer group whose offsets move with the invoices
TRANSACTIONAL_ID = "billing-1"  # one per service instance slot: a restart reuses it


def feed(cluster: actors.Cluster, orders: int) -> None:
    """``orders`` orders, keyed by their id, spread over ``Orders``' queues."""
    producer = cluster.producer("shop")
    try:
        for first in range(0, orders, 500):
            producer.send_batch(
                [
                    Message(ORDERS, b"order-%d" % i, keys=[f"order-{i}"])
                    for i in range(first, min(first + 500, orders))
                ]
            )
    finally:
        producer.close()


def billing(namespace: str, log_dir: str, crash_after: int | None, seed: int) -> int:
    """One run of the service (a Ray task): invoices for what its group has not
    committed yet, a transaction per pulled batch. ``crash_after``: the process exits
    after that many transactions, with one more sent and not committed (no abort, no
    close: a SIGKILL's leftovers). Returns how many orders this run billed."""
    rng = random.Random(seed)
    producer = TransactionalProducer(
        "billing", transactional_id=TRANSACTIONAL_ID, namespace=namespace,
        coordinator_log_dir=log_dir,
    )  # fmt: skip
    consumer = PullConsumer(GROUP, namespace=namespace)
    billed = committed = 0
    for mq in consumer.fetch_subscribe_queues(ORDERS):
        offset = max(0, consumer.fetch_offset(mq))  # where the last committed run stopped
        while True:
            got = consumer.pull(mq, offset, rng.randint(1, 64))
            if got.status is not PullStatus.FOUND:
                break
            txn = producer.begin()
            txn.send([Message(INVOICES, b"invoice-for-" + m.body) for m in got.messages])
            txn.send_offsets(GROUP, {mq: got.next_offset})
            if crash_after is not None and committed >= crash_after:
                txn.flush()  # the invoices are stored, as half messages, and then:
                os._exit(1)
            txn.commit()  # invoices visible and the offset moved, together
            committed += 1
            billed += len(got.messages)
            offset = got.next_offset
    producer.close()
    consumer.close()
    return billed


def invoices(cluster: actors.Cluster) -> Counter[bytes]:
    """Every invoice in ``Invoices``, counted."""
    consumer = cluster.pull_consumer("auditor")
    seen: Counter[bytes] = Counter()
    for mq in consumer.fetch_subscribe_queues(INVOICES):
        offset = 0
        while (got := consumer.pull(mq, offset, 1000)).status is PullStatus.FOUND:
            seen.update(m.body for m in got.messages)
            offset = got.next_offset
    consumer.close()
    return seen


def run(
    cluster: actors.Cluster, orders: int, crashes: int, seed: int, log_dir: str
) -> dict[str, Any]:
    """Feed the orders, run the service ``crashes`` times with a crash, then once to
    the end; returns what each run billed and the invoices found."""
    cluster.admin.create_topic(ORDERS, 4, 4)
    cluster.admin.create_topic(INVOICES, 4, 4)
    feed(cluster, orders)
    task = ray.remote(max_retries=0, num_cpus=0)(billing)
    rng = random.Random(seed)
    runs = []
    for i in range(crashes):
        crash_after = rng.randint(0, 8)
        try:
            ray.get(task.remote(cluster.namespace, log_dir, crash_after, seed + i), timeout=120)
            runs.append(f"run {i + 1}: finished before its crash point")
        except ray.exceptions.WorkerCrashedError:  # its process exited mid-transaction
            runs.append(f"run {i + 1}: crashed after {crash_after} committed transactions")
    last = ray.get(task.remote(cluster.namespace, log_dir, None, seed + crashes), timeout=120)
    runs.append(f"run {crashes + 1}: billed the last {last} orders")
    return {"runs": runs, "invoices": invoices(cluster)}


def check(found: Counter[bytes], orders: int) -> list[str]:
    expected = {b"invoice-for-order-%d" % i for i in range(orders)}
    problems = []
    if set(found) != expected:
        missing = len(expected - set(found))
        problems.append(f"{missing} orders have no invoice, {len(set(found) - expected)} strays")
    twice = [body for body, n in found.items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} orders were billed more than once, e.g. {twice[0]!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--crashes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="raymq-exactly-once-") as root:
        cluster = actors.start_cluster(
            namespace="raymq-exactly-once", nameservers=1, brokers=1, store_root=root
        )
        try:
            result = run(cluster, args.orders, args.crashes, args.seed, f"{root}/txn-log")
        finally:
            cluster.shutdown()
            ray.shutdown()
    for line in result["runs"]:
        print(line)
    problems = check(result["invoices"], args.orders)
    for p in problems:
        print(f"PROBLEM: {p}")
    if not problems:
        print(f"every one of {args.orders} orders has exactly one invoice")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
