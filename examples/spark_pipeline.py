"""RayMQ -> Spark -> RayMQ: revenue per product and minute from an orders topic.

Starts a private local Ray instance with a RayMQ cluster (1 NameServer, 2 brokers,
stores in a temporary directory) and Spark on it through RayDP. A producer
sends JSON orders to the ``orders`` topic; a PySpark job reads the topic
(broker -> Ray read tasks -> Spark executors, never through this driver),
sums revenue per product and minute, and writes the result both to the
``revenue`` topic (produced by Spark's Python workers) and to Parquet; then it reads
``revenue`` back from RayMQ, prints it, and checks it against what was sent.

    python examples/spark_pipeline.py [--orders N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import ray
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

import actors
from actors.bridge.spark import init_spark, stop_spark, topic_to_spark, write_to_topic
from storage import Message

NAMESPACE = "raymq-spark-pipeline"
PRODUCTS = {  # product -> unit price in cents
    "espresso": 250,
    "latte": 420,
    "croissant": 310,
    "bagel": 280,
    "tea": 190,
    "muffin": 350,
}
ORDER = StructType(
    [
        StructField("order_id", LongType()),
        StructField("product", StringType()),
        StructField("quantity", IntegerType()),
        StructField("price_cents", IntegerType()),
        StructField("ts", LongType()),
    ]
)
REVENUE = StructType(
    [
        StructField("product", StringType()),
        StructField("minute", StringType()),
        StructField("orders", LongType()),
        StructField("revenue_cents", LongType()),
    ]
)


def produce_orders(cluster: actors.Cluster, n: int) -> dict[tuple[str, str], int]:
    """``n`` orders over the last 10 minutes; the revenue per (product, minute) they make."""
    rng = random.Random(42)
    first_minute = (int(time.time()) // 60 - 10) * 60_000
    expected: dict[tuple[str, str], int] = defaultdict(int)
    producer = cluster.producer("pos-terminals")
    batch: list[Message] = []
    for i in range(n):
        product = rng.choice(list(PRODUCTS))
        quantity = rng.randint(1, 4)
        ts = first_minute + i * 600_000 // n
        order = {
            "order_id": i,
            "product": product,
            "quantity": quantity,
            "price_cents": PRODUCTS[product],
            "ts": ts,
        }
        minute = time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts // 1000))
        expected[(product, minute)] += quantity * PRODUCTS[product]
        batch.append(Message("orders", json.dumps(order).encode(), tags=product, keys=f"o-{i}"))
        if len(batch) == 5_000:
            producer.send_batch(batch)
            batch = []
    if batch:
        producer.send_batch(batch)
    producer.close()
    return dict(expected)


def revenue_per_product_minute(orders: DataFrame) -> DataFrame:
    parsed = orders.select(F.from_json(F.col("body").cast("string"), ORDER).alias("o")).select(
        "o.*"
    )
    minute = F.date_format(F.timestamp_millis("ts"), "yyyy-MM-dd HH:mm")
    return (
        parsed.groupBy("product", minute.alias("minute"))
        .agg(
            F.count("*").alias("orders"),
            F.sum(F.col("quantity") * F.col("price_cents")).cast("long").alias("revenue_cents"),
        )
        .orderBy("minute", "product")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=60_000)
    parser.add_argument("--out", default=None, help="directory for the Parquet output")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("raymq").setLevel(logging.WARNING)

    started = time.perf_counter()
    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="WARNING")
    ray.data.DataContext.get_current().enable_progress_bars = False
    with tempfile.TemporaryDirectory(prefix="raymq-spark-pipeline-") as tmp:
        out = Path(args.out or tmp) / "revenue.parquet"
        cluster = actors.start_cluster(
            namespace=NAMESPACE,
            nameservers=1,
            brokers=2,
            store_root=f"{tmp}/store",
            topics=[
                actors.TopicConfig("orders", read_queue_nums=4, write_queue_nums=4),
                actors.TopicConfig("revenue", read_queue_nums=1, write_queue_nums=1),
            ],
            broker_options={
                "store": {"commitlog_file_size": 64 << 20, "index_max_entries": 1_000_000}
            },
        )
        spark = init_spark(
            "raymq-spark-pipeline",
            num_executors=1,
            executor_cores=1,
            configs={"spark.sql.session.timeZone": "UTC"},
        )
        try:
            t0 = time.perf_counter()
            expected = produce_orders(cluster, args.orders)
            produced_s = time.perf_counter() - t0

            t0 = time.perf_counter()
            orders = topic_to_spark(spark, "orders", namespace=NAMESPACE)
            revenue = revenue_per_product_minute(orders).cache()
            rows = revenue.count()
            revenue.write.mode("overwrite").parquet(str(out))
            sent = write_to_topic(
                revenue.select(
                    F.to_json(F.struct(*REVENUE.names)).alias("body"),
                    F.col("product").alias("key"),
                    F.lit("revenue-per-minute").alias("tag"),
                ),
                "revenue",
                body_col="body",
                key_col="key",
                tag_col="tag",
                namespace=NAMESPACE,
            )
            job_s = time.perf_counter() - t0

            back = (
                topic_to_spark(spark, "revenue", namespace=NAMESPACE)
                .select(F.from_json(F.col("body").cast("string"), REVENUE).alias("r"), "msg_id")
                .select("r.*", "msg_id")
                .orderBy("minute", "product")
            )
            result = back.toPandas()
            from_parquet = spark.read.parquet(str(out)).count()
        finally:
            stop_spark()
            cluster.shutdown()
    ray.shutdown()

    print(
        f"RayMQ -> Spark -> RayMQ: {args.orders:,} orders produced in {produced_s:.1f}s, "
        f"revenue job (read, aggregate, Parquet, produce) in {job_s:.1f}s"
    )
    print(f"  {rows} (product, minute) rows -> topic 'revenue' ({sent.rows} messages) and {out}")
    print("  read back from topic 'revenue':")
    print(result.drop(columns=["msg_id"]).to_string(index=False, max_rows=20))
    got = {(r.product, r.minute): r.revenue_cents for r in result.itertuples()}
    problems = []
    if got != expected:
        problems.append(
            f"revenue differs from what was sent in {len(set(got) ^ set(expected))} rows"
        )
    if int(result["orders"].sum()) != args.orders:
        problems.append(f"{int(result['orders'].sum())} orders counted, {args.orders} sent")
    if from_parquet != rows:
        problems.append(f"Parquet holds {from_parquet} rows, expected {rows}")
    if problems:
        print("FAILED: " + "; ".join(problems))
        return 1
    total = sum(expected.values()) / 100
    print(
        f"  total revenue {total:,.2f} over {args.orders:,} orders: matches what was sent; "
        f"Parquet has the same {rows} rows; done in {time.perf_counter() - started:.0f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
