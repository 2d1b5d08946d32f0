"""POP consumption end to end (``actors.broker.processor.pop``, ``actors.client.SimpleConsumer``):
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
from actors.protocol.connection import BrokerConnection
from actors.protocol.frames import Code
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


def receive_all(
    consumer: SimpleConsumer, want: int, invisible_s: float = 5.0, max_msgs: int = 16
) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 20
    while len(got) < want:
        assert time.monotonic() < deadline, f"received {len(got)} of {want}"
        got.extend(consumer.receive(max_msgs, invisible_s, wait_s=1.0))
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


def _status(cluster: actors.Cluster) -> dict[str, dict[str, Any]]:
    names = ("broker-a", "broker-b")
    return dict(zip(names, ray.get([cluster.broker(n).status.remote() for n in names])))


def test_receive_ack_and_change_go_over_the_brokers_socket(cluster: actors.Cluster) -> None:
    """Per message nothing rides a Ray call: receives (records as stored, handles beside
    them), acks and changes of invisible time take each broker's socket; a hostile frame
    (wrong types, missing fields) is answered with an error and changes nothing."""
    topic = "PopSocket"
    cluster.admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)
    conns = {n: s["data_connections"] for n, s in _status(cluster).items()}
    consumer = cluster.simple_consumer("g-socket", topic)
    assert consumer.receive(4, 5.0, wait_s=0.1) == []  # opens a connection to each broker
    wait_until(
        lambda: all(s["data_connections"] > conns[n] for n, s in _status(cluster).items()),
        what="the consumer's connection to each broker",
    )
    producer = cluster.producer("p-socket")
    try:
        results = [
            producer.send(Message(topic, f"s-{i}".encode(), tags="T", keys=[f"k{i}"]))
            for i in range(8)
        ]
    finally:
        producer.close()
    before = _status(cluster)
    got = receive_all(consumer, 8)
    assert sorted((m.msg_id, m.body, m.tags, m.keys) for m in got) == sorted(
        (r.msg_id, f"s-{i}".encode(), "T", (f"k{i}",)) for i, r in enumerate(results)
    )
    assert {m.reconsume_times for m in got} == {0}
    consumer.change_invisible_duration(got[0], 20.0)
    consumer.ack_many(got)
    assert consumer.receive(16, 5.0, wait_s=0.2) == []  # and its receives still held end
    after = _status(cluster)
    for name in before:  # at least a receive and an ack each, over the socket
        assert after[name]["data_requests"] >= before[name]["data_requests"] + 2, name
        assert after[name]["pop_acked"] > before[name]["pop_acked"], name
    assert sum(a["pop_changed"] - before[n]["pop_changed"] for n, a in after.items()) == 1

    # Ray stays the fallback: data_path="ray" receives the same way, no socket request
    producer = cluster.producer("p-socket")
    try:
        producer.send(Message(topic, b"by-ray"))
    finally:
        producer.close()
    by_ray = cluster.simple_consumer("g-socket", topic, data_path="ray")
    before = _status(cluster)
    again = receive_all(by_ray, 1)
    by_ray.ack_many(again)
    assert by_ray.receive(16, 5.0, wait_s=0.2) == []
    after = _status(cluster)
    assert [m.body for m in again] == [b"by-ray"]
    assert [a["data_requests"] for a in after.values()] == [
        b["data_requests"] for b in before.values()
    ]
    by_ray.close()

    # hostile frames: an error answer each, nothing handed out, acked or changed
    producer = cluster.producer("p-socket")
    try:
        producer.send(Message(topic, b"held"))
    finally:
        producer.close()
    (held,) = receive_all(consumer, 1, invisible_s=30.0)
    name = held.receipt_handle.split(" ")[6]
    info = ray.get(cluster.broker(name).data_path.remote())
    conn = BrokerConnection(info["addr"], info["secret"], tls=info["tls"])
    conn.open()
    good = {"g": "g-socket", "t": topic}
    pop = {**good, "c": int(Code.POP), "n": 4, "i": 5000}
    ack = {**good, "c": int(Code.ACK), "h": held.receipt_handle}
    change = {**good, "c": int(Code.CHANGE_INVISIBLE), "h": held.receipt_handle, "i": 5000}
    hostile = [
        ({**pop, "n": "4"}, "max_msgs"),
        ({**pop, "n": 1 << 40}, "max_msgs"),
        ({**pop, "i": None}, "invisible_ms"),
        ({**pop, "i": 10}, "invisible_ms"),
        ({**pop, "w": -1}, "wait_ms"),
        ({**pop, "g": 7}, "group"),
        ({**pop, "t": "../etc"}, "topic"),
        ({**pop, "ff": "yes"}, "fifo"),
        ({**pop, "x": ["*"]}, "tag_expr"),
        ({**pop, "id": {"a": 1}}, "client_id"),
        ({**ack, "h": 123}, "receipt_handle"),
        ({**ack, "h": {"x": held.receipt_handle}}, "receipt_handle"),
        ({**ack, "g": "g-other"}, "not issued to group"),
        ({**ack, "h": [held.receipt_handle] * 5000}, "at most 4096"),
        ({**change, "i": "5000"}, "invisible_ms"),
        ({**change, "h": b"raw"}, "receipt_handle"),
        ({**change, "t": None}, "topic"),
    ]
    state = _status(cluster)[name]
    try:
        for header, why in hostile:
            with pytest.raises((InvalidMessageError, InvalidReceiptHandleError), match=why):
                conn.request(header).result(10)
        # a list of handles answers each: the bad ones refused, none acked
        answer, _ = conn.request({**ack, "h": [1, "p1 forged"]}).result(10)
        assert len(answer["r"]) == 2
        assert all(why.startswith("InvalidReceiptHandleError") for why in answer["r"])
    finally:
        conn.close()
    now = _status(cluster)[name]
    for stat in ("pop_popped", "pop_acked", "pop_changed", "data_bad_frames"):
        assert now[stat] == state[stat], stat
    consumer.ack(held)  # still in flight under its handle: the hostile frames changed nothing
    assert _status(cluster)[name]["pop_acked"] == state["pop_acked"] + 1
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


def test_a_fifo_group_receives_each_queue_in_order(cluster: actors.Cluster) -> None:
    topic = "PopFifo"
    cluster.admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)
    producer = cluster.producer("p-fifo")
    try:
        for i in range(6):
            producer.send(Message(topic, b"f-%d" % i), sharding_key="order-1")  # one queue
    finally:
        producer.close()
    consumer = cluster.simple_consumer("g-fifo", topic, fifo=True)
    seen: list[tuple[bytes, int]] = []
    lapsed = False
    while (b"f-5", 0) not in seen and len(seen) < 12:
        batch = receive_all(consumer, 1, invisible_s=1.0, max_msgs=2)  # 1 from each broker
        # its queue gives nothing more while this batch is in flight
        broker = cluster.broker(batch[0].receipt_handle.split(" ")[6])
        assert ray.get(broker.pop.remote("g-fifo", topic, 4, 1000, fifo=True)) == []
        seen.extend((m.body, m.reconsume_times) for m in batch)
        if len(seen) == 2 and not lapsed:
            lapsed = True  # let the second one lapse: it comes again before the third
            seen.append((b"", 0))
            continue
        consumer.ack_many(batch)
    assert seen == [
        (b"f-0", 0),
        (b"f-1", 0),
        (b"", 0),
        (b"f-1", 1),
        (b"f-2", 0),
        (b"f-3", 0),
        (b"f-4", 0),
        (b"f-5", 0),
    ]
    consumer.close()
