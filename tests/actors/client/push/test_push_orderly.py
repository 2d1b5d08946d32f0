"""Orderly push consumers (``orderly=True``, RocketMQ's ``MessageListenerOrderly``) against
a real 2-broker cluster: per-key order with many producers, a failing message retried
in place then dead-lettered while the queue waits, and order across a rebalance."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from raymq_testkit import PUSH_FAST, start_push_cluster, wait_until

import actors
from actors import ConsumeStatus, PushConsumer
from storage import Message
from storage.errors import InvalidConfigError

FAST = {
    **PUSH_FAST,
    "consume_from": "FIRST",
    "orderly": True,
}


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = start_push_cluster("orderly", str(tmp_path_factory.mktemp("orderly")))
    yield c
    c.shutdown()


def push(cluster: actors.Cluster, group: str, topic: str, listener: Any, **options: Any) -> Any:
    return PushConsumer(
        group, topic, listener=listener, namespace=cluster.namespace, **{**FAST, **options}
    ).start()


class KeyedRecorder:
    """Shared by every consumer of a test: per key, the sequence numbers in the order the
    listeners saw them; and whether two calls ever ran on one queue at once."""

    def __init__(self, work_s: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.by_key: dict[str, list[int]] = defaultdict(list)
        self.queue_of_key: dict[str, set[tuple[str, int]]] = defaultdict(set)
        self.active: set[tuple[str, int]] = set()
        self.overlaps: list[tuple[str, int]] = []
        self.calls = 0
        self.work_s = work_s

    def __call__(self, messages: list[Any]) -> ConsumeStatus:
        queues = {(m.store_host, m.queue_id) for m in messages}
        assert len(queues) == 1, "a listener call holds one queue's messages"
        (q,) = queues
        with self.lock:
            if q in self.active:
                self.overlaps.append(q)
            self.active.add(q)
        try:
            if self.work_s:
                time.sleep(self.work_s)  # a little work per batch, so handoffs meet a batch
            with self.lock:
                self.calls += 1
                for m in messages:
                    key, seq = m.body.decode().split(":")
                    self.by_key[key].append(int(seq))
                    self.queue_of_key[key].add(q)
        finally:
            with self.lock:
                self.active.discard(q)
        return ConsumeStatus.SUCCESS

    def count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.by_key.values())

    def snapshot(self) -> dict[str, list[int]]:
        with self.lock:
            return {k: list(v) for k, v in self.by_key.items()}


def produce_keys(
    cluster: actors.Cluster,
    topic: str,
    keys: list[str],
    per_key: int,
    chunk: int,
    stop: threading.Event | None = None,
    sent: dict[str, int] | None = None,
) -> None:
    """One producer sending each key's sequence in order, ``chunk`` messages per call,
    every call to the key's queue (the ordered-key selector)."""
    producer = cluster.producer(f"p-{keys[0]}")
    try:
        for start in range(0, per_key, chunk):
            if stop is not None and stop.is_set():
                return
            for key in keys:
                seqs = range(start, min(start + chunk, per_key))
                msgs = [Message(topic, f"{key}:{s}".encode(), keys=key) for s in seqs]
                producer.send_batch(msgs, sharding_key=key)
                if sent is not None:
                    sent[key] = seqs[-1] + 1
    finally:
        producer.close()


def test_the_orderly_options_are_checked() -> None:
    with pytest.raises(InvalidConfigError, match="suspend_current_queue_time_s"):
        actors.PushConsumerConfig(orderly=True, suspend_current_queue_time_s=0)
    with pytest.raises(InvalidConfigError, match="orderly"):
        actors.PushConsumerConfig(orderly="yes")  # type: ignore[arg-type]
    assert actors.PushConsumerConfig().suspend_current_queue_time_s == 1.0


