"""Exactly once through Spark (issue #24): ``write_to_topic(transactional=True)`` is all or
nothing and counts a retried Spark task once; ``stream_to_spark(sink_topic=...)`` killed
and restarted at random points writes every input to the sink exactly once."""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Iterator

import pyarrow as pa
import pytest
import ray
from pyspark.sql import functions as F
from raymq_testkit import wait_until

import actors
from actors.bridge.datasource import read_topic
from actors.bridge.spark import write_to_topic
from actors.bridge.streaming import BatchProgress, stream_to_spark
from storage import Message

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:DataFrame.sql_ctx is an internal property:UserWarning"),
]


@pytest.fixture(scope="module")
def txn_cluster(raymq: actors.Cluster, tmp_path_factory: pytest.TempPathFactory) -> actors.Cluster:
    """The package's cluster with its transaction coordinator logging to a temp dir (the
    first TransactionalProducer of a namespace creates it)."""
    first = raymq.transactional_producer(
        "spark-txn-setup",
        "spark-txn-setup",
        coordinator_log_dir=str(tmp_path_factory.mktemp("txnlog")),
    )
    first.close()
    return raymq


def _bodies(cluster: actors.Cluster, topic: str) -> Counter[bytes]:
    ds = read_topic(topic, namespace=cluster.namespace).select_columns(["body"])
    tables = ray.get(list(ds.to_arrow_refs()))
    return Counter(pa.concat_tables(tables).column("body").to_pylist()) if tables else Counter()


def _pending(cluster: actors.Cluster, topic: str) -> int:
    """Half messages for ``topic`` not ended yet, on every broker."""
    return sum(
        1
        for name in ("broker-a", "broker-b")
        for h in ray.get(cluster.broker(name).pending_transactions.remote())
        if h["topic"] == topic
    )


