"""Exactly once through Ray Data (issue #24): ``write_to_topic(ds, ..., transaction=txn |
transactional=True)`` for a Ray Dataset. Its write tasks send half messages; the driver
adds to the transaction exactly the halves the tasks Ray Data counted returned, so a
write task that failed after sending and ran again counts once, and a failed write
shows nothing; both of Ray's ways of running a failed write task again are shown. The
package's cluster (no Spark is used, but its cluster is already up)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
import ray.data
from raymq_testkit import wait_until

import actors
from actors.bridge.write import write_to_topic

from .txn_probes import bodies, pending, txn_stats

N, BLOCKS = 3_000, 6  # rows, input blocks (one write task each)
FAIL_AT = 1_200  # the transform's batch that fails: the 3rd of block 2's (rows 1000-1499)


def _numbered(ids: pa.Array) -> pa.Table:
    return pa.table(
        {
            "body": pa.array([b"row-%d" % i for i in ids.to_pylist()], pa.binary()),
            "key": pa.array([f"k-{i}" for i in ids.to_pylist()]),
        }
    )


def _ids() -> list[pa.Table]:
    per = N // BLOCKS
    return [pa.table({"id": pa.array(range(k * per, (k + 1) * per))}) for k in range(BLOCKS)]


def _transform(fail_at: int, flag: Path | None) -> Callable[[pa.Table], pa.Table]:
    """``id`` -> ``body`` and ``key``; the batch starting at row ``fail_at`` raises: on
    every attempt (``flag`` None), or on the first only (it leaves ``flag`` behind).
    Self-contained: Ray's workers cannot import this test module by name."""

    def fn(batch: pa.Table) -> pa.Table:
        ids = batch.column("id").to_pylist()
        if ids[0] == fail_at and (flag is None or not flag.exists()):
            if flag is not None:
                flag.touch()
            raise RuntimeError(f"transform failed at row {fail_at}")
        return pa.table(
            {
                "body": pa.array([b"row-%d" % i for i in ids], pa.binary()),
                "key": pa.array([f"k-{i}" for i in ids]),
            }
        )

    return fn


# a failed write task runs once more: Ray Data's in-task retry ("data": the transform
# and write() run again inside the task), or Ray's task retry ("ray": the task runs
# again; the same remote args on the transform, so that it is fused into the write task)
RAY_RETRY = {"max_retries": 1, "retry_exceptions": True}


def _failing_dataset(flag: Path | None, retry: str = "data") -> ray.data.Dataset:
    ds = ray.data.from_arrow(_ids()).map_batches(
        _transform(FAIL_AT, flag),
        batch_size=100,
        batch_format="pyarrow",
        **(RAY_RETRY if retry == "ray" else {}),
    )
    # this Dataset's own DataContext (the driver's default stays as it is): output blocks
    # of ~1 KiB, so the write task fused after the transform gets a block's rows a few
    # dozen at a time and sends some before the transform fails
    ds.context.target_max_block_size = 1024
    if retry == "data":
        ds.context.retried_map_errors = True
        ds.context.max_map_retries = 1
    return ds


def _all_rows() -> Counter[bytes]:
    return Counter({b"row-%d" % i: 1 for i in range(N)})


def test_a_dataset_written_into_a_transaction_shows_only_at_its_commit_each_row_once(
    txn_cluster: actors.Cluster,
) -> None:
    cluster = txn_cluster
    cluster.admin.create_topic("DsTxn", read_queue_nums=2, write_queue_nums=2)
    ds = ray.data.from_arrow([_numbered(t.column("id").combine_chunks()) for t in _ids()])
    producer = cluster.transactional_producer("ds-txn", "ds-txn")
    try:
        txn = producer.begin()
        result = write_to_topic(
            ds,
            "DsTxn",
            key_col="key",
            transaction=txn,
            namespace=cluster.namespace,
            batch_rows=100,
        )
        assert (result.rows, result.batches, result.transaction) == (N, N // 100, txn.txn_id)
        assert txn.sent == N
        # stored as half messages, not visible, until the caller commits
        assert bodies(cluster, "DsTxn") == Counter()
        assert pending(cluster, "DsTxn") == N
        txn.commit()
    finally:
        producer.close()
    assert bodies(cluster, "DsTxn") == _all_rows()
    assert pending(cluster, "DsTxn") == 0


def test_a_transactional_dataset_write_whose_task_always_fails_after_sending_shows_nothing(
    txn_cluster: actors.Cluster,
) -> None:
    cluster = txn_cluster
    cluster.admin.create_topic("DsTxnFail", read_queue_nums=2, write_queue_nums=2)
    before = txn_stats(cluster)
    with pytest.raises(Exception, match=f"transform failed at row {FAIL_AT}"):
        write_to_topic(
            _failing_dataset(None),
            "DsTxnFail",
            transactional=True,
            namespace=cluster.namespace,
            batch_rows=20,
        )
    # the abort rolled back what it found; a task still sending when the write gave up
    # leaves halves the check service rolls back (the transaction is aborted)
    wait_until(lambda: pending(cluster, "DsTxnFail") == 0, timeout_s=20, what="none pending")
    assert txn_stats(cluster)["txn_rolled_back"] > before["txn_rolled_back"]
    assert bodies(cluster, "DsTxnFail") == Counter()
    consumer = cluster.pull_consumer("probe-ds-fail")
    assert all(consumer.max_offset(mq) == 0 for mq in consumer.fetch_subscribe_queues("DsTxnFail"))
    consumer.close()


@pytest.mark.parametrize("retry", ["data", "ray"])
def test_a_transactional_dataset_write_counts_a_task_retried_after_sending_once(
    txn_cluster: actors.Cluster, tmp_path: Path, retry: str
) -> None:
    cluster = txn_cluster
    topic = f"DsTxnRetry-{retry}"
    cluster.admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)
    flag = tmp_path / "failed-once"
    before = txn_stats(cluster)

    result = write_to_topic(
        _failing_dataset(flag, retry),
        topic,
        key_col="key",
        transactional=True,
        namespace=cluster.namespace,
        batch_rows=20,
        ray_remote_args=RAY_RETRY if retry == "ray" else None,
    )

    assert flag.exists()  # the transform did fail once, and the task ran again
    assert result.rows == N and result.transaction is not None
    seen = bodies(cluster, topic)
    assert seen == _all_rows()
    # the failed attempt's half messages were not in the commit: the check service rolls
    # them back (the coordinator answers abort for a done transaction's strays)
    wait_until(lambda: pending(cluster, topic) == 0, timeout_s=20, what="strays gone")
    after = txn_stats(cluster)
    assert after["txn_committed"] - before["txn_committed"] == N
    strays = after["txn_rolled_back"] - before["txn_rolled_back"]
    assert 0 < strays < N // BLOCKS  # sent before the failure: part of that task's rows
    assert bodies(cluster, topic) == seen
