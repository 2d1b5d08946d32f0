"""POP consumption end to end (``actors.broker.pop``, ``actors.client.SimpleConsumer``):
two brokers on a real Ray cluster, messages sent by the native Producer, received by
body from both brokers, acked, one let lapse and received again, and a broker killed
and restarted while messages are in flight: nothing acked comes again, nothing unacked
is lost."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from raymq_testkit import SMALL_STORE, unique_namespace, wait_until

import actors
from actors import SimpleConsumer
from storage import Message
from storage.errors import (
    InvalidMessageError,
    InvalidReceiptHandleError,
    ReceiptHandleExpiredError,
    TopicNotFoundError,
)


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = actors.start_cluster(
        namespace=unique_namespace("pop"),
        nameservers=1,
        brokers=2,
        store_root=str(tmp_path_factory.mktemp("pop")),
        broker_options={
            "store": SMALL_STORE,
            "heartbeat_interval_s": 1.0,
            "pop_revive_interval_s": 0.05,
            "pop_max_reconsume_times": 1,  # a second lapse is a dead letter
        },
    )
    yield c
    c.shutdown(timeout_s=10.0)


def send(cluster: actors.Cluster, topic: str, prefix: str, n: int) -> set[bytes]:
    bodies = [f"{prefix}-{i}".encode() for i in range(n)]
    producer = cluster.producer(f"p-{topic}")
    try:
        for i in range(0, n, 4):  # a batch goes to one queue: several, round robin
            producer.send_batch([Message(topic, b) for b in bodies[i : i + 4]])
    finally:
        producer.close()
    return set(bodies)


def receive_all(consumer: SimpleConsumer, want: int, invisible_s: float = 5.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 20
    while len(got) < want:
        assert time.monotonic() < deadline, f"received {len(got)} of {want}"
        got.extend(consumer.receive(16, invisible_s, wait_s=1.0))
    return got


def test_receive_ack_lapse_and_change(cluster: actors.Cluster) -> None:
    topic = "PopOrders"
    cluster.admin.create_topic(topic, read_queue_nums=4, write_queue_nums=4)
    sent = send(cluster, topic, "m", 60)
    consumer = cluster.simple_consumer("g-pop", topic)
    got = receive_all(consumer, len(sent))
    assert sorted(m.body for m in got) == sorted(sent)  # each once, from both brokers
    assert {m.message.commitlog_offset >= 0 for m in got} == {True}
    assert len({m.receipt_handle.split(" ")[6] for m in got}) == 2, "both brokers served"
    assert all(m.reconsume_times == 0 for m in got)
    consumer.ack_many(got)
    assert consumer.receive(16, 5.0, wait_s=0.2) == []

    # every queue's consumer offset is past what was acked: no lag
    lag = cluster.admin.consumer_lag("g-pop", topic)
    assert sum(row["lag"] for row in lag) == 0, lag

    # one lapses and comes back with one more reconsume; a changed one keeps its time
    extra = send(cluster, topic, "x", 3)
    three = receive_all(consumer, 3, invisible_s=1.0)
    assert {m.body for m in three} == extra
    lapse, change, done = three
    consumer.ack(done)
    old_handle = change.receipt_handle
    consumer.change_invisible_duration(change, 30.0)
    with pytest.raises(InvalidReceiptHandleError, match="superseded"):
        ray.get(
            cluster.broker(old_handle.split(" ")[6]).ack_message.remote("g-pop", topic, old_handle)
        )
    again = receive_all(consumer, 1, invisible_s=5.0)
    assert [(m.body, m.reconsume_times) for m in again] == [(lapse.body, 1)]
    with pytest.raises(ReceiptHandleExpiredError):
        consumer.ack(lapse)
    consumer.ack_many([again[0], change])
    assert consumer.receive(16, 1.0, wait_s=1.2) == []  # nothing else comes back

    # delivered pop_max_reconsume_times + 1 times without an ack: a dead letter
    dead = send(cluster, topic, "dead", 1)
    first = receive_all(consumer, 1, invisible_s=0.5)
    second = receive_all(consumer, 1, invisible_s=0.5)
    assert [(m.body, m.reconsume_times) for m in first + second] == [(b"dead-0", 0), (b"dead-0", 1)]
    dlq = wait_until(lambda: cluster.admin.dlq_messages("g-pop"), what="the dead letter")
    assert {m.body for m in dlq} == dead
    assert dlq[0].properties["RETRY_TOPIC"] == topic
    assert consumer.receive(16, 1.0, wait_s=0.8) == []

    # another group cannot ack with these handles; bad arguments are refused
    other = cluster.simple_consumer("g-other", topic)
    probe = receive_all(other, 1, invisible_s=5.0)[0]
    broker = cluster.broker(probe.receipt_handle.split(" ")[6])
    with pytest.raises(InvalidReceiptHandleError, match="not issued to group 'g-pop'"):
        ray.get(broker.ack_message.remote("g-pop", topic, probe.receipt_handle))
    with pytest.raises(InvalidMessageError, match="max_msgs"):
        ray.get(broker.pop.remote("g-pop", topic, 0, 1000))
    with pytest.raises(TopicNotFoundError):
        ray.get(broker.pop.remote("g-pop", "NoSuchTopic", 1, 1000))
    other.close()
    consumer.close()


def test_a_broker_restart_loses_nothing_and_repeats_no_ack(cluster: actors.Cluster) -> None:
    topic = "PopRestart"
    cluster.admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)
    sent = send(cluster, topic, "r", 40)
    consumer = cluster.simple_consumer("g-restart", topic)
    got = receive_all(consumer, len(sent), invisible_s=2.0)
    assert sorted(m.body for m in got) == sorted(sent)
    acked = {m.body for m in got[::2]}
    consumer.ack_many(got[::2])
    unacked = {m.body for m in got[1::2]}

    broker = cluster.broker("broker-a")
    before = ray.get(broker.ping.remote())
    ray.kill(broker, no_restart=False)  # SIGKILL; Ray restarts it and it recovers
    wait_until(lambda: _pinged(cluster, before), timeout_s=60, what="broker-a restarted")

    back: list[Any] = []
    deadline = time.monotonic() + 30
    while {m.body for m in back} < unacked:
        assert time.monotonic() < deadline, f"came back: {len(back)} of {len(unacked)}"
        batch = consumer.receive(16, 10.0, wait_s=1.0)
        assert not {m.body for m in batch} & acked, "an acked message came again"
        back.extend(batch)
        consumer.ack_many(batch)
    assert all(m.reconsume_times == 1 for m in back)
    assert sorted(m.body for m in back) == sorted(unacked)
    consumer.close()


def _pinged(cluster: actors.Cluster, before: str) -> bool:
    try:
        return ray.get(cluster.broker("broker-a").ping.remote(), timeout=5) != before
    except Exception:  # noqa: BLE001 - still restarting
        return False


@ray.remote
def _consume(namespace: str, nameservers: list[str], topic: str, idle_s: float) -> list[bytes]:
    """A Ray task of the group: receives and acks until nothing comes for ``idle_s``."""
    consumer = SimpleConsumer("g-tasks", topic, namespace=namespace, nameservers=nameservers)
    got: list[bytes] = []
    while batch := consumer.receive(8, 30.0, wait_s=idle_s):
        got.extend(m.body for m in batch)
        consumer.ack_many(batch)
    consumer.close()
    return got


def test_ray_tasks_share_a_group_without_a_rebalance(cluster: actors.Cluster) -> None:
    topic = "PopTasks"
    cluster.admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)
    sent = send(cluster, topic, "t", 80)
    names = list(cluster.nameserver_names)
    parts = ray.get([_consume.remote(cluster.namespace, names, topic, 1.5) for _ in range(3)])
    every = [b for part in parts for b in part]
    assert sorted(every) == sorted(sent), "each message to exactly one task"
