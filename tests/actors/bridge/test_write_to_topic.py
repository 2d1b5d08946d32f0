"""Rows of a Spark DataFrame or a Ray Dataset produced into a topic by the workers, each once."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import ray
from pyspark.sql import functions as F

import actors
from actors.bridge.datasource import read_topic
from actors.bridge.spark import write_to_topic
from storage.errors import InvalidMessageError

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:DataFrame.sql_ctx is an internal property:UserWarning"),
]

N = 100_000  # 25 000 rows per task: several batches of DEFAULT_BATCH_ROWS each


def _read_back(cluster: actors.Cluster, topic: str, columns: list[str]) -> pa.Table:
    ds = read_topic(topic, namespace=cluster.namespace).select_columns(columns)
    return pa.concat_tables(ray.get(list(ds.to_arrow_refs())))


def test_100k_spark_rows_in_4_tasks_arrive_once_each(spark, raymq):
    raymq.admin.create_topic("Written", read_queue_nums=4, write_queue_nums=4)
    i = F.col("id")
    df = spark.range(N, numPartitions=4).select(
        F.lpad(i.cast("string"), 7, "0").cast("binary").alias("body"),
        F.element_at(F.array(F.lit("A"), F.lit("B"), F.lit("C")), (i % 3 + 1).cast("int")).alias(
            "tag"
        ),
        F.concat(F.lit("row-"), i.cast("string")).alias("key"),
    )

    result = write_to_topic(
        df, "Written", body_col="body", tag_col="tag", key_col="key", namespace=raymq.namespace
    )

    assert result.rows == N
    table = _read_back(raymq, "Written", ["body", "tags", "keys", "broker_name"])
    assert table.num_rows == N
    ids = np.sort(pc.cast(pc.cast(table.column("body"), pa.string()), pa.int64()).to_numpy())
    assert np.array_equal(ids, np.arange(N))  # every row once: none lost, none twice
    assert Counter(table.column("tags").to_pylist()) == {"A": 33_334, "B": 33_333, "C": 33_333}
    assert set(table.column("broker_name").to_pylist()) == {"broker-a", "broker-b"}
    rows = table.slice(0, 1000).to_pylist()
    assert all(r["keys"] == f"row-{int(r['body'])}" for r in rows)


def test_a_dataset_with_keys_tags_and_properties(raymq):
    rows = pa.table(
        {
            "payload": pa.array(["a", "bb", "ccc"]),
            "k": pa.array(["k1 k2", None, "k3"]),
            "t": pa.array([None, "T", "T"]),
            "props": pa.array(
                [[("region", "eu")], [], [("region", "us"), ("TAGS", "ignored")]],
                pa.map_(pa.string(), pa.string()),
            ),
        }
    )

    result = write_to_topic(
        ray.data.from_arrow(rows),
        "WrittenSmall",
        body_col="payload",
        key_col="k",
        tag_col="t",
        properties_col="props",
        namespace=raymq.namespace,
    )

    assert result.rows == 3
    back = _read_back(raymq, "WrittenSmall", ["body", "keys", "tags", "properties"])
    got = sorted(back.to_pylist(), key=lambda r: r["body"])
    assert [r["body"] for r in got] == [b"a", b"bb", b"ccc"]
    assert [r["keys"] for r in got] == ["k1 k2", None, "k3"]
    assert [r["tags"] for r in got] == [None, "T", "T"]
    assert [dict(r["properties"]).get("region") for r in got] == ["eu", None, "us"]
    assert dict(got[2]["properties"])["TAGS"] == "T"
    assert [m.body for m in raymq.admin.query_by_key("WrittenSmall", "k2")] == [b"a"]


def test_missing_columns_and_bad_rows_are_refused(spark, raymq):
    with pytest.raises(InvalidMessageError, match=r"column\(s\) \['nope'\] not in the data"):
        write_to_topic(
            ray.data.from_items([{"body": b"x"}]),
            "WrittenBad",
            tag_col="nope",
            namespace=raymq.namespace,
        )
    with pytest.raises(Exception, match="body of row 1 .* empty or null"):
        write_to_topic(
            ray.data.from_arrow(pa.table({"body": pa.array([b"x", b""])})),
            "WrittenBad",
            namespace=raymq.namespace,
        )
    with pytest.raises(InvalidMessageError, match="expected a ray.data.Dataset or a Spark"):
        write_to_topic([b"x"], "WrittenBad", namespace=raymq.namespace)


def test_a_bad_spark_row_fails_the_write_with_the_workers_error(spark, raymq):
    df = spark.createDataFrame([(b"x", "a"), (b"", "b")], "body binary, tag string")
    with pytest.raises(InvalidMessageError, match=r"column\(s\) \['nope'\] not in the data"):
        write_to_topic(df, "WrittenBadSpark", key_col="nope", namespace=raymq.namespace)
    with pytest.raises(InvalidMessageError, match=r"body of row 1 to 'WrittenBadSpark' is empty"):
        write_to_topic(df.coalesce(1), "WrittenBadSpark", namespace=raymq.namespace)
