"""Rows of a Ray Dataset or a Spark DataFrame into a topic, sent by the workers.

A Ray Dataset goes through Ray Data write tasks; a Spark DataFrame is produced by
Spark's own Python workers (``mapInArrow``), which join the Ray cluster once, as
RayDP's own Ray -> Spark path does. Either way each worker process encodes its
rows with the Arrow encoder and sends them with a Producer of its own (made once
and kept), encoding the next group of batches while the last is in flight; rows
never pass through the driver. Converting a DataFrame to a Dataset first (RayDP's
``from_spark``) took longer than the whole send, so the Spark path skips it.

Delivery is at least once, as ``send_batch``'s: a send that timed out and was
retried, or a Spark or Ray task that ran again, may store rows twice.

``transactional=True`` makes the write all or nothing and each row once, for a Dataset
as for a DataFrame: the workers send their rows as half messages of one transaction
the driver began (``Transaction.context()``), each successful task hands back where
its rows were stored (a Spark task in its result row, a Ray Data write task in its
``write`` return), and the driver commits exactly those (``Transaction.add_halves``)
once every task succeeded. A task attempt that failed (and was run again by Spark or
by Ray), or lost to a speculative copy, is never handed back: its half messages stay
out of the commit and are rolled back by the brokers' check service
(docs/transactions.md, "Spark").
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import ray
import ray.data
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink

from actors.bridge.arrow_codec import ArrowMessages, encode_arrow
from actors.client.producer import Producer
from actors.client.transactional import (
    Transaction,
    TransactionalProducer,
    TransactionContext,
    TransactionState,
)
from actors.protocol.names import DEFAULT_NAMESPACE
from storage.codec import EncodedBatch, validate_topic
from storage.errors import InvalidMessageError

log = logging.getLogger("raymq.datasource.write")

DEFAULT_BATCH_ROWS = 8192
DEFAULT_BATCH_BYTES = 4 << 20
_GROUP_BATCHES = 4  # batches per send_encoded call (sent in parallel)
_GROUPS_AHEAD = 2  # groups handed to the sender thread ahead of the one sending

_producers: dict[tuple[str, tuple[str, ...], tuple[tuple[str, Any], ...]], Producer] = {}
_producers_lock = threading.Lock()


def _producer(namespace: str, nameservers: Sequence[str], options: Mapping[str, Any]) -> Producer:
    """This process's Producer for the cluster: made on first use, then reused."""
    key = (namespace, tuple(nameservers), tuple(sorted(options.items())))
    with _producers_lock:
        producer = _producers.get(key)
        if producer is None:
            producer = _producers[key] = Producer(
                "raymq-datasource-writer", namespace=namespace, nameservers=nameservers, **options
            )
        return producer


@dataclass(frozen=True)
class WriteResult:
    """What ``write_to_topic`` sent: rows and the encoded batches that carried them."""

    topic: str
    rows: int
    batches: int
    transaction: str | None = None  # the transaction id of a transactional write


@dataclass(frozen=True)
class _Columns:
    body: str
    key: str | None
    tag: str | None
    properties: str | None

    def names(self) -> list[str]:
        return [c for c in (self.body, self.key, self.tag, self.properties) if c is not None]

    def check(self, available: Sequence[str]) -> None:
        missing = [c for c in self.names() if c not in available]
        if missing:
            raise InvalidMessageError(
                f"write_to_topic: column(s) {missing} not in the data (columns: {list(available)})"
            )


@dataclass(frozen=True)
class _WriteSpec:
    """Everything a worker needs to produce rows: pickled into Ray and Spark tasks."""

    topic: str
    namespace: str
    nameservers: tuple[str, ...]
    columns: _Columns
    batch_rows: int
    batch_bytes: int
    producer_options: tuple[tuple[str, Any], ...]
    txn: TransactionContext | None = None  # send as half messages of this transaction