def test_each_key_is_consumed_in_order_with_several_producers_and_consumers(
    cluster: actors.Cluster,
) -> None:
    topic, group, per_key = "OrderlyKeys", "g-orderly-keys", 300
    cluster.admin.create_topic(topic, 2, 2)  # 4 queues over 2 brokers
    rec = KeyedRecorder(work_s=0.0005)
    consumers = [
        push(
            cluster, group, topic, rec, consume_threads=4, consume_batch_size=4, pull_batch_size=64
        )
        for _ in range(2)
    ]
    try:
        wait_until(
            lambda: (
                sorted(q for c in consumers for q in c.assigned_queues(topic))
                == sorted(set(q for c in consumers for q in c.assigned_queues(topic)))
                and sum(len(c.assigned_queues(topic)) for c in consumers) == 4
                and all(c.assigned_queues(topic) for c in consumers)
            ),
            what="a stable split of the 4 queues",
        )
        producer_keys = [[f"p{p}k{k}" for k in range(8)] for p in range(3)]
        threads = [
            threading.Thread(target=produce_keys, args=(cluster, topic, keys, per_key, 50))
            for keys in producer_keys
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        total = 3 * 8 * per_key
        wait_until(lambda: rec.count() >= total, timeout_s=60, what="every message")
    finally:
        for c in consumers:
            c.shutdown()
    seen = rec.snapshot()
    assert sorted(seen) == sorted(k for keys in producer_keys for k in keys)
    for key, seqs in seen.items():
        assert seqs == list(range(per_key)), f"key {key} out of order"
        assert len(rec.queue_of_key[key]) == 1, "a key lives in one queue"
    assert rec.overlaps == [], "two listener calls ran on one queue at once"
    assert len({q for qs in rec.queue_of_key.values() for q in qs}) == 4
    assert sum(r["lag"] for r in cluster.admin.consumer_lag(group, topic)) == 0


def test_a_failing_message_is_retried_in_place_then_dead_lettered_while_later_ones_wait(
    cluster: actors.Cluster,
) -> None:
    topic, group = "OrderlyPoison", "g-orderly-poison"
    cluster.admin.create_topic(topic, 1, 1, brokers=["broker-a"])
    bodies = [b"m0", b"m1", b"m2", b"poison", b"m4", b"flaky", b"m6", b"slow", b"m8", b"m9"]
    log: list[tuple[bytes, int, float]] = []
    last_attempt, release = threading.Event(), threading.Event()

    def listener(messages: list[Any]) -> ConsumeStatus:
        (m,) = messages
        log.append((m.body, m.reconsume_times, time.monotonic()))
        if m.body == b"poison":
            if m.reconsume_times == 2:
                last_attempt.set()
                release.wait(30)
            return ConsumeStatus.RECONSUME_LATER
        if m.body == b"flaky" and m.reconsume_times == 0:
            raise RuntimeError("flaky fails once")
        if m.body == b"slow" and m.reconsume_times == 0:
            time.sleep(0.5)  # past consume_timeout_s: counted as failed when it returns
        return ConsumeStatus.SUCCESS

    consumer = push(
        cluster,
        group,
        topic,
        listener,
        max_reconsume_times=2,
        suspend_current_queue_time_s=0.2,
        consume_timeout_s=0.3,
    )
    broker = cluster.broker("broker-a")
    try:
        cluster.producer("p-poison").send_batch([Message(topic, b) for b in bodies])
        assert last_attempt.wait(20)
        # the queue waits at the poison message: its offset is the committed one
        wait_until(
            lambda: ray.get(broker.query_offset.remote(group, topic, 0)) == 3,
            what="the committed offset held at the failing message",
        )
        assert [(b, n) for b, n, _ in log] == [
            (b"m0", 0),
            (b"m1", 0),
            (b"m2", 0),
            (b"poison", 0),
            (b"poison", 1),
            (b"poison", 2),
        ], "nothing overtook the failing message"
        release.set()
        wait_until(lambda: any(b == b"m9" for b, _, _ in log), what="the rest of the queue")
        wait_until(
            lambda: ray.get(broker.query_offset.remote(group, topic, 0)) == 10,
            what="the offset past the dead letter",
        )
    finally:
        release.set()
        consumer.shutdown()
    assert [(b, n) for b, n, _ in log] == [
        (b"m0", 0),
        (b"m1", 0),
        (b"m2", 0),
        (b"poison", 0),
        (b"poison", 1),
        (b"poison", 2),
        (b"m4", 0),
        (b"flaky", 0),
        (b"flaky", 1),
        (b"m6", 0),
        (b"slow", 0),
        (b"slow", 1),
        (b"m8", 0),
        (b"m9", 0),
    ]
    poison_times = [t for b, _, t in log if b == b"poison"]
    assert all(b - a >= 0.18 for a, b in zip(poison_times, poison_times[1:])), "suspended"
    dead = cluster.admin.dlq_messages(group)
    assert [m.body for m in dead] == [b"poison"]
    assert dead[0].reconsume_times == 3 and dead[0].properties["RECONSUME_TIME"] == "3"
    assert dead[0].properties["RETRY_TOPIC"] == topic
    stats = consumer.status()
    assert stats["sent_to_dlq"] == 1 and stats["suspended"] == 4
    assert stats["consumed"] == 9


def test_each_key_stays_in_order_across_a_rebalance(cluster: actors.Cluster) -> None:
    """One consumer, a second joins mid-stream, the first leaves: the queues move with a
    graceful handoff, so every key's sequence arrives whole, in order, once."""
    topic, group = "OrderlyHandoff", "g-orderly-handoff"
    cluster.admin.create_topic(topic, 2, 2)
    rec = KeyedRecorder(work_s=0.002)
    keys = [f"h{k}" for k in range(16)]
    stop = threading.Event()
    sent: dict[str, int] = {}
    opts = {"consume_threads": 4, "consume_batch_size": 2, "pull_batch_size": 32}
    first = push(cluster, group, topic, rec, **opts)
    second = None
    producer = threading.Thread(
        target=produce_keys, args=(cluster, topic, keys, 100_000, 10, stop, sent)
    )
    producer.start()
    try:
        wait_until(lambda: rec.count() >= 1500, timeout_s=30, what="the first consumer going")
        second = push(cluster, group, topic, rec, **opts)
        wait_until(
            lambda: (
                len(second.assigned_queues(topic)) == 2 and len(first.assigned_queues(topic)) == 2
            ),
            what="the second consumer taking half",
        )
        mark = rec.count()
        wait_until(lambda: rec.count() >= mark + 1500, timeout_s=30, what="both consuming")
        first.shutdown()
        wait_until(lambda: len(second.assigned_queues(topic)) == 4, what="the takeover")
        mark = rec.count()
        wait_until(lambda: rec.count() >= mark + 1500, timeout_s=30, what="the survivor going")
        stop.set()
        producer.join(30)
        total = sum(sent.values())
        wait_until(lambda: rec.count() >= total, timeout_s=30, what="everything sent")
    finally:
        stop.set()
        producer.join(30)
        first.shutdown()
        if second is not None:
            second.shutdown()
    seen = rec.snapshot()
    for key in keys:
        assert seen.get(key, []) == list(range(sent.get(key, 0))), f"key {key}: gap or reorder"
    assert rec.overlaps == [], "two consumers ran one queue at once"