def _die_once(gcs: str, namespace: str, topic: str, partition: int, after: int):
    """A ``mapInArrow`` step whose task ``partition`` (attempt 0) passes ``after`` rows on,
    waits until they are stored as half messages (the writer sends groups of 4 batches:
    ``after`` >= 4 ``batch_rows``), then kills its Python worker: the task fails after
    sending, and Spark runs it again (attempt 1 passes everything)."""

    def sent() -> bool:
        brokers = [ray.get_actor(b, namespace=namespace) for b in ("broker-a", "broker-b")]
        pending = ray.get([b.pending_transactions.remote() for b in brokers])
        return sum(h["topic"] == topic for p in pending for h in p) >= after

    def step(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        task = TaskContext.get()
        doomed = task.partitionId() == partition and task.attemptNumber() == 0
        passed = 0
        for batch in batches:
            if not doomed or passed + batch.num_rows < after:
                passed += batch.num_rows
                yield batch
                continue
            yield batch.slice(0, after - passed)
            if not ray.is_initialized():
                ray.init(address=gcs, logging_level="WARNING", log_to_driver=False)
            deadline = time.monotonic() + 60  # (raymq_testkit is not on the workers' path)
            while not sent() and time.monotonic() < deadline:
                time.sleep(0.05)
            os._exit(1)

    return step


def _numbered(spark, n: int, partitions: int):
    return spark.range(n, numPartitions=partitions).select(
        F.concat(F.lit("row-"), F.col("id").cast("string")).cast("binary").alias("body"),
        F.concat(F.lit("k-"), F.col("id").cast("string")).alias("key"),
    )


def test_a_transactional_write_shows_all_rows_once_though_a_task_died_after_sending(
    spark, txn_cluster
):
    cluster = txn_cluster
    cluster.admin.create_topic("TxnWrite", read_queue_nums=2, write_queue_nums=2)
    gcs = ray.get_runtime_context().gcs_address
    df = _numbered(spark, 2_000, 2).mapInArrow(
        _die_once(gcs, cluster.namespace, "TxnWrite", partition=0, after=400),
        "body binary, key string",
    )

    result = write_to_topic(
        df,
        "TxnWrite",
        key_col="key",
        transactional=True,
        namespace=cluster.namespace,
        batch_rows=100,
    )

    assert result.rows == 2_000 and result.transaction is not None
    bodies = _bodies(cluster, "TxnWrite")
    assert bodies == Counter({b"row-%d" % i: 1 for i in range(2_000)})
    # the dead attempt's 400 half messages were not in the commit: the check service
    # rolls them back (the coordinator answers abort for a done transaction's strays)
    wait_until(lambda: _pending(cluster, "TxnWrite") == 0, timeout_s=20, what="strays rolled back")
    assert _bodies(cluster, "TxnWrite") == bodies


def test_a_failed_transactional_write_shows_nothing(spark, txn_cluster):
    cluster = txn_cluster
    cluster.admin.create_topic("TxnWriteFail", read_queue_nums=2, write_queue_nums=2)

    def fail_late(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        for batch in batches:
            yield batch  # partition 0 sends all its rows, partition 1 half of them
            if TaskContext.get().partitionId() == 1:
                raise RuntimeError("transform failed")

    df = _numbered(spark, 1_000, 2).mapInArrow(fail_late, "body binary, key string")
    with pytest.raises(Exception, match="transform failed"):
        write_to_topic(
            df, "TxnWriteFail", transactional=True, namespace=cluster.namespace, batch_rows=50
        )
    assert _pending(cluster, "TxnWriteFail") == 0  # the abort rolled every half message back
    assert _bodies(cluster, "TxnWriteFail") == Counter()
    consumer = cluster.pull_consumer("probe-fail")
    assert all(
        consumer.max_offset(mq) == 0 for mq in consumer.fetch_subscribe_queues("TxnWriteFail")
    )


class Killed(BaseException):
    """The driver's query dying at once: nothing aborted, nothing marked done."""


def test_a_stream_to_a_sink_topic_killed_at_random_points_writes_each_input_once(
    spark, txn_cluster
):
    cluster = txn_cluster
    n, per_batch = 600, 150
    cluster.admin.create_topic("EoSparkIn", read_queue_nums=2, write_queue_nums=2)
    cluster.admin.create_topic("EoSparkOut", read_queue_nums=2, write_queue_nums=2)
    feed = cluster.producer("eo-spark-feed")
    feed.send_batch([Message("EoSparkIn", b"%d" % i) for i in range(n // 2)])
    gcs = ray.get_runtime_context().gcs_address
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    # 5 kills of the driver's query at random steps of random batches, in order
    kills = sorted(
        (rng.randrange(n // per_batch), rng.choice(["planned", "written", "committed"]))
        for _ in range(5)
    )
    pending_kills = list(kills)
    executor_kill_batch = rng.randrange(n // per_batch)

    def on_step(step: str, batch_id: int) -> None:
        if pending_kills and pending_kills[0] == (batch_id, step):
            pending_kills.pop(0)
            raise Killed(f"killed at {step} of batch {batch_id}")

    def transform(df, batch_id: int):
        out = df.select(F.concat(F.lit("out-"), F.col("body")).alias("body"), "keys")
        if batch_id == executor_kill_batch:  # an executor dies after sending, too
            out = out.mapInArrow(
                _die_once(gcs, cluster.namespace, "EoSparkOut", 0, 40), "body binary, keys string"
            )
        return out

    progress: list[BatchProgress] = []
    runs = 0
    while True:
        runs += 1
        assert runs <= 12, f"seed {seed}: no end after {runs} runs (kills {kills})"
        query = stream_to_spark(
            spark,
            "EoSparkIn",
            "eo-spark",
            transform,
            sink_topic="EoSparkOut",
            sink_options={"key_col": "keys", "batch_rows": 10},
            namespace=cluster.namespace,
            max_messages_per_batch=per_batch,
            available_now=True,
            num_partitions=2,
            on_step=on_step,
            on_progress=progress.append,
        )
        assert query.await_termination(timeout_s=120, raise_error=False)
        if runs == 2:  # more input arrives while the query is down
            feed.send_batch([Message("EoSparkIn", b"%d" % i) for i in range(n // 2, n)])
        if isinstance(query.exception, Killed):
            continue
        assert query.exception is None, f"seed {seed}"
        if pending_kills or runs < 3:
            continue  # a kill scheduled for a batch not reached yet: run again
        break
    feed.close()

    out = _bodies(cluster, "EoSparkOut")
    dupes = {b: c for b, c in out.items() if c != 1}
    assert not dupes, f"seed {seed}, kills {kills}: duplicated {dupes}"
    assert set(out) == {b"out-%d" % i for i in range(n)}, f"seed {seed}, kills {kills}"
    consumer = cluster.pull_consumer("eo-spark")
    committed = consumer.fetch_offsets("EoSparkIn")
    assert sum(committed.values()) == n
    assert _pending(cluster, "EoSparkOut") == 0 or wait_until(
        lambda: _pending(cluster, "EoSparkOut") == 0, timeout_s=20, what="no half left"
    )
    assert all(p.output == p.messages for p in progress)  # one output row per input
    assert all(p.transaction for p in progress)
