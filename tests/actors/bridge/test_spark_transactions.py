"""Exactly once through Spark (issue #24): ``write_to_topic(transactional=True)`` is all or
nothing and counts a retried Spark task once; ``stream_to_spark(sink_topic=...)`` killed
and restarted at random points, its broker SIGKILLed, or its Spark executor killed
mid-task writes every input to the sink exactly once."""

from __future__ import annotations

import os
import random
import threading
from collections import Counter
from collections.abc import Iterator

import pyarrow as pa
import pytest
import ray
from pyspark.sql import functions as F
from raymq_testkit import wait_until

from actors.bridge.spark import write_to_topic
from actors.bridge.streaming import BatchProgress, stream_to_spark
from storage import Message
from storage.errors import InvalidMessageError

from .txn_probes import bodies, pending, txn_stats

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:DataFrame.sql_ctx is an internal property:UserWarning"),
]


def _fail_once_after(partition: int, after: int):
    """A ``mapInArrow`` step that empties the body of row ``after`` of task ``partition``'s
    first attempt: the writer there sends its first group of 4 batches (``after`` rows
    when ``after`` is 4 ``batch_rows`` and a bit), then fails on that row. Spark runs the
    task again and attempt 1 passes every row as it is."""

    def step(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        task = TaskContext.get()
        doomed = task.partitionId() == partition and task.attemptNumber() == 0
        seen = 0
        for batch in batches:
            if doomed and seen <= after < seen + batch.num_rows:
                bodies = batch.column(0).to_pylist()
                bodies[after - seen] = b""
                batch = pa.RecordBatch.from_arrays(
                    [pa.array(bodies, pa.binary()), *batch.columns[1:]], schema=batch.schema
                )
            seen += batch.num_rows
            yield batch

    return step


def _numbered(spark, n: int, partitions: int):
    return spark.range(n, numPartitions=partitions).select(
        F.concat(F.lit("row-"), F.col("id").cast("string")).cast("binary").alias("body"),
        F.concat(F.lit("k-"), F.col("id").cast("string")).alias("key"),
    )


def test_a_transactional_write_shows_all_rows_once_though_a_task_failed_after_sending(
    spark, txn_cluster
):
    cluster = txn_cluster
    cluster.admin.create_topic("TxnWrite", read_queue_nums=2, write_queue_nums=2)
    df = _numbered(spark, 2_000, 2).mapInArrow(
        _fail_once_after(partition=0, after=450), "body binary, key string"
    )
    before = txn_stats(cluster)

    result = write_to_topic(
        df,
        "TxnWrite",
        key_col="key",
        transactional=True,
        namespace=cluster.namespace,
        batch_rows=100,
    )

    assert result.rows == 2_000 and result.transaction is not None
    seen = bodies(cluster, "TxnWrite")
    assert seen == Counter({b"row-%d" % i: 1 for i in range(2_000)})
    # the failed attempt's 400 half messages were not in the commit: the check service
    # rolls them back (the coordinator answers abort for a done transaction's strays)
    wait_until(lambda: pending(cluster, "TxnWrite") == 0, timeout_s=20, what="strays rolled back")
    after = txn_stats(cluster)
    assert after["txn_committed"] - before["txn_committed"] == 2_000
    assert after["txn_rolled_back"] - before["txn_rolled_back"] == 400
    assert bodies(cluster, "TxnWrite") == seen


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
    assert pending(cluster, "TxnWriteFail") == 0  # the abort rolled every half message back
    assert bodies(cluster, "TxnWriteFail") == Counter()
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
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    # 10 kills of the driver's query at distinct random steps of its batches, in the order
    # they can happen (a batch runs planned -> written -> committed, again after a kill
    # before its commit)
    steps = ["planned", "written", "committed"]
    points = [(b, i) for b in range(n // per_batch) for i in range(len(steps))]
    kills = [(b, steps[i]) for b, i in sorted(rng.sample(points, 10))]
    pending_kills = list(kills)
    executor_fail_batch = rng.randrange(n // per_batch)

    def on_step(step: str, batch_id: int) -> None:
        if pending_kills and pending_kills[0] == (batch_id, step):
            pending_kills.pop(0)
            raise Killed(f"killed at {step} of batch {batch_id}")

    def transform(df, batch_id: int):
        out = df.select(F.concat(F.lit("out-"), F.col("body")).cast("binary").alias("body"))
        if batch_id == executor_fail_batch:  # a Spark task fails after sending, too
            out = out.mapInArrow(_fail_once_after(0, 45), "body binary")
        return out

    progress: list[BatchProgress] = []
    runs = 0
    while True:
        runs += 1
        assert runs <= 16, f"seed {seed}: no end after {runs} runs (kills {kills})"
        query = stream_to_spark(
            spark,
            "EoSparkIn",
            "eo-spark",
            transform,
            sink_topic="EoSparkOut",
            sink_options={"batch_rows": 10},
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

    out = bodies(cluster, "EoSparkOut")
    dupes = {b: c for b, c in out.items() if c != 1}
    assert not dupes, f"seed {seed}, kills {kills}: duplicated {dupes}"
    assert set(out) == {b"out-%d" % i for i in range(n)}, f"seed {seed}, kills {kills}"
    consumer = cluster.pull_consumer("eo-spark")
    committed = consumer.fetch_offsets("EoSparkIn")
    assert sum(committed.values()) == n
    assert pending(cluster, "EoSparkOut") == 0 or wait_until(
        lambda: pending(cluster, "EoSparkOut") == 0, timeout_s=20, what="no half left"
    )
    assert all(p.output == p.messages for p in progress)  # one output row per input
    assert all(p.transaction for p in progress)


def test_a_stream_to_a_sink_topic_whose_broker_is_sigkilled_writes_each_input_once(
    spark, make_cluster, tmp_path
):
    # the only broker (SYNC_FLUSH: what it acknowledged survives) is SIGKILLed three times
    # while the query runs: before its executors read and send a batch, after they sent it
    # (the commit meets a dead broker), after the commit (the checkpoint does); Ray
    # restarts it in place and it recovers its store each time, and the query rides
    # through each restart
    cluster = make_cluster(
        nameservers=1,
        brokers=1,
        broker_options={
            "store": {"flush_disk_type": "SYNC_FLUSH"},
            "transaction_check_interval_s": 0.5,
            "transaction_timeout_s": 1.0,
        },
    )
    first = cluster.transactional_producer(
        "eo-kill-setup", "eo-kill-setup", coordinator_log_dir=str(tmp_path / "txnlog")
    )
    first.close()
    n, per_batch = 300, 100
    cluster.admin.create_topic("EoKillIn", read_queue_nums=2, write_queue_nums=2)
    cluster.admin.create_topic("EoKillOut", read_queue_nums=2, write_queue_nums=2)
    feed = cluster.producer("eo-kill-feed")
    feed.send_batch([Message("EoKillIn", b"%d" % i) for i in range(n)])
    feed.close()
    broker = cluster.broker("broker-a")
    kills = [(0, "planned"), (1, "written"), (2, "committed")]
    pending_kills = list(kills)
    pids: list[int] = []

    def on_step(step: str, batch_id: int) -> None:
        if pending_kills and pending_kills[0] == (batch_id, step):
            pending_kills.pop(0)
            pids.append(ray.get(broker.status.remote())["pid"])
            ray.kill(broker, no_restart=False)  # SIGKILL; the query goes on as it can

    def transform(df, batch_id: int):
        return df.select(F.concat(F.lit("out-"), F.col("body")).cast("binary").alias("body"))

    runs, errors = 0, []
    while True:
        runs += 1
        assert runs <= 10, f"no end after {runs} runs: {errors}"
        query = stream_to_spark(
            spark,
            "EoKillIn",
            "eo-kill",
            transform,
            sink_topic="EoKillOut",
            namespace=cluster.namespace,
            max_messages_per_batch=per_batch,
            available_now=True,
            num_partitions=2,
            max_retries=5,
            retry_backoff_s=0.5,
            on_step=on_step,
        )
        assert query.await_termination(timeout_s=180, raise_error=False)
        if query.exception is None and not pending_kills:
            break
        if query.exception is not None:  # a step the broker's death failed: start again
            errors.append(f"{type(query.exception).__name__}: {query.exception}")
    assert len(set(pids)) == 3  # three broker processes were killed
    # one run: the batches retried, the commit applied later, the checkpoint waited
    assert (runs, errors) == (1, [])

    seen: list[Counter[bytes]] = []

    def visible() -> Counter[bytes] | None:
        seen.append(bodies(cluster, "EoKillOut"))
        return seen[-1] if sum(seen[-1].values()) >= n else None

    try:
        out = wait_until(visible, timeout_s=30, what="every output visible")
    except AssertionError:
        pend = ray.get(cluster.broker("broker-a").pending_transactions.remote())
        committed = cluster.pull_consumer("eo-kill").fetch_offsets("EoKillIn")
        raise AssertionError(
            f"{sum(seen[-1].values())} visible, {len(pend)} pending, offsets {committed}, "
            f"missing {sorted(set(b'out-%d' % i for i in range(n)) - set(seen[-1]))[:20]}, "
            f"errors {errors}"
        ) from None
    dupes = {b: c for b, c in out.items() if c != 1}
    assert not dupes, f"duplicated {dupes} (errors {errors})"
    assert set(out) == {b"out-%d" % i for i in range(n)}
    committed = cluster.pull_consumer("eo-kill").fetch_offsets("EoKillIn")
    assert sum(committed.values()) == n


def _hold_until(marker: str, after: int):
    """A ``mapInArrow`` step that notes each task attempt in ``marker.attempts``, passes
    its rows on in slices of 10 and, while ``marker`` does not exist, stops after
    ``after`` rows until it does (60 s at most): the writer behind it has sent the first
    rows' half messages and waits for more when the test kills the executor. Once
    ``marker`` exists (the task's retry on the restarted executor) every row passes."""

    def step(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import time

        from pyspark import TaskContext

        task = TaskContext.get()
        with open(marker + ".attempts", "a") as attempts:
            attempts.write(f"{task.partitionId()} {task.attemptNumber()}\n")
        seen = 0
        for batch in batches:
            for start in range(0, batch.num_rows, 10):
                if seen >= after and not os.path.exists(marker):
                    deadline = time.monotonic() + 60
                    while not os.path.exists(marker):
                        if time.monotonic() > deadline:
                            raise RuntimeError("held 60 s: the executor was never killed")
                        time.sleep(0.05)
                part = batch.slice(start, 10)
                seen += part.num_rows
                yield part

    return step


def _kill_spark_executors() -> list[str]:
    """SIGKILL (``ray.kill``) every RayDP executor actor of this session; Ray restarts
    each (RayDP creates them restartable) and Spark's driver takes it back."""
    killed = []
    for named in ray.util.list_named_actors(all_namespaces=True):
        if named["name"].startswith("raydp-executor-"):
            ray.kill(ray.get_actor(named["name"], namespace=named["namespace"]), no_restart=False)
            killed.append(named["name"])
    return killed


@pytest.mark.kills_spark_executor  # runs last in the package: see conftest.py
def test_a_stream_to_a_sink_topic_whose_spark_executor_is_killed_writes_each_input_once(
    spark, txn_cluster, tmp_path
):
    # the session's only executor (a Java actor with its Python workers) is killed while
    # a task of batch 1 has sent part of its rows as half messages and waits to send
    # more; Ray restarts it, Spark runs the task again there, and the query goes on
    cluster = txn_cluster
    n, per_batch = 300, 100
    cluster.admin.create_topic("EoExecIn", read_queue_nums=2, write_queue_nums=2)
    cluster.admin.create_topic("EoExecOut", read_queue_nums=2, write_queue_nums=2)
    feed = cluster.producer("eo-exec-feed")
    feed.send_batch([Message("EoExecIn", b"%d" % i) for i in range(n)])
    feed.close()
    marker = str(tmp_path / "executor-killed")
    killed: list[str] = []
    failures: list[BaseException] = []

    def kill_once_halves_are_sent() -> None:
        try:
            wait_until(lambda: pending(cluster, "EoExecOut") > 0, timeout_s=60, what="halves")
            killed.extend(_kill_spark_executors())
        except BaseException as exc:  # noqa: BLE001 - asserted on the test's thread
            failures.append(exc)
        finally:
            open(marker, "w").close()  # the retry passes every row

    killer = threading.Thread(target=kill_once_halves_are_sent, daemon=True)

    def on_step(step: str, batch_id: int) -> None:
        if (batch_id, step) == (1, "planned") and not killer.is_alive() and not killed:
            killer.start()

    def transform(df, batch_id: int):
        # 8 KB bodies: Spark buffers 64 KB for a Python worker before sending, so small
        # rows would reach the writer only once the held step ends
        pad = F.concat(F.lit("|"), F.repeat(F.lit("x"), 8000))
        body = F.concat(F.lit("out-"), F.col("body"), pad).cast("binary").alias("body")
        out = df.select(body)
        return out.mapInArrow(_hold_until(marker, 40), "body binary") if batch_id == 1 else out

    progress: list[BatchProgress] = []
    # Arrow batches of 10 rows between the steps (Spark's default of 10,000 would hand the
    # writer nothing before the held step ends)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    query = stream_to_spark(
        spark,
        "EoExecIn",
        "eo-exec",
        transform,
        sink_topic="EoExecOut",
        sink_options={"batch_rows": 5},
        namespace=cluster.namespace,
        max_messages_per_batch=per_batch,
        available_now=True,
        num_partitions=2,
        on_step=on_step,
        on_progress=progress.append,
    )
    try:
        assert query.await_termination(timeout_s=180, raise_error=False)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    killer.join(timeout=60)
    assert not failures, failures
    assert killed, "no executor was killed"
    with open(marker + ".attempts") as attempts:
        tasks = Counter(line.split()[0] for line in attempts)
    assert max(tasks.values()) >= 2  # the held task ran again, on the restarted executor
    assert query.exception is None, f"{type(query.exception).__name__}: {query.exception}"
    out = Counter(body.split(b"|")[0] for body in bodies(cluster, "EoExecOut").elements())
    assert not {b: c for b, c in out.items() if c != 1}, "duplicated outputs"
    assert set(out) == {b"out-%d" % i for i in range(n)}
    assert sum(cluster.pull_consumer("eo-exec").fetch_offsets("EoExecIn").values()) == n
    assert [p.output for p in progress] == [p.messages for p in progress]
    # the killed attempt's half messages were never committed: rolled back by the checks
    wait_until(lambda: pending(cluster, "EoExecOut") == 0, timeout_s=30, what="no half left")


def test_bad_transactional_calls_are_refused_and_change_nothing(spark, txn_cluster):
    cluster = txn_cluster
    cluster.admin.create_topic("TxnBad", read_queue_nums=1, write_queue_nums=1)
    df = _numbered(spark, 10, 1)
    ns = cluster.namespace
    ds = ray.data.from_items([{"body": b"x"}])
    # a Ray Dataset is no bad call (it was refused before Ray Data writes were transactional)
    cluster.admin.create_topic("TxnDsOne", read_queue_nums=1, write_queue_nums=1)
    done = write_to_topic(ds, "TxnDsOne", transactional=True, namespace=ns)
    assert done.rows == 1 and done.transaction is not None
    assert bodies(cluster, "TxnDsOne") == Counter({b"x": 1})
    with pytest.raises(InvalidMessageError, match="must be a Transaction"):
        write_to_topic(ds, "TxnBad", transaction="txn-1", namespace=ns)  # type: ignore[arg-type]
    producer = cluster.transactional_producer("txn-bad", "txn-bad")
    try:
        txn = producer.begin()
        for data in (df, ds):
            with pytest.raises(InvalidMessageError, match="one or the other"):
                write_to_topic(data, "TxnBad", transaction=txn, transactional=True, namespace=ns)
        with pytest.raises(InvalidMessageError, match="half offset"):
            txn.add_halves({"broker-a": [12, 2.5]}, 2)  # type: ignore[list-item]
        assert txn.sent == 0
        txn.abort()
        for data in (df, ds):
            with pytest.raises(InvalidMessageError, match="is aborted"):
                write_to_topic(data, "TxnBad", transaction=txn, namespace=ns)
    finally:
        producer.close()
    with pytest.raises(InvalidMessageError, match="need a sink_topic"):
        stream_to_spark(spark, "TxnBad", "txn-bad", print, sink_options={}, namespace=ns)
    with pytest.raises(InvalidMessageError):
        stream_to_spark(spark, "TxnBad", "txn-bad", print, sink_topic="bad topic", namespace=ns)
    with pytest.raises(InvalidMessageError, match="not write_to_topic options"):
        stream_to_spark(
            spark, "TxnBad", "txn-bad", print, sink_topic="TxnBadOut", sink_options={"body": "b"}
        )
    assert bodies(cluster, "TxnBad") == Counter() and pending(cluster, "TxnBad") == 0
