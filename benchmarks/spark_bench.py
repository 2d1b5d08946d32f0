"""Topic <-> Spark through RayDP, next to the driver-side baseline, in the same run.

Read:  topic -> counted Spark DataFrame with ``topic_to_spark(...).count()`` (broker ->
       Ray read tasks -> Spark executors), against the baseline a user writes without
       the bridge: a PullConsumer on the driver pulls every message, the rows go into a
       pandas DataFrame and ``spark.createDataFrame`` (Arrow on) makes it a DataFrame,
       which is counted.
Write: a cached Spark DataFrame -> topic with ``write_to_topic`` (Spark's Python
       workers encode and send, each with its own Producer), against ``toPandas()`` on
       the driver and ``Producer.send_batch`` from there.

Read and write run once per executor count in ``--executors`` (the Spark session is
restarted for each), so the output shows how they scale. Each timed run follows
an untimed warm-up of the same path (Spark's Python workers connecting to Ray,
JIT), so the figures are steady-state rates. The write and its baseline run
``--reps`` times, alternately, and the medians are compared: on a shared 2-core
machine a single pair of runs swings the ratio by 2x.

    python benchmarks/spark_bench.py [--rows 1000000] [--body-bytes 100] [--executors 1,2]
                                     [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import ray
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

import actors
from actors import PullStatus
from actors.bridge.spark import init_spark, stop_spark, topic_to_spark, write_to_topic
from storage import Message

NAMESPACE = "raymq-spark-bench"
TOPIC = "SparkBench"
TAGS = np.array(["TagA", "TagB", "TagC", "TagD"])
SPARK_TOPIC_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("broker_name", StringType()),
        StructField("queue_id", IntegerType()),
        StructField("queue_offset", LongType()),
        StructField("msg_id", StringType()),
        StructField("keys", StringType()),
        StructField("tags", StringType()),
        StructField("born_timestamp", LongType()),
        StructField("store_timestamp", LongType()),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("body", BinaryType()),
    ]
)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def produce(cluster: actors.Cluster, topic: str, rows: int, body_bytes: int) -> float:
    """``rows`` messages of random ``body_bytes``-byte bodies, written by Ray workers."""
    rng = np.random.default_rng(1)
    body = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(body_bytes), rows, [None, pa.py_buffer(rng.bytes(body_bytes * rows))]
    ).cast(pa.binary())
    table = pa.table({"body": body, "tag": pa.array(TAGS[np.arange(rows) % len(TAGS)])})
    step = -(-rows // 8)
    ds = ray.data.from_arrow([table.slice(i, step) for i in range(0, rows, step)])
    seconds, result = timed(
        lambda: write_to_topic(ds, topic, tag_col="tag", namespace=cluster.namespace)
    )
    assert result.rows == rows
    return seconds


def read_through_raydp(spark: SparkSession, cluster: actors.Cluster, rows: int) -> float:
    topic_to_spark(spark, TOPIC, namespace=cluster.namespace, end_offsets={0: 1000}).count()
    seconds, count = timed(
        lambda: topic_to_spark(spark, TOPIC, namespace=cluster.namespace).count()
    )
    assert count == rows, (count, rows)
    return seconds


def read_on_driver(spark: SparkSession, cluster: actors.Cluster, rows: int) -> float:
    """The baseline: pull everything on the driver, pandas, ``spark.createDataFrame``."""

    def run() -> int:
        consumer = cluster.pull_consumer("spark-bench-baseline")
        offsets = dict.fromkeys(consumer.fetch_subscribe_queues(TOPIC), 0)
        cols: dict[str, list[Any]] = {f.name: [] for f in SPARK_TOPIC_SCHEMA}
        while offsets:
            for result in consumer.pull_many(list(offsets.items()), 16_384):
                if result.status is not PullStatus.FOUND:
                    del offsets[result.queue]
                    continue
                offsets[result.queue] = result.next_offset
                broker = result.queue.broker_name
                for m in result.messages:
                    cols["topic"].append(m.topic)
                    cols["broker_name"].append(broker)
                    cols["queue_id"].append(m.queue_id)
                    cols["queue_offset"].append(m.queue_offset)
                    cols["msg_id"].append(m.msg_id)
                    cols["keys"].append(m.properties.get("KEYS"))
                    cols["tags"].append(m.tags)
                    cols["born_timestamp"].append(m.born_timestamp)
                    cols["store_timestamp"].append(m.store_timestamp)
                    cols["properties"].append(m.properties)
                    cols["body"].append(m.body)
        return spark.createDataFrame(pd.DataFrame(cols), SPARK_TOPIC_SCHEMA).count()

    seconds, count = timed(run)
    assert count == rows, (count, rows)
    return seconds


def spark_rows(spark: SparkSession, rows: int, body_bytes: int, partitions: int) -> DataFrame:
    """A cached DataFrame of ``rows`` rows: a ``body_bytes``-byte body and a tag."""
    i = F.col("id")
    body = F.substring(
        F.concat(F.sha2(i.cast("string"), 512), F.sha2(i.cast("string"), 512)), 1, body_bytes
    )
    df = spark.range(rows, numPartitions=partitions).select(
        body.cast("binary").alias("body"),
        F.element_at(F.array(*(F.lit(t) for t in TAGS)), (i % len(TAGS) + 1).cast("int")).alias(
            "tag"
        ),
    )
    df = df.cache()
    assert df.count() == rows
    return df


def topic_size(cluster: actors.Cluster, topic: str) -> int:
    consumer = cluster.pull_consumer("spark-bench-probe")
    return sum(consumer.max_offset(mq) for mq in consumer.fetch_subscribe_queues(topic))


def write_through_raydp(cluster: actors.Cluster, df: DataFrame, topic: str, rows: int) -> float:
    seconds, result = timed(
        lambda: write_to_topic(df, topic, tag_col="tag", namespace=cluster.namespace)
    )
    assert result.rows == rows and topic_size(cluster, topic) == rows
    return seconds


def write_from_driver(cluster: actors.Cluster, df: DataFrame, topic: str, rows: int) -> float:
    """The baseline: ``toPandas`` on the driver, ``Producer.send_batch`` from there."""

    def run() -> None:
        pdf = df.toPandas()
        producer = cluster.producer("spark-bench-driver")
        bodies, tags = pdf["body"].tolist(), pdf["tag"].tolist()
        for first in range(0, len(bodies), 10_000):
            producer.send_batch(
                [
                    Message(topic, bytes(b), tags=t)
                    for b, t in zip(bodies[first : first + 10_000], tags[first : first + 10_000])
                ]
            )
        producer.close()

    seconds, _ = timed(run)
    assert topic_size(cluster, topic) == rows
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--body-bytes", type=int, default=100)
    parser.add_argument("--executors", default="1,2", help="executor counts to run the read with")
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3, help="write runs, alternating")
    parser.add_argument("--num-cpus", type=int, default=4, help="logical CPUs of the local Ray")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    executor_counts = [int(x) for x in args.executors.split(",")]
    n = args.rows

    ray.init(
        address="local",
        num_cpus=args.num_cpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    results: dict[str, Any] = {
        "rows": n,
        "body_bytes": args.body_bytes,
        "read": {},
        "write": {},
        "write_runs": {},
    }
    with tempfile.TemporaryDirectory(prefix="raymq-spark-bench-") as tmp:
        cluster = actors.start_cluster(
            namespace=NAMESPACE,
            nameservers=1,
            brokers=args.brokers,
            store_root=tmp,
            topics=[actors.TopicConfig(TOPIC, 8 // args.brokers, 8 // args.brokers)],
            broker_options={
                "store": {
                    "commitlog_file_size": 256 << 20,
                    "index_hash_slots": 1_000_003,
                    "index_max_entries": 4_000_000,
                }
            },
        )
        try:
            results["produce_s"] = produce(cluster, TOPIC, n, args.body_bytes)
            for k, executors in enumerate(executor_counts):
                # A new app name each time: RayDP's master actor keeps the old one a while.
                spark = init_spark(
                    f"raymq-spark-bench-{executors}", num_executors=executors, executor_cores=1
                )
                try:
                    results["read"][f"raydp_{executors}x1"] = read_through_raydp(spark, cluster, n)
                    if k == 0:
                        results["read"]["driver_baseline"] = read_on_driver(spark, cluster, n)
                    df = spark_rows(spark, n, args.body_bytes, 4)
                    write_through_raydp(cluster, df, f"SparkBenchWarm{k}", n)
                    ours, base = [], []
                    for rep in range(args.reps):
                        ours.append(write_through_raydp(cluster, df, f"SparkBenchW{k}r{rep}", n))
                        if k == 0:
                            base.append(write_from_driver(cluster, df, f"SparkBenchW0b{rep}", n))
                    results["write"][f"raydp_{executors}x1"] = statistics.median(ours)
                    results["write_runs"][f"raydp_{executors}x1"] = ours
                    if base:
                        results["write"]["driver_baseline"] = statistics.median(base)
                        results["write_runs"]["driver_baseline"] = base
                    df.unpersist()
                finally:
                    stop_spark()
        finally:
            cluster.shutdown()
    ray.shutdown()

    print(
        f"Spark bridge, {n:,} messages of {args.body_bytes} B bodies, local Ray on {args.num_cpus} CPUs"
    )
    print(
        f"  produce (Ray Dataset -> topic, write_to_topic): {n / results['produce_s']:>10,.0f} rows/s"
    )
    for direction in ("read", "write"):
        base = results[direction]["driver_baseline"]
        label = "topic -> counted DataFrame" if direction == "read" else "DataFrame -> topic"
        print(f"  {label}:")
        for name, seconds in results[direction].items():
            ratio = base / seconds
            runs = results["write_runs"].get(name) if direction == "write" else None
            spread = f"  (median of {', '.join(f'{r:.2f}' for r in runs)})" if runs else ""
            print(
                f"    {name:<16} {seconds:7.2f}s {n / seconds:>10,.0f} rows/s  "
                f"{ratio:4.1f}x baseline{spread}"
            )
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
