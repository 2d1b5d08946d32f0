"""Micro-batch streaming from a topic into Spark: ``stream_to_spark(spark, topic, group, fn)``.

Each batch is a bounded read of the messages that arrived since the group's
committed offsets (at most ``max_messages_per_batch``), handed to
``fn(df, batch_id)`` as a Spark DataFrame; the group's offsets are committed
only after ``fn`` returns. Delivery to ``fn`` is at least once; a sink that
writes idempotently by ``batch_id`` gets exactly once, because a batch that is
run again after a failure or a restart has the same id *and the same offset
ranges*.

That stability comes from a checkpoint the brokers keep for (group, topic)
(``Broker.save_stream_checkpoint``): the batch's plan — id and ranges — is
saved, fsynced, on every broker of the topic before ``fn`` runs, and marked
done after the commit. On start the stream reads it back and compares it with
the committed offsets:

* plan done → the next batch gets the next id (offsets a broker lost before it
  saved them are committed again: ``fn`` had finished);
* plan not done, committed offsets inside its ranges → the batch is run again
  with the same id and ranges;
* committed offsets outside its ranges (someone reset them) → the plan is
  dropped with a warning and the stream goes on from the committed offsets.

One stream per (group, topic) at a time.

**Exactly once into a topic** (``sink_topic=``): ``fn`` returns the batch's output (a
DataFrame, or the rows) and the stream writes it to ``sink_topic`` *and* commits the
batch's end offsets for ``group`` in one transaction of a ``TransactionalProducer``
(the executors send the rows as its half messages: ``write_to_topic(transaction=)``;
the offsets go with ``send_offsets``). The transactional id is stable per query
(``transactional_id``, default ``raymq-stream.<group>.<topic>.<sink_topic>``): a
restarted query fences its predecessor, whose open transaction is rolled back, and
reads offsets only after the predecessor's decided commits are applied. Then either
the batch committed (offsets at its ends, its output visible once: the checkpoint is
marked done on restart) or it did not (offsets at its starts, nothing of it visible:
it runs again with the same id and rows).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pyspark.sql import DataFrame, SparkSession

from actors.bridge.datasource import QueueRange, plan_topic_read
from actors.bridge.spark import release_dataframe, topic_to_spark
from actors.bridge.write import write_to_topic
from actors.client.pull_consumer import PullConsumer
from actors.client.transactional import Transaction, TransactionalProducer
from actors.namesrv.brokers import BrokerHandles
from actors.namesrv.client import NameServerClient
from actors.protocol import rpc as _rpc
from actors.protocol.names import DEFAULT_NAMESPACE
from storage.codec import validate_topic
from storage.errors import (
    BrokerUnavailableError,
    InvalidMessageError,
    ProducerFencedError,
    RayMQError,
    TopicNotFoundError,
)
from storage.message import Message

__all__ = ["BatchProgress", "StreamingQuery", "stream_to_spark"]

log = logging.getLogger("raymq.streaming")

_CALL_TIMEOUT_S = 30.0
_RESTART_WAIT_S = 30.0  # how long a checkpoint waits for a broker to come back
_RECENT = 100
_PLANNED, _DONE = "planned", "done"

_SINK_OPTIONS = frozenset(
    ("body_col", "key_col", "tag_col", "properties_col", "batch_rows", "producer_options")
)
_active: set[tuple[str, str, str]] = set()  # (namespace, group, topic) streaming in this process
_active_lock = threading.Lock()


@dataclass(frozen=True)
class BatchProgress:
    """One finished batch: its id, size, offsets (``"broker:queue"`` -> offset) and the
    messages still waiting behind it when it was committed."""

    batch_id: int
    messages: int
    lag: int
    start_offsets: Mapping[str, int]
    end_offsets: Mapping[str, int]
    replayed: bool
    attempts: int
    duration_s: float
    finished_at: float = field(default_factory=time.time)
    transaction: str | None = None  # with a sink_topic: the transaction that committed it
    output: int = 0  # with a sink_topic: messages written to it


def _queue_name(r: QueueRange) -> str:
    return f"{r.broker_name}:{r.queue_id}"


@dataclass(frozen=True)
class _Plan:
    batch_id: int
    ranges: tuple[QueueRange, ...]

    @property
    def messages(self) -> int:
        return sum(r.count for r in self.ranges)

    def to_json(self, status: str, query_id: str) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "status": status,
            "query_id": query_id,
            "updated_ms": int(time.time() * 1000),
            "ranges": [
                {"broker": r.broker_name, "queue": r.queue_id, "start": r.start, "end": r.end}
                for r in self.ranges
            ],
        }

    @staticmethod
    def from_json(data: Mapping[str, Any], current: Sequence[QueueRange]) -> _Plan:
        """The saved plan, its queues' broker actors and nodes taken from ``current``."""
        where = {(r.broker_name, r.queue_id): r for r in current}
        ranges = []
        for item in data["ranges"]:
            live = where.get((item["broker"], item["queue"]))
            if live is None:
                raise RayMQError(
                    f"stream checkpoint names queue {item['broker']}:{item['queue']}, "
                    "which the topic's route no longer has"
                )
            ranges.append(replace(live, start=int(item["start"]), end=int(item["end"])))
        return _Plan(int(data["batch_id"]), tuple(ranges))


