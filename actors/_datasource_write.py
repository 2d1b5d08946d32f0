"""Rows of a Ray Dataset or a Spark DataFrame into a topic, sent by the workers.

Ray Data write tasks each encode their blocks with the Arrow encoder and send
them with a Producer of their own process (made once per worker process and
kept), so the rows go Spark executor / object store -> write task -> broker and
never through the driver. Delivery is at least once, as ``send_batch``'s: a
send that timed out and was retried may be stored twice.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import ray.data
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink

from storage.codec import EncodedBatch, validate_topic
from storage.errors import InvalidMessageError

from ._datasource_codec import ArrowMessages, encode_arrow
from .config import DEFAULT_NAMESPACE
from .producer import Producer

log = logging.getLogger("raymq.datasource.write")

DEFAULT_BATCH_ROWS = 8192
DEFAULT_BATCH_BYTES = 4 << 20
_IN_FLIGHT_BATCHES = 16

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


@dataclass(frozen=True)
class _Columns:
    body: str
    key: str | None
    tag: str | None
    properties: str | None

    def names(self) -> list[str]:
        return [c for c in (self.body, self.key, self.tag, self.properties) if c is not None]


class TopicDatasink(Datasink[tuple[int, int]]):
    """Ray Data sink that produces each row as a message of ``topic``."""

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
    ) -> None:
        from .cluster import discover_nameservers

        validate_topic(topic)
        if batch_rows <= 0 or batch_bytes <= 0:
            raise InvalidMessageError(
                f"batch_rows={batch_rows}, batch_bytes={batch_bytes}: must be > 0"
            )
        self.topic = topic
        self.namespace = namespace
        self.nameservers = tuple(nameservers or discover_nameservers(namespace))
        self.columns = _Columns(body_col, key_col, tag_col, properties_col)
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.producer_options = dict(producer_options or {})
        self.result: WriteResult | None = None

    def get_name(self) -> str:
        return f"RayMQTopic({self.topic})"

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        if schema is None:
            return
        missing = [c for c in self.columns.names() if c not in schema.names]
        if missing:
            raise InvalidMessageError(
                f"write_to_topic: column(s) {missing} not in the data (columns: {schema.names})"
            )

    def _messages(self, table: pa.Table) -> ArrowMessages:
        def column(name: str | None) -> pa.Array | None:
            return None if name is None else table.column(name).combine_chunks()

        body = column(self.columns.body)
        assert body is not None
        return ArrowMessages(
            body,
            column(self.columns.tag),
            column(self.columns.key),
            column(self.columns.properties),
        )

    def _slices(self, table: pa.Table) -> Iterable[pa.Table]:
        """``table`` in runs of at most ``batch_rows`` rows and about ``batch_bytes``."""
        if table.num_rows == 0:
            return
        per_row = max(1, table.nbytes // table.num_rows)
        step = max(1, min(self.batch_rows, self.batch_bytes // per_row))
        for first in range(0, table.num_rows, step):
            yield table.slice(first, step)

    def write(self, blocks: Iterable[Block], ctx: Any) -> tuple[int, int]:
        producer = _producer(self.namespace, self.nameservers, self.producer_options)
        max_size = producer.config.max_message_size
        born_host = producer.config.born_host
        rows = batches = 0
        pending: list[EncodedBatch] = []
        for block in blocks:
            table = BlockAccessor.for_block(block).to_arrow().select(self.columns.names())
            for part in self._slices(table):
                pending.append(
                    encode_arrow(
                        self.topic,
                        self._messages(part),
                        max_message_size=max_size,
                        born_host=born_host,
                        first_row=rows,
                    )
                )
                rows += part.num_rows
                if len(pending) >= _IN_FLIGHT_BATCHES:
                    producer.send_encoded(pending)
                    batches += len(pending)
                    pending = []
        if pending:
            producer.send_encoded(pending)
            batches += len(pending)
        return rows, batches

    def on_write_complete(self, write_result: Any) -> None:
        returns = write_result.write_returns
        self.result = WriteResult(
            self.topic, sum(r for r, _ in returns), sum(b for _, b in returns)
        )


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
) -> WriteResult:
    """Produce every row of ``data`` (a ``ray.data.Dataset`` or a Spark DataFrame of a
    RayDP session) as one message of ``topic``, from Ray workers in parallel.

    ``body_col`` is binary or string; ``key_col`` string (space-separated keys,
    each indexed); ``tag_col`` string (null: no tag); ``properties_col`` a map
    of strings. Rows are encoded in batches of ``batch_rows`` and sent by a
    Producer in each write task's process. Returns when every batch is stored.
    """
    names = [c for c in (body_col, key_col, tag_col, properties_col) if c is not None]
    spark_df = None
    if _is_spark_dataframe(data):
        from .spark import spark_to_dataset

        spark_df = data.select(*names)
        dataset = spark_to_dataset(spark_df)
    elif isinstance(data, ray.data.Dataset):
        dataset = data
    else:
        raise InvalidMessageError(
            f"write_to_topic: expected a ray.data.Dataset or a Spark DataFrame, "
            f"got {type(data).__name__}"
        )
    sink = TopicDatasink(
        topic,
        namespace=namespace,
        body_col=body_col,
        key_col=key_col,
        tag_col=tag_col,
        properties_col=properties_col,
        batch_rows=batch_rows,
        producer_options=producer_options,
    )
    try:
        dataset.write_datasink(
            sink, ray_remote_args=dict(ray_remote_args or {}), concurrency=concurrency
        )
    finally:
        if spark_df is not None:
            from raydp.spark import release_spark_recoverable

            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "DataFrame.sql_ctx is an internal property")
                release_spark_recoverable(spark_df)
    assert sink.result is not None
    log.info("wrote %d rows to %s in %d batches", sink.result.rows, topic, sink.result.batches)
    return sink.result
