"""A topic read into a Ray Dataset and a Spark DataFrame: every message, unchanged, once."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest
import ray

import actors
from actors.bridge.datasource import TopicDatasource, plan_topic_read, read_topic
from actors.bridge.spark import TOPIC_SCHEMA, topic_to_spark
from rebalance import MessageQueue
from storage import Message
from storage.errors import InvalidMessageError

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:DataFrame.sql_ctx is an internal property:UserWarning"),
]

N = 100_000
TOPIC = "Orders100k"
TAGS = ("TagA", "TagB", "TagC", None)


@dataclass(frozen=True)
class Sent:
    queue: list[tuple[str, int]]  # (broker, queue id) of message i
    tags: list[str | None]
    bodies: dict[str, bytes]  # msg id -> body


def _table(ds) -> pa.Table:
    return pa.concat_tables(ray.get(list(ds.to_arrow_refs())))


@pytest.fixture(scope="module")
def sent(raymq: actors.Cluster) -> Sent:
    """100 000 messages over 8 queues (4 on each broker), bodies of 1-511 random bytes."""
    raymq.admin.create_topic(TOPIC, read_queue_nums=4, write_queue_nums=4)
    rng = np.random.default_rng(11)
    lengths = rng.integers(1, 512, N)
    producer = raymq.producer("read-test-producer")
    queue: list[tuple[str, int]] = []
    bodies: dict[str, bytes] = {}
    for first in range(0, N, 10_000):
        msgs = [
            Message(TOPIC, os.urandom(int(lengths[i])), tags=TAGS[i % 4], keys=f"order-{i}")
            for i in range(first, first + 10_000)
        ]
        for m, r in zip(msgs, producer.send_batch(msgs)):
            queue.append((r.message_queue.broker_name, r.message_queue.queue_id))
            bodies[r.msg_id] = m.body
    producer.close()
    return Sent(queue, [TAGS[i % 4] for i in range(N)], bodies)


def test_spark_counts_per_queue_and_tag_equal_what_was_sent(spark, raymq, sent):
    df = topic_to_spark(spark, TOPIC, namespace=raymq.namespace)

    per_queue = {
        (r["broker_name"], r["queue_id"]): r["count"]
        for r in df.groupBy("broker_name", "queue_id").count().collect()
    }
    per_tag = {r["tags"]: r["count"] for r in df.groupBy("tags").count().collect()}

    assert len(per_queue) == 8
    assert per_queue == Counter(sent.queue)
    assert per_tag == Counter(sent.tags)
    assert df.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism


def test_spark_bodies_are_byte_identical(spark, raymq, sent):
    df = topic_to_spark(spark, TOPIC, namespace=raymq.namespace, num_partitions=3)

    got = df.select("msg_id", "body", "keys", "properties").toPandas()

    assert len(got) == N
    assert dict(zip(got["msg_id"], got["body"])) == sent.bodies
    assert got["keys"].str.startswith("order-").all()
    assert all(p["KEYS"] == k for p, k in zip(got["properties"][:100], got["keys"][:100]))


def test_dataset_has_the_topic_schema_and_queue_order(raymq, sent):
    table = _table(read_topic(TOPIC, namespace=raymq.namespace, pull_batch_size=5_000))

    assert table.schema == TOPIC_SCHEMA
    assert table.num_rows == N
    for (broker, qid), count in Counter(sent.queue).items():
        mine = table.filter(
            pa.compute.and_(
                pa.compute.equal(table.column("broker_name"), broker),
                pa.compute.equal(table.column("queue_id"), qid),
            )
        )
        assert sorted(mine.column("queue_offset").to_pylist()) == list(range(count))


def test_one_read_task_per_queue_or_per_offset_range(raymq, sent):
    ranges = plan_topic_read(TOPIC, namespace=raymq.namespace)

    assert len(TopicDatasource(ranges).get_read_tasks(200)) == 8
    split = TopicDatasource(ranges, rows_per_task=5_000).get_read_tasks(1)
    assert len(split) == sum(-(-r.count // 5_000) for r in ranges)
    assert sum(t.metadata.num_rows for t in split) == N
    ds = read_topic(TOPIC, namespace=raymq.namespace, rows_per_task=20_000).materialize()
    assert ds.num_blocks() == sum(-(-r.count // 20_000) for r in ranges)
    assert ds.count() == N


def test_read_from_committed_offsets_to_given_ends(raymq, sent):
    consumer = raymq.pull_consumer("read-test-group")
    queues = consumer.fetch_subscribe_queues(TOPIC)
    consumer.commit_offsets({mq: 100 * (i + 1) for i, mq in enumerate(queues)})
    ends = {mq: 1_000 + i for i, mq in enumerate(queues)}

    table = _table(
        read_topic(TOPIC, namespace=raymq.namespace, group="read-test-group", end_offsets=ends)
    )

    assert table.num_rows == sum(1_000 + i - 100 * (i + 1) for i in range(len(queues)))
    for i, mq in enumerate(queues):
        offsets = table.filter(
            pa.compute.and_(
                pa.compute.equal(table.column("broker_name"), mq.broker_name),
                pa.compute.equal(table.column("queue_id"), mq.queue_id),
            )
        ).column("queue_offset")
        assert sorted(offsets.to_pylist()) == list(range(100 * (i + 1), 1_000 + i))


def test_a_tag_subscription_reads_only_those_tags(raymq, sent):
    table = _table(read_topic(TOPIC, namespace=raymq.namespace, tags="TagA || TagC"))

    assert Counter(table.column("tags").to_pylist()) == {
        t: c for t, c in Counter(sent.tags).items() if t in ("TagA", "TagC")
    }


def test_empty_reads_keep_the_schema(spark, raymq, sent):
    ds = read_topic(TOPIC, namespace=raymq.namespace, start_offsets="latest")
    df = topic_to_spark(spark, TOPIC, namespace=raymq.namespace, start_offsets="latest")

    assert ds.count() == 0
    assert df.count() == 0
    assert [f.name for f in df.schema] == TOPIC_SCHEMA.names


def test_bad_read_arguments_are_refused(raymq, sent):
    with pytest.raises(InvalidMessageError, match="needs a consumer group"):
        plan_topic_read(TOPIC, namespace=raymq.namespace, start_offsets="committed")
    with pytest.raises(InvalidMessageError, match="pull_batch_size=0"):
        read_topic(TOPIC, namespace=raymq.namespace, pull_batch_size=0)
    with pytest.raises(InvalidMessageError, match="subscription"):
        read_topic(TOPIC, namespace=raymq.namespace, tags="A || ")
    start = {MessageQueue(TOPIC, "broker-a", 0): 5}
    ranges = plan_topic_read(TOPIC, namespace=raymq.namespace, start_offsets=start)
    assert {(r.broker_name, r.queue_id): r.start for r in ranges}[("broker-a", 0)] == 5