def _queue_key(r: QueueRange) -> tuple[str, int]:
    return (r.broker_name, r.queue_id)


def _cap(ranges: Sequence[QueueRange], limit: int) -> list[QueueRange]:
    """At most ``limit`` messages, shared fairly: a queue with little waiting takes all
    of it, the rest split what is left evenly."""
    avail = [r.count for r in ranges]
    if sum(avail) <= limit:
        return list(ranges)
    take = [0] * len(ranges)
    order = sorted(range(len(ranges)), key=lambda i: avail[i])
    left = limit
    for pos, i in enumerate(order):
        take[i] = min(avail[i], left // (len(order) - pos))
        left -= take[i]
    for i in reversed(order):  # what integer division left over
        extra = min(avail[i] - take[i], left)
        take[i] += extra
        left -= extra
    return [replace(r, end=r.start + n) for r, n in zip(ranges, take)]


class _Checkpoints:
    """The stream's checkpoint on every live broker of the topic. A broker restarting
    (Ray restarts a crashed one in place) is waited for, up to ``_RESTART_WAIT_S``,
    rather than stopping the query."""

    def __init__(self, ns: NameServerClient, topic: str, group: str, stop: threading.Event) -> None:
        self.ns, self.topic, self.group = ns, topic, group
        self.handles = BrokerHandles(ns)
        self._stop = stop
        self._routed = False  # a topic never routed fails at once, not after the wait

    def _retrying(self, what: str, fn: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + _RESTART_WAIT_S
        delay = 0.1
        while True:
            try:
                out = fn()
                self._routed = True
                return out
            except Exception as exc:
                gone = isinstance(exc, BrokerUnavailableError) or (
                    self._routed and isinstance(exc, TopicNotFoundError)
                )
                if not (gone or _rpc.is_retriable(exc)) or time.monotonic() > deadline:
                    raise
                log.warning(
                    "stream %s/%s: %s the checkpoint: %s; again in %.1fs (a broker restarting?)",
                    self.group,
                    self.topic,
                    what,
                    type(exc).__name__,
                    delay,
                )
                if self._stop.wait(delay):
                    raise
                delay = min(2.0, delay * 2)

    def _brokers(self) -> dict[str, Any]:
        route = self.ns.require_route(self.topic, refresh=True)
        return {
            qd.broker_name: self.handles.broker(route, qd.broker_name)
            for qd in route.queue_datas
            if route.broker(qd.broker_name) is not None
        }

    def load(self) -> dict[str, Any] | None:
        return self._retrying("reading", self._load)  # type: ignore[no-any-return]

    def save(self, checkpoint: dict[str, Any]) -> None:
        self._retrying("saving", lambda: self._save(checkpoint))

    def _load(self) -> dict[str, Any] | None:
        brokers = self._brokers()
        found = _rpc.get(
            [h.load_stream_checkpoint.remote(self.group, self.topic) for h in brokers.values()],
            _CALL_TIMEOUT_S,
        )
        found = [f for f in found if f]
        if not found:
            return None
        return max(found, key=lambda f: (f["batch_id"], f["status"] == _DONE))

    def _save(self, checkpoint: dict[str, Any]) -> None:
        brokers = self._brokers()
        _rpc.get(
            [
                h.save_stream_checkpoint.remote(self.group, self.topic, checkpoint)
                for h in brokers.values()
            ],
            _CALL_TIMEOUT_S,
        )


class StreamingQuery:
    """A running ``stream_to_spark``: progress, ``stop``, ``await_termination``."""

    def __init__(
        self,
        spark: SparkSession,
        topic: str,
        group: str,
        fn: Callable[[DataFrame, int], Any],
        *,
        namespace: str,
        max_messages_per_batch: int,
        interval_s: float,
        starting_offsets: Literal["earliest", "latest"],
        available_now: bool,
        max_retries: int,
        retry_backoff_s: float,
        num_partitions: int | None,
        on_progress: Callable[[BatchProgress], None] | None,
        read_options: Mapping[str, Any],
        sink_topic: str | None = None,
        sink_options: Mapping[str, Any] | None = None,
        transactional_id: str | None = None,
        on_step: Callable[[str, int], None] | None = None,
    ) -> None:
        from actors.namesrv.client import discover_nameservers

        self.id = uuid.uuid4().hex
        self.topic, self.group, self.namespace = topic, group, namespace
        self._spark, self._fn = spark, fn
        self._max_messages = max_messages_per_batch
        self._interval_s = interval_s
        self._starting = starting_offsets
        self._available_now = available_now
        self._max_retries = max_retries
        self._retry_backoff_s = retry_backoff_s
        self._num_partitions = num_partitions
        self._on_progress = on_progress
        self._read_options = dict(read_options)
        self._nameservers = discover_nameservers(namespace)
        self._ns = NameServerClient(self._nameservers, namespace, 0.0)
        self._stop = threading.Event()
        self._checkpoints = _Checkpoints(self._ns, topic, group, self._stop)
        self._consumer = PullConsumer(group, namespace=namespace, nameservers=self._nameservers)
        self.sink_topic = sink_topic
        self._sink_options = dict(sink_options or {})
        self._on_step = on_step
        self._producer: TransactionalProducer | None = None
        self._txn: tuple[str, int] | None = None  # (last committed transaction, its output)
        self._ended: dict[tuple[str, int], int] = {}  # queue -> where its last batch ended
        if sink_topic is not None:
            # Before the checkpoint and the offsets are read: taking the id over fences
            # the previous instance, rolls back what it left open and applies what it
            # decided (so the committed offsets are final when _recover reads them).
            self.transactional_id = transactional_id or f"raymq-stream.{group}.{topic}.{sink_topic}"
            self._producer = TransactionalProducer(
                group,
                transactional_id=self.transactional_id,
                namespace=namespace,
                nameservers=self._nameservers,
            )
        self._changed = threading.Condition()
        self._terminated = False
        self._done_offsets: dict[str, int] = {}
        self.exception: BaseException | None = None
        self.recent_progress: deque[BatchProgress] = deque(maxlen=_RECENT)
        self.batches_completed = 0
        self.messages_processed = 0
        self._thread = threading.Thread(
            target=self._main, name=f"raymq-stream-{group}-{topic}", daemon=True
        )

    # ------------------------------------------------------------ public
    @property
    def is_active(self) -> bool:
        return not self._terminated

    @property
    def last_progress(self) -> BatchProgress | None:
        return self.recent_progress[-1] if self.recent_progress else None

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop after the batch in progress (never in the middle of ``fn``) and wait."""
        self._stop.set()
        self.await_termination(timeout_s, raise_error=False)

    def await_termination(self, timeout_s: float | None = None, raise_error: bool = True) -> bool:
        """Wait until the stream ends; True if it did. Raises what stopped it, if anything."""
        self._thread.join(timeout_s)
        if raise_error and self.exception is not None:
            raise self.exception
        return not self._thread.is_alive()

    def process_all_available(self, timeout_s: float | None = None) -> None:
        """Block until every message stored before this call has been through ``fn`` and
        committed (or the stream ended: its error, if any, is raised)."""
        target = {
            _queue_name(r): r.end
            for r in plan_topic_read(
                self.topic, namespace=self.namespace, nameservers=self._nameservers
            )
        }
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            while not self._terminated and any(
                self._done_offsets.get(q, -1) < end for q, end in target.items() if end > 0
            ):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"stream {self.group}/{self.topic} did not catch up in {timeout_s}s"
                    )
                self._changed.wait(remaining)
        if self.exception is not None:
            raise self.exception

    def __repr__(self) -> str:
        state = "active" if self.is_active else "terminated"
        return (
            f"StreamingQuery({self.group}/{self.topic}, {state}, "
            f"{self.batches_completed} batches, {self.messages_processed} messages)"
        )

    # ------------------------------------------------------------ the loop
    def _main(self) -> None:
        key = (self.namespace, self.group, self.topic)
        try:
            next_id, replay = self._recover()
            final = self._final_offsets() if self._available_now else None
            while not self._stop.is_set():
                started = time.monotonic()
                plan: _Plan | None = replay
                replayed, replay = plan is not None, None
                if plan is None:
                    plan = self._next_plan(next_id, final)
                    if plan is None:
                        if final is not None:
                            break
                        self._stop.wait(self._interval_s)
                        continue
                    self._checkpoints.save(plan.to_json(_PLANNED, self.id))
                attempts = self._run_batch(plan)
                if attempts == 0:  # stopped while waiting to retry: the plan stays pending
                    break
                self._commit(plan)
                self._ended.update({_queue_key(r): r.end for r in plan.ranges})
                self._report(plan, replayed, attempts, time.monotonic() - started)
                next_id = plan.batch_id + 1
                if final is None:
                    self._stop.wait(max(0.0, started + self._interval_s - time.monotonic()))
        except BaseException as exc:  # noqa: BLE001 - reported through the query
            self.exception = exc
            log.error(
                "stream %s/%s stopped: %s: %s", self.group, self.topic, type(exc).__name__, exc
            )
        finally:
            if self._producer is not None:
                try:
                    self._producer.close(timeout_s=5.0)
                except Exception as exc:  # noqa: BLE001 - it sends nothing more
                    log.warning("stream %s: closing its producer: %s", key, exc)
            with _active_lock:
                _active.discard(key)
            with self._changed:
                self._terminated = True
                self._changed.notify_all()

    def _current(self) -> list[QueueRange]:
        return plan_topic_read(
            self.topic,
            namespace=self.namespace,
            group=self.group,
            start_offsets="committed",
            default_start=self._starting,
            nameservers=self._nameservers,
        )

    def _final_offsets(self) -> dict[tuple[str, int], int]:
        return {(r.broker_name, r.queue_id): r.end for r in self._current()}

    def _recover(self) -> tuple[int, _Plan | None]:
        """The next batch id, and the batch to run again if one was left unfinished."""
        saved = self._checkpoints.load()
        if saved is None:
            return 0, None
        current = self._current()
        plan = _Plan.from_json(saved, current)
        resume_at = {_queue_name(r): r.start for r in current}
        raw = self._committed_raw()

        def at(r: QueueRange) -> int:
            return raw.get((r.broker_name, r.queue_id), -1)

        inside = all(at(r) == -1 or r.start <= at(r) <= r.end for r in plan.ranges)
        finished = all(at(r) == r.end for r in plan.ranges)
        if saved["status"] == _DONE or finished:
            if not finished and inside:
                log.warning(
                    "stream %s/%s: batch %d finished but a broker lost its commit; "
                    "committing it again",
                    self.group,
                    self.topic,
                    plan.batch_id,
                )
                self._commit(plan, offsets=True)
            elif saved["status"] != _DONE:
                self._checkpoints.save(plan.to_json(_DONE, self.id))
            return plan.batch_id + 1, None
        if inside:
            log.info(
                "stream %s/%s: batch %d was not finished; running it again (%d messages)",
                self.group,
                self.topic,
                plan.batch_id,
                plan.messages,
            )
            return plan.batch_id, plan
        log.warning(
            "stream %s/%s: the group's offsets moved outside unfinished batch %d "
            "(reset?); dropping it and going on from %s",
            self.group,
            self.topic,
            plan.batch_id,
            resume_at,
        )
        return plan.batch_id + 1, None

    def _committed_raw(self) -> dict[tuple[str, int], int]:
        out = {}
        for mq, offset in self._consumer.fetch_offsets(self.topic).items():
            out[(mq.broker_name, mq.queue_id)] = offset
        return out

    def _next_plan(
        self, batch_id: int, final: Mapping[tuple[str, int], int] | None
    ) -> _Plan | None:
        # from where this query's last batch ended, when the group's committed offsets
        # are behind it: a commit decided while a broker was down moves them only once
        # the broker is back, and reading from them would run that batch again
        ranges = [
            replace(r, start=max(r.start, min(r.end, self._ended.get(_queue_key(r), r.start))))
            for r in self._current()
        ]
        if final is not None:
            ranges = [
                replace(r, end=min(r.end, final.get((r.broker_name, r.queue_id), r.start)))
                for r in ranges
            ]
        ranges = _cap(ranges, self._max_messages)
        if sum(r.count for r in ranges) == 0:
            self._mark_done(ranges)
            return None
        return _Plan(batch_id, tuple(ranges))

    def _run_batch(self, plan: _Plan) -> int:
        """Run ``fn`` on the batch, again on failure up to ``max_retries`` times; the
        number of attempts it took (0: stopped before it succeeded)."""
        for attempt in range(1, self._max_retries + 2):
            df = topic_to_spark(
                self._spark,
                self.topic,
                namespace=self.namespace,
                ranges=plan.ranges,
                num_partitions=self._num_partitions,
                **self._read_options,
            )
            txn: Transaction | None = None
            try:
                self._step("planned", plan.batch_id)
                if self._producer is None:
                    self._fn(df, plan.batch_id)
                    return attempt
                txn = self._producer.begin()
                output = self._write(txn, self._fn(df, plan.batch_id))
                txn.send_offsets(self.group, {r.queue: r.end for r in plan.ranges})
                self._step("written", plan.batch_id)
                txn.commit()
                self._txn = (txn.txn_id, output)
                self._step("committed", plan.batch_id)
                return attempt
            except Exception as exc:
                if txn is not None:  # nothing of this attempt shows; its offsets stay
                    self._abort(txn, exc)
                if attempt > self._max_retries or isinstance(exc, ProducerFencedError):
                    raise  # fenced: a newer instance of the query runs
                log.warning(
                    "stream %s/%s: batch %d failed (%s: %s); attempt %d of %d in %.1fs",
                    self.group,
                    self.topic,
                    plan.batch_id,
                    type(exc).__name__,
                    exc,
                    attempt + 1,
                    self._max_retries + 1,
                    self._retry_backoff_s,
                )
                if self._stop.wait(self._retry_backoff_s):
                    return 0
            finally:
                release_dataframe(df)
        raise AssertionError("unreachable")

    def _step(self, step: str, batch_id: int) -> None:
        if self._on_step is not None:
            self._on_step(step, batch_id)

    def _write(self, txn: Transaction, out: Any) -> int:
        """``fn``'s output into ``txn``: a DataFrame's rows by the executors, rows (Messages,
        any topic, or bodies for the sink topic) from here; how many."""
        assert self.sink_topic is not None
        if out is None:
            return 0
        if isinstance(out, DataFrame):
            return write_to_topic(
                out,
                self.sink_topic,
                namespace=self.namespace,
                transaction=txn,
                **self._sink_options,
            ).rows
        if isinstance(out, (Message, bytes, bytearray)):
            out = [out]
        try:
            rows = list(out)
        except TypeError:
            raise InvalidMessageError(
                f"fn returned {type(out).__name__}: with a sink_topic it returns a DataFrame, "
                "Messages or bodies (bytes), or None"
            ) from None
        messages = [
            m if isinstance(m, Message) else Message(self.sink_topic, bytes(m)) for m in rows
        ]
        txn.send(messages)
        return len(messages)

    def _abort(self, txn: Transaction, cause: BaseException) -> None:
        """Roll the failed attempt's transaction back; when even that fails the stream
        stops (a restart fences this instance, which rolls back what it left open, or
        finds the batch committed when the commit's answer was what got lost)."""
        try:
            txn.abort()
        except Exception as exc:
            log.error("stream %s/%s: aborting %s: %s", self.group, self.topic, txn.txn_id, exc)
            raise exc from cause

    def _commit(self, plan: _Plan, offsets: bool = False) -> None:
        if offsets or self._producer is None:  # with a sink they moved in the transaction
            self._consumer.commit_offsets({r.queue: r.end for r in plan.ranges})
        self._checkpoints.save(plan.to_json(_DONE, self.id))

    def _mark_done(self, ranges: Sequence[QueueRange]) -> None:
        with self._changed:
            for r in ranges:
                self._done_offsets[_queue_name(r)] = r.end
            self._changed.notify_all()

    def _report(self, plan: _Plan, replayed: bool, attempts: int, duration_s: float) -> None:
        now = {_queue_name(r): r.end for r in self._current()}
        ends = {_queue_name(r): r.end for r in plan.ranges}
        lag = sum(max(0, now.get(q, end) - end) for q, end in ends.items())
        progress = BatchProgress(
            batch_id=plan.batch_id,
            messages=plan.messages,
            lag=lag,
            start_offsets={_queue_name(r): r.start for r in plan.ranges},
            end_offsets=ends,
            replayed=replayed,
            attempts=attempts,
            duration_s=round(duration_s, 3),
            transaction=None if self._txn is None else self._txn[0],
            output=0 if self._txn is None else self._txn[1],
        )
        self._txn = None
        self.recent_progress.append(progress)
        self.batches_completed += 1
        self.messages_processed += plan.messages
        log.info(
            "stream %s/%s: batch %d, %d messages in %.2fs%s, lag %d",
            self.group,
            self.topic,
            plan.batch_id,
            plan.messages,
            duration_s,
            " (replayed)" if replayed else "",
            lag,
        )
        self._mark_done(plan.ranges)
        if self._on_progress is not None:
            self._on_progress(progress)


def stream_to_spark(
    spark: SparkSession,
    topic: str,
    group: str,
    fn: Callable[[DataFrame, int], Any],
    *,
    max_messages_per_batch: int = 100_000,
    interval_s: float = 1.0,
    namespace: str = DEFAULT_NAMESPACE,
    starting_offsets: Literal["earliest", "latest"] = "earliest",
    available_now: bool = False,
    max_retries: int = 2,
    retry_backoff_s: float = 1.0,
    num_partitions: int | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    sink_topic: str | None = None,
    sink_options: Mapping[str, Any] | None = None,
    transactional_id: str | None = None,
    on_step: Callable[[str, int], None] | None = None,
    **read_options: Any,
) -> StreamingQuery:
    """Start running ``fn(df, batch_id)`` on each batch of new messages of ``topic``.

    A batch holds the messages after ``group``'s committed offsets (a queue the
    group never committed starts at ``starting_offsets``), at most
    ``max_messages_per_batch`` of them; batches start at most every
    ``interval_s``. Offsets are committed after ``fn`` returns. A failing
    ``fn`` is run again on the same batch (same id, same rows) up to
    ``max_retries`` times, then the stream stops with its error (see
    ``StreamingQuery.exception``); starting the stream again resumes with that
    batch. ``available_now`` processes what is stored at the start and then
    stops. ``read_options`` go to ``read_topic`` (``tags``, ``pull_batch_size``, ...).
    Returns at once with a running :class:`StreamingQuery`.

    ``sink_topic``: exactly once from topic to topic. ``fn`` returns the batch's output
    (a DataFrame, its columns mapped as ``write_to_topic``'s with ``sink_options``:
    ``body_col``, ``key_col``, ``tag_col``, ``properties_col``, ``batch_rows``; or
    Messages, or bodies; or None) and it is written to ``sink_topic`` with the
    batch's offsets in one transaction under ``transactional_id`` (see the module
    doc). ``on_step(step, batch_id)`` is called at ``"planned"``, ``"written"`` (the
    output sent, not committed) and ``"committed"``: a hook for monitoring and for
    tests (a BaseException that is no Exception raised there stops the stream as a
    crash would: nothing aborted, nothing marked).
    """
    if sink_topic is not None:
        validate_topic(sink_topic)
        unknown = sorted(set(sink_options or {}) - _SINK_OPTIONS)
        if unknown:
            raise InvalidMessageError(
                f"sink_options {unknown}: not write_to_topic options (take {sorted(_SINK_OPTIONS)})"
            )
    elif sink_options is not None or transactional_id is not None:
        raise InvalidMessageError("sink_options and transactional_id need a sink_topic")
    if not isinstance(max_messages_per_batch, int) or max_messages_per_batch <= 0:
        raise InvalidMessageError(
            f"max_messages_per_batch={max_messages_per_batch!r}: must be an int > 0"
        )
    if interval_s < 0 or retry_backoff_s < 0 or max_retries < 0:
        raise InvalidMessageError(
            f"interval_s={interval_s}, retry_backoff_s={retry_backoff_s}, "
            f"max_retries={max_retries}: must be >= 0"
        )
    if starting_offsets not in ("earliest", "latest"):
        raise InvalidMessageError(f"starting_offsets={starting_offsets!r}: 'earliest' or 'latest'")
    key = (namespace, group, topic)
    with _active_lock:
        if key in _active:
            raise RayMQError(f"a stream of group {group!r} on topic {topic!r} is running already")
        _active.add(key)
    try:
        query = StreamingQuery(
            spark,
            topic,
            group,
            fn,
            namespace=namespace,
            max_messages_per_batch=max_messages_per_batch,
            interval_s=interval_s,
            starting_offsets=starting_offsets,
            available_now=available_now,
            max_retries=max_retries,
            retry_backoff_s=retry_backoff_s,
            num_partitions=num_partitions,
            on_progress=on_progress,
            read_options=read_options,
            sink_topic=sink_topic,
            sink_options=sink_options,
            transactional_id=transactional_id,
            on_step=on_step,
        )
    except BaseException:
        with _active_lock:
            _active.discard(key)
        raise
    query._thread.start()
    return query
