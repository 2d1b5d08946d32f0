"""Resetting a group's offsets by time while its push consumers run, in both modes: the
consumers drop their offsets in memory and consume again from the reset point, and
nothing they commit from before the reset moves the group's offsets back."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from raymq_testkit import PUSH_FAST, start_push_cluster, wait_until

import actors
from actors import ConsumeStatus, CoordinatorConfig, PushConsumer
from storage import Message

FAST = {
    **PUSH_FAST,
    "consume_from": "FIRST",
    "coordinator_config": CoordinatorConfig(
        revoke_timeout_s=1.5, route_refresh_s=2.0, fence_timeout_s=2.0
    ),
}


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = start_push_cluster("reset", str(tmp_path_factory.mktemp("reset")))
    yield c
    c.shutdown()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Gate:
    """A listener that counts deliveries by body; once closed, every call waits (holding
    its messages unconsumed) until the gate opens again."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: Counter[bytes] = Counter()
        self.closed = False
        self.entered = threading.Event()
        self.opened = threading.Event()

    def __call__(self, messages: list[Any]) -> ConsumeStatus:
        with self.lock:
            self.seen.update(m.body for m in messages)
            closed = self.closed
        if closed:
            self.entered.set()
            self.opened.wait(60)
        return ConsumeStatus.SUCCESS

    def close(self) -> None:
        with self.lock:
            self.closed = True

    def open(self) -> None:
        with self.lock:
            self.closed = False
        self.opened.set()

    def counts(self) -> Counter[bytes]:
        with self.lock:
            return Counter(self.seen)


def send(cluster: actors.Cluster, topic: str, bodies: list[bytes]) -> None:
    producer = cluster.producer(f"p-{topic}", max_batch_messages=1)  # round robin the queues
    try:
        producer.send_batch([Message(topic, b) for b in bodies])
    finally:
        producer.close()


def committed(cluster: actors.Cluster, group: str, topic: str) -> dict[tuple[str, int], int]:
    return {
        (r["broker"], r["queue_id"]): r["consumer_offset"]
        for r in cluster.admin.consumer_lag(group, topic)
    }


@pytest.mark.parametrize("coordinated", [True, False], ids=["coordinated", "uncoordinated"])
def test_a_reset_by_time_is_consumed_again_and_stays_reset_while_consumers_run(
    cluster: actors.Cluster, coordinated: bool
) -> None:
    mode = "c" if coordinated else "u"
    topic, group = f"Reset{mode.upper()}", f"g-reset-{mode}"
    cluster.admin.create_topic(topic, 2, 2)  # 4 queues over 2 brokers
    before = [b"before-%02d" % i for i in range(12)]
    after = [b"after-%02d" % i for i in range(12)]
    gates = [Gate(), Gate()]
    consumers = [
        PushConsumer(
            group, topic, listener=g, namespace=cluster.namespace, coordinated=coordinated, **FAST
        ).start()
        for g in gates
    ]
    try:
        queues = {(r["broker"], r["queue_id"]) for r in cluster.admin.topic_status(topic)}

        def split() -> bool:  # each queue with one consumer: no message twice from a rebalance
            shares = [
                {(q.broker_name, q.queue_id) for q in c.assigned_queues(topic)} for c in consumers
            ]
            return all(shares) and set().union(*shares) == queues and sum(map(len, shares)) == 4

        wait_until(split, what="the queues split between the consumers")
        send(cluster, topic, before)
        reset_ms = now_ms() + 1
        wait_until(lambda: now_ms() > reset_ms, what="the reset time to pass")
        send(cluster, topic, after)
        every = Counter(before + after)

        def seen() -> Counter[bytes]:
            return sum((g.counts() for g in gates), Counter())

        wait_until(lambda: seen() == every, what="every message consumed once")
        wait_until(
            lambda: sum(committed(cluster, group, topic).values()) == len(every),
            what="the offsets committed at the end",
        )
        end = committed(cluster, group, topic)

        for g in gates:
            g.close()
        reset = cluster.admin.reset_offset(group, topic, reset_ms)
        by_queue = {(mq.broker_name, mq.queue_id): off for mq, off in reset.items()}
        assert sum(end.values()) - sum(by_queue.values()) == len(after)

        # the running consumers start again from the reset point ...
        wait_until(lambda: any(g.entered.is_set() for g in gates), what="a message consumed again")
        # ... and while the listeners hold those messages, every commit the consumers
        # make (however many) leaves the group's offsets where the reset put them
        rounds = sum(c.status().get("commit_rounds", 0) for c in consumers)
        wait_until(
            lambda: sum(c.status().get("commit_rounds", 0) for c in consumers) >= rounds + 6,
            what="a few more commit rounds",
        )
        assert committed(cluster, group, topic) == by_queue

        for g in gates:
            g.open()
        again = every + Counter(after)
        wait_until(lambda: seen() == again, what="the messages after the reset point, again")
        wait_until(
            lambda: committed(cluster, group, topic) == end, what="the offsets at the end again"
        )
        assert seen() == again, "before the reset point: once; after it: twice"
    finally:
        for g in gates:
            g.open()
        for c in consumers:
            c.shutdown()
