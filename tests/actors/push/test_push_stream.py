"""PushConsumers with ``delivery="stream"`` on a real 2-broker cluster: each queue's
messages reach the listeners in order, none lost and none twice, while a second
consumer joins (a rebalance) and while a broker restarts; a slow listener's stream
stops at its credit and resumes; tags are filtered and a failed message comes back
through the group's retry topic, as with pulls."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from raymq_testkit import PUSH_FAST, start_push_cluster, wait_until

import actors
from actors import ConsumeStatus, PushConsumer
from storage import Message

WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = start_push_cluster(
        "stream", str(tmp_path_factory.mktemp("stream")), message_delay_level="100ms 200ms"
    )
    yield c
    c.shutdown()


def stream_consumer(
    cluster: actors.Cluster, group: str, topic: str, listener: Any, **options: Any
) -> Any:
    return PushConsumer(
        group,
        topic,
        listener=listener,
        namespace=cluster.namespace,
        **{**PUSH_FAST, "delivery": "stream", "consume_from": "FIRST", **options},
    ).start()


class Seen:
    """Every delivery, in the order the listeners saw them, by queue."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_queue: dict[tuple[str, int], list[int]] = defaultdict(list)
        self.bodies: list[bytes] = []

    def __call__(self, messages: list[Any]) -> ConsumeStatus:
        with self.lock:
            for m in messages:
                self.by_queue[(m.store_host, m.queue_id)].append(m.queue_offset)
                self.bodies.append(m.body)
        return ConsumeStatus.SUCCESS

    def count(self) -> int:
        with self.lock:
            return len(self.bodies)


def send(cluster: actors.Cluster, topic: str, bodies: list[bytes]) -> None:
    producer = cluster.producer(f"p-{topic}", max_batch_messages=25)
    try:
        producer.send_batch([Message(topic, b) for b in bodies])
    finally:
        producer.close()


def test_streamed_queues_stay_in_order_once_across_a_rebalance_and_a_broker_restart(
    cluster: actors.Cluster,
) -> None:
    topic, group = "StreamOrder", "g-stream-order"
    cluster.admin.create_topic(topic, 2, 2)  # 4 queues over 2 brokers
    seen = Seen()
    first = stream_consumer(cluster, group, topic, seen, orderly=True)
    consumers = [first]
    try:
        bodies = [b"%05d" % i for i in range(400)]
        send(cluster, topic, bodies[:200])
        wait_until(lambda: seen.count() >= 200, timeout_s=WAIT_S, what="the first 200")

        consumers.append(stream_consumer(cluster, group, topic, seen, orderly=True))
        wait_until(
            lambda: all(c.assigned_queues(topic) for c in consumers), what="a split of the queues"
        )
        send(cluster, topic, bodies[200:300])
        wait_until(lambda: seen.count() >= 300, timeout_s=WAIT_S, what="300 after the rebalance")

        broker = cluster.broker("broker-a")
        before = ray.get(broker.ping.remote())
        ray.kill(broker, no_restart=False)  # SIGKILL; Ray restarts it and it recovers
        wait_until(lambda: _pinged(cluster, before), timeout_s=WAIT_S, what="broker-a restarted")
        wait_until(
            lambda: sum(c.status().get("streams_ended", 0) for c in consumers) >= 1,
            what="broker-a's subscription ended",
        )
        with seen.lock:
            counts = {q: len(offsets) for q, offsets in seen.by_queue.items()}
        send(cluster, topic, bodies[300:])  # 25 to each queue
        wait_until(lambda: seen.count() >= 400, timeout_s=WAIT_S, what="400 after the restart")
        with seen.lock:  # every queue, broker-a's too, streamed again
            assert {q: len(offsets) - counts[q] for q, offsets in seen.by_queue.items()} == {
                q: 25 for q in counts
            }
    finally:
        for c in consumers:
            c.shutdown()
    assert sorted(seen.bodies) == bodies  # none lost, none twice
    for q, offsets in seen.by_queue.items():  # each queue in order, every offset once
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), q


def _pinged(cluster: actors.Cluster, before: str) -> bool:
    try:
        return ray.get(cluster.broker("broker-a").ping.remote(), timeout=5) != before
    except Exception:  # noqa: BLE001 - still restarting
        return False


def _group_gets(cluster: actors.Cluster, group: str) -> int:
    """Messages the brokers wrote to ``group`` (pulls and streams)."""

    def gets(broker: Any, group: str) -> int:  # local: sent by value
        return int(broker.rt.group_gets.get(group, 0))

    names = ("broker-a", "broker-b")
    return sum(ray.get([cluster.broker(n).__ray_call__.remote(gets, group) for n in names]))


def test_a_slow_listener_s_stream_stops_at_its_credit_and_resumes(
    cluster: actors.Cluster,
) -> None:
    topic, group = "StreamSlow", "g-stream-slow"
    cluster.admin.create_topic(topic, 1, 1)  # one queue on each broker
    gate = threading.Event()
    seen = Seen()

    def slow(messages: list[Any]) -> ConsumeStatus:
        gate.wait(WAIT_S)
        return seen(messages)

    n, threshold = 300, 10
    consumer = stream_consumer(
        cluster,
        group,
        topic,
        slow,
        orderly=True,
        pull_threshold_for_queue=threshold,
        pull_batch_size=2,  # a window of 8 messages a subscription
    )
    try:
        send(cluster, topic, [b"%04d" % i for i in range(n)])
        wait_until(lambda: consumer.status()["flow_control_pauses"] >= 2, what="both queues paused")
        stopped = _group_gets(cluster, group)
        # each queue stops past its threshold by at most the window and a batch in flight
        assert stopped <= 2 * (threshold + 1 + 8)
        gate.set()
        wait_until(lambda: seen.count() >= n, timeout_s=WAIT_S, what="every message")
    finally:
        gate.set()
        consumer.shutdown()
    assert sorted(seen.bodies) == [b"%04d" % i for i in range(n)]
    assert consumer.status()["credits"] > 0


def test_a_stream_filters_tags_and_redelivers_through_the_retry_topic(
    cluster: actors.Cluster,
) -> None:
    topic, group = "StreamTags", "g-stream-tags"
    cluster.admin.create_topic(topic, 1, 1)
    lock = threading.Lock()
    got: list[tuple[bytes, str | None, int]] = []

    def listener(messages: list[Any]) -> ConsumeStatus:
        with lock:
            got.extend((m.body, m.tags, m.reconsume_times) for m in messages)
        if any(m.body == b"a3" and not m.reconsume_times for m in messages):
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.SUCCESS

    consumer = PushConsumer(
        group,
        topic,
        "TagA",
        listener=listener,
        namespace=cluster.namespace,
        **{**PUSH_FAST, "delivery": "stream", "consume_from": "FIRST"},
    ).start()
    try:
        producer = cluster.producer("p-stream-tags")
        for i in range(6):
            producer.send(Message(topic, b"a%d" % i, tags="TagA"))
            producer.send(Message(topic, b"b%d" % i, tags="TagB"))
        producer.close()
        wait_until(lambda: len(got) >= 7, timeout_s=WAIT_S, what="6 TagA and a retry")
    finally:
        consumer.shutdown()
    assert sorted(got) == sorted([(b"a%d" % i, "TagA", 0) for i in range(6)] + [(b"a3", "TagA", 1)])
