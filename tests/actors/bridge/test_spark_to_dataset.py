"""A DataFrame of the RayDP session becomes a Ray Dataset with the topic's types and rows."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest
import ray
from pyspark.sql import functions as F

from actors.bridge.spark import TOPIC_SCHEMA, spark_to_dataset
from storage.errors import RayMQError

# PySpark 3.5 and Ray Data warn about their own internals (distutils, pandas 3, sql_ctx).
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:DataFrame.sql_ctx is an internal property:UserWarning"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
]

N = 100_000


def _to_table(ds: ray.data.Dataset) -> pa.Table:
    return pa.concat_tables(ray.get(list(ds.to_arrow_refs())))


def _spark_messages(spark, n: int):
    """Messages built by Spark itself: body = sha256(str(i)), empty every 1000th."""
    i = F.col("id")
    tags = F.element_at(
        F.array(F.lit("TagA"), F.lit("TagB"), F.lit("TagC")), (i % 3 + 1).cast("int")
    )
    keys = F.concat(F.lit("order-"), i.cast("string"))
    body = F.when(i % 1000 == 0, F.lit(b"")).otherwise(F.unhex(F.sha2(i.cast("string"), 256)))
    return spark.range(n, numPartitions=4).select(
        F.lit("Orders").alias("topic"),
        F.lit("broker-a").alias("broker_name"),
        (i % 8).cast("int").alias("queue_id"),
        (i / 8).cast("long").alias("queue_offset"),
        F.lpad(F.hex(i), 32, "0").alias("msg_id"),
        keys.alias("keys"),
        tags.alias("tags"),
        (i + 1_700_000_000_000).alias("born_timestamp"),
        (i + 1_700_000_000_003).alias("store_timestamp"),
        F.create_map(F.lit("KEYS"), keys, F.lit("TAGS"), tags).alias("properties"),
        body.alias("body"),
    )


def test_spark_rows_arrive_with_the_topic_schema(spark):
    ds = spark_to_dataset(_spark_messages(spark, N), num_blocks=2)

    table = _to_table(ds).sort_by([("queue_offset", "ascending"), ("queue_id", "ascending")])

    assert [(f.name, f.type) for f in table.schema] == [(f.name, f.type) for f in TOPIC_SCHEMA]
    assert ds.num_blocks() == 2
    assert table.num_rows == N
    bodies = table.column("body").to_pylist()
    assert bodies[0] == b""
    assert bodies[1] == hashlib.sha256(b"1").digest()
    assert all(
        bodies[k] == (b"" if k % 1000 == 0 else hashlib.sha256(str(k).encode()).digest())
        for k in range(N)
    )
    assert table.column("properties")[7].as_py() == [("KEYS", "order-7"), ("TAGS", "TagB")]
    assert table.column("queue_id").to_pylist()[:9] == [0, 1, 2, 3, 4, 5, 6, 7, 0]


def test_round_trip_dataset_spark_dataset_is_identity(messages_df, messages):
    back = _to_table(spark_to_dataset(messages_df)).cast(TOPIC_SCHEMA)

    back = back.sort_by([("queue_offset", "ascending"), ("queue_id", "ascending")])
    assert back.equals(messages)


def test_num_blocks_must_be_positive(spark):
    with pytest.raises(RayMQError, match="num_blocks=0"):
        spark_to_dataset(spark.range(3), num_blocks=0)
