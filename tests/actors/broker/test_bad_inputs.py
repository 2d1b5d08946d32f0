"""Bad input gets a clear error of the store's types, and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import ray
from raymq_testkit import SMALL_STORE, unique_namespace

import actors
from actors import PullStatus
from rebalance import MessageQueue
from storage import Message, encode_batch
from storage.errors import (
    InvalidConfigError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    PermissionDeniedError,
    RayMQError,
    TopicNotFoundError,
)


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = actors.start_cluster(
        namespace=unique_namespace("bad"),
        nameservers=1,
        brokers=1,
        store_root=str(tmp_path_factory.mktemp("bad")),
        broker_options={"store": SMALL_STORE, "auto_create_topic_enable": False},
        topics=[
            actors.TopicConfig("Good", 2, 2),
            actors.TopicConfig("ReadOnly", 1, 1, perm=4),
            actors.TopicConfig("WriteOnly", 1, 1, perm=2),
        ],
    )
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def producer(cluster: actors.Cluster) -> actors.Producer:
    return cluster.producer("p-bad")


def stored(cluster: actors.Cluster) -> int:
    return ray.get(cluster.broker("broker-a").status.remote())["put_msgs"]


def test_unknown_topic_with_auto_create_off(
    cluster: actors.Cluster, producer: actors.Producer
) -> None:
    with pytest.raises(TopicNotFoundError, match="Nope"):
        producer.send(Message("Nope", b"x"))
    with pytest.raises(TopicNotFoundError, match="Nope"):
        cluster.pull_consumer("g").fetch_subscribe_queues("Nope")
    # a client with a forged route still meets the broker's check
    blob = encode_batch([Message("Nope", b"x")]).to_bytes()
    with pytest.raises(TopicNotFoundError, match="auto_create_topic_enable is off"):
        ray.get(cluster.broker("broker-a").send.remote(blob))


def test_perm_forbids_write_and_read(cluster: actors.Cluster, producer: actors.Producer) -> None:
    before = stored(cluster)
    with pytest.raises(PermissionDeniedError, match="ReadOnly"):
        producer.send(Message("ReadOnly", b"x"))
    blob = encode_batch([Message("ReadOnly", b"x")]).to_bytes()
    with pytest.raises(PermissionDeniedError, match="writing is forbidden"):
        ray.get(cluster.broker("broker-a").send.remote(blob))
    consumer = cluster.pull_consumer("g-perm")
    with pytest.raises(PermissionDeniedError, match="WriteOnly"):
        consumer.fetch_subscribe_queues("WriteOnly")
    with pytest.raises(PermissionDeniedError, match="reading is forbidden"):
        consumer.pull(MessageQueue("WriteOnly", "broker-a", 0), 0)
    assert producer.send(Message("WriteOnly", b"ok")).queue_offset == 0
    assert stored(cluster) == before + 1


def test_oversized_bodies(cluster: actors.Cluster, producer: actors.Producer) -> None:
    before = stored(cluster)
    with pytest.raises(InvalidMessageError, match="max_message_size=4194304"):
        producer.send(Message("Good", b"x" * ((4 << 20) + 1)))  # the client's limit
    with pytest.raises(InvalidMessageError, match="max_message_size"):
        producer.send(Message("Good", b"x" * (2 << 20)))  # the broker's store allows 1 MiB
    with pytest.raises(InvalidMessageError, match="empty"):
        producer.send(Message("Good", b""))
    assert stored(cluster) == before


@pytest.mark.parametrize("topic", ["", "a/b", "../etc", "x" * 128, "with space", "TBW102"])
def test_bad_topic_names(producer: actors.Producer, topic: str) -> None:
    with pytest.raises(InvalidMessageError, match="topic"):
        producer.send(Message(topic, b"x"))


def test_bad_properties_and_names(cluster: actors.Cluster, producer: actors.Producer) -> None:
    with pytest.raises(InvalidMessageError, match="separators"):
        producer.send(Message("Good", b"x", properties={"a": "b\x01c"}))
    with pytest.raises(InvalidMessageError, match="key"):
        producer.send(Message("Good", b"x", keys="two words"))
    with pytest.raises(InvalidMessageError, match="group"):
        cluster.producer("")
    with pytest.raises(InvalidConfigError, match="perm"):
        cluster.admin.create_topic("Fine", perm=1)
    with pytest.raises(InvalidMessageError, match="topic"):
        cluster.admin.create_topic("bad/name")
    with pytest.raises(InvalidMessageError, match="malformed"):
        ray.get(cluster.broker("broker-a").send.remote(b"\x00\x01garbage"))


@pytest.mark.parametrize(
    "request_blob",
    [
        b"\x00\x01garbage",
        msgpack.packb(("g", [("Good", 0)], 32, None, 0.0, "c")),  # a request of two fields
        msgpack.packb(("g", [("Good", 0, 0)], "32", None, 0.0, "c")),  # max_count a string
        msgpack.packb(("g", [("Good", 0, 0)], 32, 5, 0.0, "c")),  # tags a number
    ],
)
def test_a_malformed_packed_pull_is_refused_and_counts_nothing(
    cluster: actors.Cluster, request_blob: bytes
) -> None:
    broker = cluster.broker("broker-a")
    before = ray.get(broker.status.remote())["pulls"]
    with pytest.raises(InvalidMessageError, match="packed pull request"):
        ray.get(broker.pull_packed.remote(request_blob))
    assert ray.get(broker.status.remote())["pulls"] == before


def test_offsets_out_of_range(cluster: actors.Cluster, producer: actors.Producer) -> None:
    producer.send_batch([Message("Good", b"m%d" % i) for i in range(10)], sharding_key="k")
    consumer = cluster.pull_consumer("g-range")
    mq = producer.send(Message("Good", b"last"), sharding_key="k").message_queue
    top = consumer.max_offset(mq)
    beyond = consumer.pull(mq, top + 100)
    assert beyond.status is PullStatus.OFFSET_ILLEGAL
    assert (beyond.min_offset, beyond.max_offset) == (0, top)
    with pytest.raises(OffsetOutOfRangeError, match="offset=-1"):
        consumer.pull(mq, -1)
    with pytest.raises(OffsetOutOfRangeError, match="beyond the queue's max offset"):
        consumer.commit(mq, top + 1)
    consumer.commit(mq, top)
    assert consumer.fetch_offset(mq) == top
    with pytest.raises(InvalidMessageError, match="read_queue_nums=2"):
        consumer.pull(MessageQueue("Good", "broker-a", 7), 0)
    with pytest.raises(InvalidMessageError, match="max_count"):
        consumer.pull(mq, 0, 0)


def test_a_second_cluster_in_the_same_namespace_is_refused(cluster: actors.Cluster) -> None:
    with pytest.raises(RayMQError, match="already runs"):
        actors.start_cluster(namespace=cluster.namespace, nameservers=1, brokers=1)


def _around_its_checks(**fields: Any) -> actors.TopicConfig:
    """A TopicConfig whose fields were set past ``__post_init__``, as a hostile caller can."""
    tc = actors.TopicConfig("Sneaky", 1, 1)
    for name, value in fields.items():
        object.__setattr__(tc, name, value)
    return tc


@pytest.mark.parametrize(
    "fields",
    [
        {"topic_name": "../x"},
        {"topic_name": "a/b"},
        {"read_queue_nums": 1_000_000},
        {"write_queue_nums": 0},
        {"perm": 7},
        {"order": "yes"},
    ],
)
def test_the_broker_checks_a_topic_config_whatever_the_caller_built(
    cluster: actors.Cluster, fields: dict[str, Any]
) -> None:
    broker = cluster.broker("broker-a")
    before = ray.get(broker.topic_configs.remote())
    with pytest.raises((InvalidMessageError, InvalidConfigError)):
        ray.get(broker.create_topic.remote(_around_its_checks(**fields)))
    assert ray.get(broker.topic_configs.remote()) == before
    store = ray.get(broker.status.remote())["store_dir"]
    topics = json.loads((Path(store) / "config" / "topics.json").read_text())
    assert set(topics["topicConfigTable"]) == set(before)


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ("commit_offsets", ("../g", {("Good", 0): 0})),
        ("commit_offsets", ("g", [("Good", 0, 0)])),
        ("commit_offsets", ("g", {("../x", 0): 0})),
        ("fence_offsets", ("g", {("Good", -1): (1, 1)})),
        ("heartbeat", ("g", "c1", ["../x"])),
        ("reset_offsets", ("g", "Good", -5)),
        ("query_by_key", ("Good", "k", 0)),
        ("query_by_key", ("Good", 7)),
        ("offset_by_time", ("Good", 0, "now")),
        ("message_by_id", ("x" * 1000,)),
        ("read_dlq", ("g", -1)),
        ("delete_topic", ("../Good",)),
    ],
)
def test_every_broker_method_checks_its_arguments(
    cluster: actors.Cluster, call: str, args: tuple[Any, ...]
) -> None:
    broker = cluster.broker("broker-a")
    with pytest.raises(InvalidMessageError):
        ray.get(getattr(broker, call).remote(*args))
    assert ray.get(broker.ping.remote())  # still serving


@pytest.mark.parametrize(
    "topic", ["TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_trace"]
)
def test_system_topics_cannot_be_deleted_nor_changed(cluster: actors.Cluster, topic: str) -> None:
    broker = cluster.broker("broker-a")
    with pytest.raises(PermissionDeniedError, match="system topic"):
        ray.get(broker.delete_topic.remote(topic))
    with pytest.raises(PermissionDeniedError, match="system topic"):
        ray.get(broker.create_topic.remote(actors.TopicConfig(topic, 1, 1, perm=4)))


def test_the_cluster_and_broker_name_topics_are_system_topics(cluster: actors.Cluster) -> None:
    broker = cluster.broker("broker-a")
    status = ray.get(broker.status.remote())
    for name in (status["cluster"], status["broker_name"]):
        with pytest.raises(PermissionDeniedError, match="system topic"):
            ray.get(broker.delete_topic.remote(name))
