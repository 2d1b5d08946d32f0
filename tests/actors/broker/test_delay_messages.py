"""Delayed messages through a real broker: stored in SCHEDULE_TOPIC_XXXX, moved to their
topic when due, in due order, never early, and neither lost nor repeated when the broker
is killed (and restarted by Ray) while they wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from raymq_testkit import SMALL_STORE, unique_namespace, wait_until

import actors
from actors import ConsumeStatus, PullStatus, PushConsumer
from rebalance import MessageQueue
from storage import Message

LEVELS_MS = [300, 600, 900, 1200, 1500, 1800, 2100, 2400]


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = actors.start_cluster(
        namespace=unique_namespace("delay"),
        nameservers=1,
        brokers=1,
        store_root=str(tmp_path_factory.mktemp("delay")),
        broker_options={
            "store": {
                **SMALL_STORE,
                "message_delay_level": " ".join(f"{ms}ms" for ms in LEVELS_MS),
            },
            "heartbeat_interval_s": 1.0,
            "flush_consumer_offset_interval_s": 0.2,
        },
        topics=[actors.TopicConfig("Delayed", 1, 1), actors.TopicConfig("DelayedBySeconds", 1, 1)],
    )
    yield c
    c.shutdown()


def test_delayed_messages_arrive_in_due_order_never_early_across_a_broker_restart(
    cluster: actors.Cluster,
) -> None:
    topic = "Delayed"
    lock = threading.Lock()
    arrivals: list[tuple[float, Any]] = []

    def listener(messages: list[Any]) -> ConsumeStatus:
        now = time.time()
        with lock:
            arrivals.extend((now, m) for m in messages)
        return ConsumeStatus.SUCCESS

    consumer = PushConsumer(
        "g-delay",
        topic,
        listener=listener,
        namespace=cluster.namespace,
        consume_from="FIRST",
        rebalance_interval_s=0.3,
        heartbeat_interval_s=0.3,
        persist_offset_interval_s=0.2,
        pull_suspend_s=1.0,
        pull_retry_delay_s=0.1,
    ).start()
    try:
        producer = cluster.producer("p-delay", send_timeout_s=5.0)
        # send the longest delays first: due order is not send order
        levels = [lvl for lvl in range(len(LEVELS_MS), 0, -1) for _ in range(2)]
        sent_at = time.time()
        sent = producer.send_batch(
            [Message(topic, b"L%d-%d" % (lvl, i), delay_level=lvl) for i, lvl in enumerate(levels)]
        )
        level_of = {r.msg_id: lvl for r, lvl in zip(sent, levels)}
        wait_until(lambda: len(arrivals) >= 2, what="the first level delivered")
        broker = cluster.broker("broker-a")
        before = ray.get(broker.ping.remote())
        ray.kill(broker, no_restart=False)  # Ray restarts it; the store recovers
        wait_until(
            lambda: len({m.msg_id for _, m in list(arrivals)}) >= len(levels),
            timeout_s=60,
            what="every delayed message",
        )
        assert ray.get(broker.ping.remote()) != before, "the broker did restart"
        first: dict[str, float] = {}
        for t, m in list(arrivals):
            first.setdefault(m.msg_id, t)
        for msg_id, t in first.items():
            assert t - sent_at >= LEVELS_MS[level_of[msg_id] - 1] / 1000 - 0.005, msg_id
        order = sorted(first, key=first.__getitem__)
        assert [level_of[i] for i in order] == sorted(levels), "delivered in due order"
        assert all(m.topic == topic and m.delay_level == 0 for _, m in arrivals)

        puller = cluster.pull_consumer("g-check")
        result = puller.pull(MessageQueue(topic, "broker-a", 0), 0, 100)
        assert result.status is PullStatus.FOUND
        stored = [m.msg_id for m in result.messages]
        assert sorted(stored) == sorted(level_of), "each delivered to the topic exactly once"
        producer.close()
    finally:
        consumer.shutdown()


def test_a_delay_in_seconds_rounds_up_to_the_next_level(cluster: actors.Cluster) -> None:
    producer = cluster.producer("p-seconds")
    assert producer.delay_level_for(0) == 0
    assert producer.delay_level_for(0.3) == 1
    assert producer.delay_level_for(0.31) == 2
    assert producer.delay_level_for(3600) == len(LEVELS_MS)
    with pytest.raises(ValueError):
        producer.delay_level_for(-1)
    level = producer.delay_level_for(0.5)
    t0 = time.time()
    producer.send(Message("DelayedBySeconds", b"later", delay_level=level))
    puller = cluster.pull_consumer("g-seconds")
    mq = MessageQueue("DelayedBySeconds", "broker-a", 0)
    assert puller.pull(mq, 0).status is PullStatus.NO_NEW_MSG  # not there before its time
    got = puller.pull(mq, 0, long_poll_s=5.0)
    assert got.status is PullStatus.FOUND and time.time() - t0 >= 0.6 - 0.005
    producer.close()
