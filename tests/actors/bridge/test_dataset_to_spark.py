"""A topic's messages in a Ray Dataset become a Spark DataFrame with nothing lost or changed."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest
import ray
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
)

from actors.bridge.spark import TOPIC_SCHEMA, dataset_to_spark
from storage.errors import RayMQError

# PySpark 3.5 and Ray Data warn about their own internals (distutils, pandas 3, sql_ctx).
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:DataFrame.sql_ctx is an internal property:UserWarning"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
]

SPARK_TYPES = [
    ("topic", StringType()),
    ("broker_name", StringType()),
    ("queue_id", IntegerType()),
    ("queue_offset", LongType()),
    ("msg_id", StringType()),
    ("keys", StringType()),
    ("tags", StringType()),
    ("born_timestamp", LongType()),
    ("store_timestamp", LongType()),
    ("properties", MapType(StringType(), StringType())),
    ("body", BinaryType()),
]


def test_topic_schema_maps_to_spark_types(messages_df):
    assert [(f.name, f.dataType) for f in messages_df.schema] == SPARK_TYPES
    assert messages_df.rdd.getNumPartitions() == 2


def test_counts_per_queue_and_tag_are_equal(messages_df, messages):
    df = messages_df

    per_queue = {r["queue_id"]: r["count"] for r in df.groupBy("queue_id").count().collect()}
    per_tag = {r["tags"]: r["count"] for r in df.groupBy("tags").count().collect()}

    assert per_queue == Counter(messages.column("queue_id").to_pylist())
    assert per_tag == Counter(messages.column("tags").to_pylist())
    assert df.count() == messages.num_rows


def test_every_row_arrives_unchanged_bodies_byte_for_byte(messages_df, messages):
    got = messages_df.toPandas().sort_values(["queue_offset", "queue_id"], ignore_index=True)
    want = messages.to_pandas(maps_as_pydicts="strict")

    assert got["body"].map(type).eq(bytes).all()
    assert got["body"].tolist() == want["body"].tolist()
    pd.testing.assert_frame_equal(got, want)


def test_pandas_blocks_and_many_small_blocks_are_converted(spark):
    frame = pd.DataFrame(
        {"queue_id": range(1000), "body": [bytes([k % 256]) * 3 for k in range(1000)]}
    )
    ds = ray.data.from_pandas([frame.iloc[k : k + 5] for k in range(0, 1000, 5)])

    df = dataset_to_spark(spark, ds)

    assert df.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism
    assert sorted(df.toPandas()["body"]) == sorted(frame["body"])


def test_empty_topic_keeps_its_schema(spark):
    df = dataset_to_spark(spark, ray.data.from_arrow(TOPIC_SCHEMA.empty_table()))

    assert df.count() == 0
    assert [(f.name, f.dataType) for f in df.schema] == SPARK_TYPES


def test_num_partitions_must_be_positive(spark, messages):
    with pytest.raises(RayMQError, match="num_partitions=0"):
        dataset_to_spark(spark, ray.data.from_arrow(messages.slice(0, 10)), num_partitions=0)


def test_more_partitions_than_rows(spark, messages):
    df = dataset_to_spark(spark, ray.data.from_arrow(messages.slice(0, 3)), num_partitions=4)

    assert df.rdd.getNumPartitions() == 4
    assert sorted(df.toPandas()["queue_offset"]) == [0, 0, 0]
    assert df.toPandas()["properties"][0] == {"KEYS": "order-0", "UNIQ_KEY": f"{0:032X}"}
