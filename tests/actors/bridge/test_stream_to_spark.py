"""Micro-batches into Spark: offsets committed only after fn, failed batches replayed with the
same id and rows, restarts resume where the group left off."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

import actors
from actors.bridge.streaming import BatchProgress, StreamingQuery, stream_to_spark
from storage import Message
from storage.errors import RayMQError

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:DataFrame.sql_ctx is an internal property:UserWarning"),
]

Rows = frozenset[tuple[str, int, int]]  # (broker, queue id, queue offset)


class FlakySink:
    """An idempotent sink by batch id that records every attempt, checks that the group's
    committed offsets are the batch's start while fn runs, and fails when told to."""

    def __init__(self, cluster: actors.Cluster, topic: str, group: str, fail_at: set[int]):
        self.consumer = cluster.pull_consumer(group)
        self.topic = topic
        self.fail_at = set(fail_at)
        self.attempts: list[tuple[int, Rows]] = []
        self.stored: dict[int, Rows] = {}
        self.committed_seen: list[dict[tuple[str, int], int]] = []

    def __call__(self, df, batch_id: int) -> None:
        rows = frozenset(
            (r["broker_name"], r["queue_id"], r["queue_offset"])
            for r in df.select("broker_name", "queue_id", "queue_offset").collect()
        )
        self.attempts.append((batch_id, rows))
        self.committed_seen.append(
            {
                (mq.broker_name, mq.queue_id): off
                for mq, off in self.consumer.fetch_offsets(self.topic).items()
            }
        )
        if batch_id in self.fail_at:
            self.fail_at.discard(batch_id)
            raise RuntimeError(f"sink down during batch {batch_id}")
        self.stored[batch_id] = rows  # overwrite: idempotent by batch id


def _topic(cluster: actors.Cluster, name: str, n: int) -> dict[tuple[str, int], int]:
    """``name`` with 2 queues on each broker and ``n`` messages; its max offsets."""
    cluster.admin.create_topic(name, read_queue_nums=2, write_queue_nums=2)
    _send(cluster, name, 0, n)
    consumer = cluster.pull_consumer("probe")
    return {
        (mq.broker_name, mq.queue_id): consumer.max_offset(mq)
        for mq in consumer.fetch_subscribe_queues(name)
    }


def _send(cluster: actors.Cluster, topic: str, first: int, n: int) -> None:
    """``n`` messages, 50 to a batch: the producer's round robin spreads them over the queues."""
    producer = cluster.producer("stream-test-producer")
    for start in range(first, first + n, 50):
        producer.send_batch([Message(topic, b"m-%d" % i) for i in range(start, start + 50)])
    producer.close()


def _all_rows(ends: dict[tuple[str, int], int]) -> set[tuple[str, int, int]]:
    return {(b, q, o) for (b, q), end in ends.items() for o in range(end)}


def _starts(rows: Rows) -> dict[tuple[str, int], int]:
    starts: dict[tuple[str, int], int] = {}
    for b, q, o in rows:
        starts[(b, q)] = min(o, starts.get((b, q), o))
    return starts


def test_fn_failing_once_loses_nothing_and_replays_the_same_batch(spark, raymq):
    ends = _topic(raymq, "StreamOnce", 2_000)
    sink = FlakySink(raymq, "StreamOnce", "stream-once", fail_at={2})
    progress: list[BatchProgress] = []

    query = stream_to_spark(
        spark,
        "StreamOnce",
        "stream-once",
        sink,
        max_messages_per_batch=500,
        namespace=raymq.namespace,
        available_now=True,
        retry_backoff_s=0.0,
        on_progress=progress.append,
    )
    assert query.await_termination(timeout_s=300)

    ids = [batch_id for batch_id, _ in sink.attempts]
    assert ids == [0, 1, 2, 2, 3]
    assert sink.attempts[2][1] == sink.attempts[3][1]  # the replay had the failed batch's rows
    assert sorted(sink.stored) == [0, 1, 2, 3]
    stored = [row for rows in sink.stored.values() for row in rows]
    assert len(stored) == len(set(stored)) == 2_000
    assert set(stored) == _all_rows(ends)
    # While fn ran, the committed offsets were never past the batch's first offsets.
    for (_, rows), committed in zip(sink.attempts, sink.committed_seen):
        for queue, first in _starts(rows).items():
            assert committed.get(queue, -1) <= first
    assert [p.batch_id for p in progress] == [0, 1, 2, 3]
    assert [p.attempts for p in progress] == [1, 1, 2, 1]
    assert progress[-1].lag == 0
    assert sum(p.messages for p in progress) == 2_000
    assert query.batches_completed == 4 and query.messages_processed == 2_000
    consumer = raymq.pull_consumer("stream-once")
    committed = {
        (mq.broker_name, mq.queue_id): off
        for mq, off in consumer.fetch_offsets("StreamOnce").items()
    }
    assert committed == ends


def _run_until(spark, raymq, topic: str, group: str, sink: Callable, **options) -> StreamingQuery:
    return stream_to_spark(
        spark,
        topic,
        group,
        sink,
        max_messages_per_batch=400,
        namespace=raymq.namespace,
        retry_backoff_s=0.0,
        **options,
    )


def test_a_restart_resumes_with_the_unfinished_batch_id_and_rows(spark, raymq):
    ends = _topic(raymq, "StreamRestart", 1_000)
    sink = FlakySink(raymq, "StreamRestart", "stream-restart", fail_at={1})

    first = _run_until(spark, raymq, "StreamRestart", "stream-restart", sink, max_retries=0)
    assert first.await_termination(timeout_s=300, raise_error=False)
    assert isinstance(first.exception, RuntimeError)
    with pytest.raises(RuntimeError, match="sink down during batch 1"):
        first.await_termination()
    failed_rows = sink.attempts[-1][1]
    consumer = raymq.pull_consumer("stream-restart")
    committed = {
        (mq.broker_name, mq.queue_id): off
        for mq, off in consumer.fetch_offsets("StreamRestart").items()
    }
    batch0 = first.recent_progress[0]
    assert batch0.batch_id == 0 and len(first.recent_progress) == 1
    assert {f"{b}:{q}": off for (b, q), off in committed.items()} == batch0.end_offsets

    second = _run_until(spark, raymq, "StreamRestart", "stream-restart", sink, interval_s=0.05)
    second.process_all_available(timeout_s=300)
    assert sink.attempts[2] == (1, failed_rows)  # the restart's first batch: same id, same rows
    assert second.recent_progress[0].replayed

    _send(raymq, "StreamRestart", 1_000, 300)  # new messages while it runs
    second.process_all_available(timeout_s=300)
    second.stop(timeout_s=60)
    assert not second.is_active and second.exception is None

    stored = [row for rows in sink.stored.values() for row in rows]
    assert len(stored) == len(set(stored)) == 1_300
    assert set(stored) >= _all_rows(ends)
    assert sorted(sink.stored) == list(range(len(sink.stored)))


def test_one_stream_per_group_and_topic(spark, raymq):
    _topic(raymq, "StreamOne", 10)
    started = threading.Event()
    release = threading.Event()

    def slow(df, batch_id):
        started.set()
        release.wait(60)

    query = _run_until(spark, raymq, "StreamOne", "stream-one", slow)
    try:
        assert started.wait(120)
        with pytest.raises(RayMQError, match="running already"):
            _run_until(spark, raymq, "StreamOne", "stream-one", slow)
    finally:
        release.set()
        query.stop(timeout_s=120)
    assert query.batches_completed == 1 and query.last_progress is not None