class _TopicWriter:
    """Encodes Arrow tables into batches and sends them from this process.

    Rows are cut into batches of ``batch_rows`` (or ``batch_bytes``) whatever the
    sizes of the tables that bring them: a short remainder waits for the next
    table. Groups of ``_GROUP_BATCHES`` batches go to a sender thread, up to
    ``_GROUPS_AHEAD`` groups ahead of it, so encoding and the broker's append
    overlap. A send's error surfaces at a later :meth:`write` or at :meth:`close`.
    """

    def __init__(self, spec: _WriteSpec) -> None:
        self.spec = spec
        self.producer = _producer(spec.namespace, spec.nameservers, dict(spec.producer_options))
        self.rows = 0
        self.batches = 0
        self._held: list[pa.Table] = []  # rows not yet in a batch
        self._held_rows = 0
        self._pending: list[EncodedBatch] = []
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="raymq-write")
        self._inflight: deque[Future[Any]] = deque()
        self._extra = None if spec.txn is None else spec.txn.properties()
        # broker -> its half messages (transactional): CommitLog offsets, or ids where
        # a retried send left the offset unknown
        self.halves: dict[str, list[int | str]] = {}

    def _messages(self, table: pa.Table) -> ArrowMessages:
        def column(name: str | None) -> pa.Array | None:
            return None if name is None else table.column(name).combine_chunks()

        c = self.spec.columns
        body = column(c.body)
        assert body is not None
        return ArrowMessages(body, column(c.tag), column(c.key), column(c.properties))

    def _step(self, table: pa.Table) -> int:
        """Rows per batch: ``batch_rows``, fewer when rows are large (``batch_bytes``)."""
        per_row = max(1, table.nbytes // max(1, table.num_rows))
        return max(1, min(self.spec.batch_rows, self.spec.batch_bytes // per_row))

    def write(self, table: pa.Table) -> None:
        self.spec.columns.check(table.column_names)
        table = table.select(self.spec.columns.names())
        if table.num_rows == 0:
            return
        self._held.append(table)
        self._held_rows += table.num_rows
        step = self._step(table)
        if self._held_rows < step:
            return
        rows = pa.concat_tables(self._held) if len(self._held) > 1 else table
        first = 0
        while rows.num_rows - first >= step:
            self._encode(rows.slice(first, step))
            first += step
        self._held = [rows.slice(first)] if first < rows.num_rows else []
        self._held_rows = rows.num_rows - first

    def _encode(self, part: pa.Table) -> None:
        config = self.producer.config
        self._pending.append(
            encode_arrow(
                self.spec.topic,
                self._messages(part),
                max_message_size=config.max_message_size,
                born_host=config.born_host,
                first_row=self.rows,
                extra_properties=self._extra,
            )
        )
        self.rows += part.num_rows
        if len(self._pending) >= _GROUP_BATCHES:
            self._flush()

    def _done(self, sent: Future[Any]) -> None:
        result = sent.result()
        if self._extra is not None:  # where the half messages are: handed to the commit
            for broker, refs in result.halves_by_broker().items():
                self.halves.setdefault(broker, []).extend(refs)

    def _flush(self) -> None:
        while len(self._inflight) >= _GROUPS_AHEAD:
            self._done(self._inflight.popleft())
        group, self._pending = self._pending, []
        self._inflight.append(self._sender.submit(self.producer.send_encoded, group))
        self.batches += len(group)

    def close(self) -> tuple[int, int]:
        """Send what is left, wait for every batch to be stored; (rows, batches)."""
        try:
            if self._held:
                held, self._held = self._held, []
                self._encode(pa.concat_tables(held))
            if self._pending:
                self._flush()
            while self._inflight:
                self._done(self._inflight.popleft())
        finally:
            self._sender.shutdown(wait=True, cancel_futures=True)
        return self.rows, self.batches

    def abort(self) -> None:
        """Stop after a failure: send nothing more (groups already sending finish)."""
        self._held.clear()
        self._pending.clear()
        self._sender.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class _TaskWrite:
    """What one Ray Data write task sent (its ``write`` return, handed to the driver's
    ``on_write_complete`` for the attempt Ray counted, and for no other)."""

    rows: int
    batches: int
    halves: dict[str, list[int | str]]  # broker -> its half messages (offsets or ids)


class TopicDatasink(Datasink[_TaskWrite]):
    """Ray Data sink that produces each row as a message of ``topic``.

    With ``transaction`` (an open :class:`Transaction` of the caller's) the write tasks
    send their rows as the transaction's half messages and return where they were
    stored; :meth:`on_write_complete` (on the driver) adds exactly those returned
    halves to the transaction, which the caller then commits or aborts. A task attempt
    that failed is never returned, so its half messages are never committed. The
    transaction itself stays on the driver: tasks get only its picklable context.
    ``write_to_topic(ds, topic, transactional=True)`` does this in a transaction of its own.
    """

    def __init__(
        self,
        topic: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        body_col: str = "body",
        key_col: str | None = None,
        tag_col: str | None = None,
        properties_col: str | None = None,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        producer_options: Mapping[str, Any] | None = None,
        transaction: Transaction | None = None,
    ) -> None:
        if transaction is not None:
            _check_transaction(transaction)
        spec = _spec(
            topic,
            namespace,
            nameservers,
            _Columns(body_col, key_col, tag_col, properties_col),
            batch_rows,
            batch_bytes,
            producer_options,
        )
        self._start(spec, transaction)

    @classmethod
    def _of(cls, spec: _WriteSpec, transaction: Transaction | None) -> TopicDatasink:
        """The sink of ``write_to_topic``'s spec (checked already), ``transaction`` checked."""
        sink = cls.__new__(cls)
        sink._start(spec, transaction)
        return sink

    def _start(self, spec: _WriteSpec, transaction: Transaction | None) -> None:
        self.spec = spec if transaction is None else _with_txn(spec, transaction)
        self.topic = spec.topic
        self.result: WriteResult | None = None
        self._transaction = transaction  # the driver's; never pickled into a task

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_transaction"] = None
        return state

    def get_name(self) -> str:
        return f"RayMQTopic({self.topic})"

    # No column check in on_write_start: Ray 2.60 hands it the schema of the write
    # operator's first *input*, which is the input of a transform fused into the write
    # task (``ds.map_batches(f).write_datasink(sink)``), not the rows the sink gets. The
    # writer checks each table it gets; write_to_topic checks a schema known up front.

    def write(self, blocks: Iterable[Block], ctx: Any) -> _TaskWrite:
        writer = _TopicWriter(self.spec)
        try:
            for block in blocks:
                writer.write(BlockAccessor.for_block(block).to_arrow())
        except BaseException:
            writer.abort()
            raise
        rows, batches = writer.close()
        return _TaskWrite(rows, batches, writer.halves)

    def on_write_complete(self, write_result: Any) -> None:
        returns: list[_TaskWrite] = write_result.write_returns
        txn = self._transaction
        if txn is None and self.spec.txn is not None:  # never silently commit nothing
            raise RuntimeError(
                f"{self.get_name()}: on_write_complete ran on a copy of the sink that "
                f"lost its transaction {self.spec.txn.txn_id}: its rows cannot be added"
            )
        if txn is not None:
            # one return per write task: the attempt Ray counted (a retried task's
            # failed attempts return nothing), so only its half messages are named
            for r in returns:
                txn.add_halves(r.halves, r.rows)
        self.result = WriteResult(
            self.topic,
            sum(r.rows for r in returns),
            sum(r.batches for r in returns),
            None if txn is None else txn.txn_id,
        )


def _spec(
    topic: str,
    namespace: str,
    nameservers: Sequence[str] | None,
    columns: _Columns,
    batch_rows: int,
    batch_bytes: int,
    producer_options: Mapping[str, Any] | None,
    txn: TransactionContext | None = None,
) -> _WriteSpec:
    from actors.namesrv.client import discover_nameservers

    validate_topic(topic)
    if batch_rows <= 0 or batch_bytes <= 0:
        raise InvalidMessageError(
            f"batch_rows={batch_rows}, batch_bytes={batch_bytes}: must be > 0"
        )
    return _WriteSpec(
        topic,
        namespace,
        tuple(nameservers or discover_nameservers(namespace)),
        columns,
        batch_rows,
        batch_bytes,
        tuple(sorted((producer_options or {}).items())),
        txn,
    )


# ------------------------------------------------------------ from Spark's own workers
_SPARK_RESULT = "rows long, batches long, halves string, partition int, attempt int"


def _write_partition(
    spec: _WriteSpec, ray_address: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """What each Spark task runs (``mapInArrow``): its partition's rows, produced from the
    Spark Python worker, which joins the Ray cluster once and keeps its Producer."""
    if not ray.is_initialized():
        ray.init(address=ray_address, logging_level=logging.WARNING, log_to_driver=False)
    writer = _TopicWriter(spec)
    try:
        for batch in batches:
            writer.write(pa.Table.from_batches([batch]))
    except BaseException:
        writer.abort()
        raise
    rows, sent = writer.close()
    from pyspark import TaskContext

    task = TaskContext.get()
    part, attempt = (task.partitionId(), task.attemptNumber()) if task else (-1, -1)
    yield pa.RecordBatch.from_pydict(
        {
            "rows": [rows],
            "batches": [sent],
            "halves": [json.dumps(writer.halves)],
            "partition": pa.array([part], pa.int32()),
            "attempt": pa.array([attempt], pa.int32()),
        }
    )


_WORKER_ERROR = re.compile(r"(?:^|\n)\S*InvalidMessageError: (.*)")


def _write_spark(df: Any, spec: _WriteSpec, txn: Transaction | None = None) -> WriteResult:
    """Every row of a DataFrame sent by Spark's Python workers: no conversion to a Ray
    Dataset first (RayDP's ``from_spark`` cost more than the whole send). With ``txn``
    the rows go as its half messages and the successful tasks' are added to it."""
    spec.columns.check(df.columns)
    run = functools.partial(_write_partition, spec, ray.get_runtime_context().gcs_address)
    try:
        parts = df.select(*spec.columns.names()).mapInArrow(run, _SPARK_RESULT).collect()
    except Exception as exc:
        # A bad row fails its Spark task; say what the worker said, not Spark's wrapper.
        found = _WORKER_ERROR.search(str(exc))
        if found:
            raise InvalidMessageError(found.group(1).strip()) from exc
        raise
    rows, batches = sum(p.rows for p in parts), sum(p.batches for p in parts)
    if txn is None:
        return WriteResult(spec.topic, rows, batches)
    # collect() answers one result per partition: the attempt Spark counted. A failed
    # or superseded attempt's half messages are not named here, so not committed.
    for p in parts:
        txn.add_halves(json.loads(p.halves), p.rows)
        if p.attempt > 0:
            log.info(
                "transaction %s: partition %d succeeded at attempt %d; earlier attempts' "
                "half messages stay out of the commit",
                txn.txn_id,
                p.partition,
                p.attempt,
            )
    return WriteResult(spec.topic, rows, batches, txn.txn_id)


def _is_spark_dataframe(data: object) -> bool:
    module = type(data).__module__
    return module.startswith("pyspark.sql") and type(data).__name__ == "DataFrame"


def write_to_topic(
    data: Any,
    topic: str,
    *,
    body_col: str = "body",
    key_col: str | None = None,
    tag_col: str | None = None,
    properties_col: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    concurrency: int | None = None,
    ray_remote_args: Mapping[str, Any] | None = None,
    producer_options: Mapping[str, Any] | None = None,
    transactional: bool = False,
    transaction: Transaction | None = None,
    transactional_id: str | None = None,
) -> WriteResult:
    """Produce every row of ``data`` (a ``ray.data.Dataset`` or a Spark DataFrame of a
    RayDP session) as one message of ``topic``, from Ray workers in parallel.

    ``body_col`` is binary or string; ``key_col`` string (space-separated keys,
    each indexed); ``tag_col`` string (null: no tag); ``properties_col`` a map
    of strings. Rows are encoded in batches of ``batch_rows`` and sent by a
    Producer in each worker process: Ray Data write tasks for a Dataset (run with
    ``concurrency`` and ``ray_remote_args``), Spark's Python workers for a DataFrame.
    Returns when every batch is stored.

    ``transactional=True`` writes all rows or none, each once, in one transaction of a
    ``TransactionalProducer`` made for the call (``transactional_id``, default unique
    per call; give a stable one to have a rerun fence what a crashed run left open),
    committed when every task succeeded and aborted on failure. ``transaction=`` joins
    an open transaction of the caller's instead (rows added to it, not committed: the
    caller commits, e.g. with consumer offsets, as ``stream_to_spark(sink_topic=...)``
    does; after a failed write the caller should abort it). A task that Spark or Ray
    runs again (a Spark task retry, ``ray_remote_args={"max_retries": n,
    "retry_exceptions": True}``, a lost worker, Ray Data's ``max_map_retries``) counts
    once: only the attempt that returned hands its rows to the transaction.
    """
    spark = _is_spark_dataframe(data)
    if not spark and not isinstance(data, ray.data.Dataset):
        raise InvalidMessageError(
            f"write_to_topic: expected a ray.data.Dataset or a Spark DataFrame, "
            f"got {type(data).__name__}"
        )
    if transaction is not None and (transactional or transactional_id is not None):
        raise InvalidMessageError(
            "write_to_topic: transaction= joins the caller's transaction; "
            "transactional/transactional_id= make one: give one or the other"
        )
    if transaction is not None:
        _check_transaction(transaction)
    columns = _Columns(body_col, key_col, tag_col, properties_col)
    spec = _spec(topic, namespace, None, columns, batch_rows, DEFAULT_BATCH_BYTES, producer_options)
    write: Callable[[Transaction | None], WriteResult]
    if spark:
        spec.columns.check(data.columns)  # a bad column costs no coordinator call

        def write(txn: Transaction | None) -> WriteResult:
            return _write_spark(data, spec if txn is None else _with_txn(spec, txn), txn)

    else:
        known = data.columns(fetch_if_missing=False)  # None: known only once it runs
        if known is not None:
            spec.columns.check(known)

        def write(txn: Transaction | None) -> WriteResult:
            return _write_dataset(data, spec, txn, concurrency, ray_remote_args)

    if transactional:
        return _in_own_transaction(spec, transactional_id, write)
    result = write(transaction)
    if transaction is not None:
        log.info("sent %d rows to %s in %s", result.rows, topic, transaction.txn_id)
    else:
        log.info("wrote %d rows to %s in %d batches", result.rows, topic, result.batches)
    return result


def _check_transaction(transaction: object) -> None:
    if not isinstance(transaction, Transaction):
        raise InvalidMessageError(
            f"write_to_topic: transaction= must be a Transaction, got {type(transaction)}"
        )
    if transaction.state is not TransactionState.OPEN:
        raise InvalidMessageError(
            f"write_to_topic: transaction {transaction.txn_id} is {transaction.state.value}"
        )


def _write_dataset(
    ds: ray.data.Dataset,
    spec: _WriteSpec,
    txn: Transaction | None,
    concurrency: int | None,
    ray_remote_args: Mapping[str, Any] | None,
) -> WriteResult:
    """Every row of a Dataset sent by Ray Data write tasks (``TopicDatasink``); with
    ``txn`` as its half messages, the returned tasks' added to it."""
    sink = TopicDatasink._of(spec, txn)
    ds.write_datasink(sink, ray_remote_args=dict(ray_remote_args or {}), concurrency=concurrency)
    assert sink.result is not None
    return sink.result


def _with_txn(spec: _WriteSpec, txn: Transaction) -> _WriteSpec:
    return dataclasses.replace(spec, txn=txn.context())


def _in_own_transaction(
    spec: _WriteSpec, tid: str | None, write: Callable[[Transaction], WriteResult]
) -> WriteResult:
    """``write`` into one transaction of its own: committed once it returned (every
    task succeeded), aborted (nothing visible) on any failure."""
    producer = TransactionalProducer(
        "raymq-datasource-writer",
        transactional_id=tid or f"raymq-write.{spec.topic}.{uuid.uuid4().hex}",
        namespace=spec.namespace,
        nameservers=spec.nameservers,
    )
    try:
        txn = producer.begin()
        try:
            result = write(txn)
            txn.commit()
        except Exception:
            # a BaseException that is no Exception (the process going down) leaves it
            # to the coordinator: undecided, it is aborted after its txn_timeout_s
            try:
                txn.abort()
            except Exception as exc:  # noqa: BLE001 - the write's error is the one to see
                log.warning("aborting %s failed: %s (it times out undecided)", txn.txn_id, exc)
            raise
    finally:
        producer.close()
    log.info(
        "wrote %d rows to %s in %d batches, committed as %s",
        result.rows,
        spec.topic,
        result.batches,
        txn.txn_id,
    )
    return result
