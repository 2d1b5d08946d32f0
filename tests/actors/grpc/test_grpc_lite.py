"""Lite topics through RayMQ's RocketMQ 5 gRPC door, driven by the official Python client
(``rocketmq-python-client``): its ``LiteSimpleConsumer`` receives in order what RayMQ's
``LiteProducer`` and the official ``Producer`` send to lite topics, resumes after a
reconnect from the group's offset, and a bad lite topic name or a full parent gets the
v2 protocol's codes. The official Node.js client's ``LitePushConsumer`` receives them in
order too, and is told to unsubscribe the lite topics that expire."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from node_client import NodeClient
from raymq_testkit import SMALL_STORE, unique_namespace, wait_until
from rocketmq import ClientConfiguration, Credentials, LiteSimpleConsumer, Message, Producer
from rocketmq.v5.exception import BadRequestException, LiteTopicQuotaExceededException

import actors
from actors.client.lite import LiteConsumer, LiteProducer

PARENT = "grpc-sessions"
SMALL_PARENT = "grpc-small"
SHORT_PARENT = "grpc-short"
"""A LITE parent whose lite topics expire 2 s after their last write."""
RESYNC_PARENT = "grpc-resync"
"""A LITE parent whose lite topics expire 4 s after their last write."""
GROUP = "grpc-gateway"


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root: Path = tmp_path_factory.mktemp("grpc-lite")
    c = actors.start_cluster(
        namespace=unique_namespace("grpc-lite"),
        nameservers=1,
        brokers=1,
        store_root=str(root),
        broker_options={
            "store": SMALL_STORE,
            "grpc_enable": True,
            "grpc_bind": "127.0.0.1",
            "lite_expire_interval_ms": 300,
        },
    )
    broker = c.broker("broker-a")
    ray.get(broker.lite_create_parent.remote(PARENT, quota=1000, ttl_ms=3_600_000))
    ray.get(broker.lite_create_parent.remote(SMALL_PARENT, quota=2, ttl_ms=3_600_000))
    ray.get(broker.lite_create_parent.remote(SHORT_PARENT, quota=100, ttl_ms=2_000))
    ray.get(broker.lite_create_parent.remote(RESYNC_PARENT, quota=10, ttl_ms=4_000))
    yield c
    c.shutdown(timeout_s=10.0)


@pytest.fixture(scope="module")
def config(cluster: Any) -> ClientConfiguration:
    ak, sk = cluster.grpc_credentials()
    (info,) = cluster.grpc_endpoints().values()
    return ClientConfiguration(info["addr"], Credentials(ak, sk), request_timeout=5)


@pytest.fixture(scope="module")
def producer(config: ClientConfiguration) -> Iterator[Producer]:
    p = Producer(config, (PARENT, SMALL_PARENT, SHORT_PARENT))
    p.startup()
    yield p
    p.shutdown()


def _lite_message(parent: str, lite_topic: str, body: bytes) -> Message:
    m = Message()
    m.topic = parent
    m.body = body
    m.lite_topic = lite_topic
    return m


def _consumer(
    config: ClientConfiguration, *lite_topics: str, group: str = GROUP
) -> LiteSimpleConsumer:
    c = LiteSimpleConsumer(PARENT, config, group, await_duration=5)
    c.startup()
    # the client takes its lite subscription quota from the settings the broker answers
    # on its Telemetry stream, which its startup does not wait for
    manager = c._LiteSimpleConsumer__subscription_manager  # type: ignore[attr-defined]
    wait_until(lambda: manager.lite_subscription_quota > 0, what="the broker's settings")
    assert manager.max_lite_topic_size == 128
    for name in lite_topics:
        c.subscribe_lite(name)
    return c


def _receive(consumer: LiteSimpleConsumer, want: int, ack: bool = True) -> list[Any]:
    got: list[Any] = []
    for _ in range(10):  # each a long poll the broker answers as soon as messages are there
        if len(got) >= want:
            break
        for m in consumer.receive(32, 15):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


def test_lite_simple_consumer_receives_in_order_and_resumes(
    cluster: Any, config: ClientConfiguration, producer: Producer
) -> None:
    native = LiteProducer(PARENT, namespace=cluster.namespace)
    try:
        native.send_batch([("chat-1", b"n0"), ("chat-2", b"m0"), ("chat-1", b"n1")])
        ids = [  # the official producer: each message to its lite topic
            producer.send(_lite_message(PARENT, "chat-1", f"o{i}".encode())).message_id
            for i in range(3)
        ]
        producer.send(_lite_message(PARENT, "chat-2", b"m1"))
    finally:
        native.close()
    consumer = _consumer(config, "chat-1", "chat-2")
    try:
        # the client's one-name subscription arrives whole: no lite topic per character
        topics = ray.get(cluster.broker("broker-a").lite_topics.remote(PARENT))
        assert "c" not in topics and {"chat-1", "chat-2"} <= set(topics)
        got = _receive(consumer, 7)
    finally:
        consumer.shutdown()
    by_topic: dict[str, list[bytes]] = {}
    for m in got:
        assert m.topic == PARENT
        by_topic.setdefault(m.lite_topic, []).append(m.body)
    assert by_topic == {"chat-1": [b"n0", b"n1", b"o0", b"o1", b"o2"], "chat-2": [b"m0", b"m1"]}
    assert [m.message_id for m in got if m.lite_topic == "chat-1"][2:] == ids

    # acked up to here for the group: a reconnecting consumer gets exactly what follows
    native = LiteProducer(PARENT, namespace=cluster.namespace)
    try:
        native.send_batch([("chat-1", b"n2"), ("chat-1", b"n3")])
    finally:
        native.close()
    again = _consumer(config, "chat-1")
    try:
        resumed = _receive(again, 2)
    finally:
        again.shutdown()
    assert [(m.lite_topic, m.body) for m in resumed] == [("chat-1", b"n2"), ("chat-1", b"n3")]
    reader = LiteConsumer("offset-check", PARENT, namespace=cluster.namespace)
    try:
        assert reader.committed_offset("chat-1") == -1  # another group: nothing committed
        assert [m.body for m in reader.pull("chat-1", offset=5).messages] == [b"n2", b"n3"]
    finally:
        reader.close()
    assert (
        ray.get(cluster.broker("broker-a").lite_committed_offset.remote(GROUP, PARENT, "chat-1"))
        == 7
    )


def test_lite_unsubscribe_passes_ownership(cluster: Any, config: ClientConfiguration) -> None:
    first = _consumer(config, "task-9")
    second = _consumer(config, "task-9")
    try:
        native = LiteProducer(PARENT, namespace=cluster.namespace)
        try:
            native.send("task-9", b"t0")
        finally:
            native.close()
        assert [m.body for m in _receive(first, 1)] == [b"t0"]
        first.unsubscribe_lite("task-9")  # the group's next subscriber owns it now
        native = LiteProducer(PARENT, namespace=cluster.namespace)
        try:
            native.send("task-9", b"t1")
        finally:
            native.close()
        assert [m.body for m in _receive(second, 1)] == [b"t1"]
    finally:
        first.shutdown()
        second.shutdown()


def test_lite_bad_name_and_quota_refused(
    cluster: Any, config: ClientConfiguration, producer: Producer
) -> None:
    broker = cluster.broker("broker-a")
    with pytest.raises(BadRequestException) as bad:
        producer.send(_lite_message(PARENT, "no spaces/here", b"x"))
    assert "ILLEGAL_LITE_TOPIC" in str(bad.value) or "lite topic" in str(bad.value)
    assert "no spaces/here" not in ray.get(broker.lite_topics.remote(PARENT))
    consumer = _consumer(config)
    try:
        with pytest.raises(BadRequestException):
            consumer.subscribe_lite("bad/name")
    finally:
        consumer.shutdown()
    producer.send(_lite_message(SMALL_PARENT, "a", b"1"))
    producer.send(_lite_message(SMALL_PARENT, "b", b"2"))
    with pytest.raises(LiteTopicQuotaExceededException):
        producer.send(_lite_message(SMALL_PARENT, "c", b"3"))
    assert ray.get(broker.lite_topics.remote(SMALL_PARENT)) == ["a", "b"]
    producer.send(_lite_message(SMALL_PARENT, "a", b"4"))  # a full parent takes writes still


def test_a_waiting_receive_wakes_on_a_write(cluster: Any, config: ClientConfiguration) -> None:
    consumer = LiteSimpleConsumer(PARENT, config, "grpc-waker", await_duration=20)
    consumer.startup()
    manager = consumer._LiteSimpleConsumer__subscription_manager  # type: ignore[attr-defined]
    wait_until(lambda: manager.lite_subscription_quota > 0, what="the broker's settings")
    consumer.subscribe_lite("wake-1")
    got: list[Any] = []
    started = time.monotonic()
    receiver = threading.Thread(target=lambda: got.extend(consumer.receive(32, 15)))
    try:
        receiver.start()  # long-polls up to 20 s: the write below wakes it
        native = LiteProducer(PARENT, namespace=cluster.namespace)
        try:
            native.send("wake-1", b"w0")
        finally:
            native.close()
        receiver.join(30)
    finally:
        consumer.shutdown()
    assert [m.body for m in got] == [b"w0"]
    assert time.monotonic() - started < 10  # answered on the write, not at the poll's end


def test_two_groups_each_keep_their_own_offsets_and_subscriptions(
    cluster: Any, config: ClientConfiguration, producer: Producer
) -> None:
    broker = cluster.broker("broker-a")
    for i in range(4):
        producer.send(_lite_message(PARENT, "multi-1", f"x{i}".encode()))
    producer.send(_lite_message(PARENT, "multi-2", b"y0"))
    first = _consumer(config, "multi-1", "multi-2", group="grpc-group-1")
    second = _consumer(config, "multi-1", group="grpc-group-2")
    try:
        one = _receive(first, 5)  # acked
        two = _receive(second, 4, ack=False)
        for m in two[:2]:
            second.ack(m)
        assert sorted((m.lite_topic, m.body) for m in one) == [
            ("multi-1", b"x0"),
            ("multi-1", b"x1"),
            ("multi-1", b"x2"),
            ("multi-1", b"x3"),
            ("multi-2", b"y0"),
        ]
        assert [m.body for m in two] == [b"x0", b"x1", b"x2", b"x3"]  # only what it subscribed

        def committed(group: str, lite: str) -> int:
            return ray.get(broker.lite_committed_offset.remote(group, PARENT, lite))

        wait_until(lambda: committed("grpc-group-2", "multi-1") == 2, what="group 2's ack")
        assert committed("grpc-group-1", "multi-1") == 4
        assert committed("grpc-group-1", "multi-2") == 1
        assert committed("grpc-group-2", "multi-2") == -1
        first.unsubscribe_lite("multi-1")  # group 1's subscription only
        producer.send(_lite_message(PARENT, "multi-1", b"x4"))
        producer.send(_lite_message(PARENT, "multi-2", b"y1"))
        assert [(m.lite_topic, m.body) for m in _receive(first, 1)] == [("multi-2", b"y1")]
        # group 2 still holds x2 and x3 unacked, handed out to it; x4 follows them
        assert committed("grpc-group-1", "multi-1") == 4
    finally:
        first.shutdown()
        second.shutdown()
    # a new consumer of group 2 resumes from group 2's own offset
    again = _consumer(config, "multi-1", group="grpc-group-2")
    try:
        assert [m.body for m in _receive(again, 3)] == [b"x2", b"x3", b"x4"]
    finally:
        again.shutdown()


def test_the_official_nodejs_lite_push_consumer_receives_in_order_and_hears_of_expiry(
    cluster: Any, producer: Producer
) -> None:
    ak, sk = cluster.grpc_credentials()
    (info,) = cluster.grpc_endpoints().values()
    node = NodeClient(
        {
            "mode": "litePush",
            "endpoints": info["addr"],
            "accessKey": ak,
            "secretKey": sk,
            "group": "node-lite-gateway",
            "topic": SHORT_PARENT,
            "liteTopics": ["node-1", "node-2"],
            "count": 6,
            "timeoutMs": 60_000,
            # then no write for the parent's TTL: both expire, and the broker tells it
            "waitGone": ["node-1", "node-2"],
            "waitGoneMs": 30_000,
        }
    )
    try:
        assert node.line() == {"subscribed": ["node-1", "node-2"]}
        with LiteProducer(SHORT_PARENT, namespace=cluster.namespace) as native:
            native.send_batch([("node-1", f"r{i}".encode()) for i in range(3)])
        for i in range(3):  # and the official Python producer's
            producer.send(_lite_message(SHORT_PARENT, "node-2", f"o{i}".encode()))
        out = node.result()
    finally:
        node.proc.kill()
    by_topic: dict[str, list[str]] = {}
    for m in out["got"]:
        by_topic.setdefault(m["lite"], []).append(m["body"])
    assert by_topic == {"node-1": ["r0", "r1", "r2"], "node-2": ["o0", "o1", "o2"]}
    # the broker told it to unsubscribe both (NotifyUnsubscribeLiteCommand); the 1.0.8
    # client's Telemetry session does not hand the command on, so its set keeps them
    assert sorted(out["notified"]) == ["node-1", "node-2"]
    assert ray.get(cluster.broker("broker-a").lite_topics.remote(SHORT_PARENT)) == []


def test_an_official_clients_resync_does_not_bring_back_an_expired_lite_topic(
    cluster: Any, config: ClientConfiguration
) -> None:
    """The official clients ignore ``NotifyUnsubscribeLiteCommand`` and keep an expired
    lite topic in their periodic ``COMPLETE_ADD``: the broker keeps it expired, and
    subscribes the client again only once a write has made it anew."""
    broker = cluster.broker("broker-a")
    parent = RESYNC_PARENT
    c = LiteSimpleConsumer(parent, config, "py-resync", await_duration=5)
    c.startup()
    try:
        manager = c._LiteSimpleConsumer__subscription_manager  # type: ignore[attr-defined]
        wait_until(lambda: manager.lite_subscription_quota > 0, what="the broker's settings")
        c.subscribe_lite("py-gone")  # PARTIAL_ADD: creates it
        assert "py-gone" in ray.get(broker.lite_topics.remote(parent))
        wait_until(  # no write for the parent's TTL
            lambda: "py-gone" not in ray.get(broker.lite_topics.remote(parent)),
            timeout_s=30,
            interval_s=0.2,
            what="py-gone to expire",
        )
        c.subscribe_lite_all()  # the client's resync, still naming it
        assert "py-gone" not in ray.get(broker.lite_topics.remote(parent))
        with LiteProducer(parent, namespace=cluster.namespace) as native:
            native.send_batch([("py-gone", b"again")])
        c.subscribe_lite_all()  # it exists again: the resync subscribes the client to it
        got = _receive(c, 1)
        assert [(m.lite_topic, m.body) for m in got] == [("py-gone", b"again")]
    finally:
        c.shutdown()
