"""Ray Dataset blocks into a Spark DataFrame, Arrow all the way (``mapInArrow``).

RayDP's ``Dataset.to_spark`` reads each block in a Spark Python worker and hands
it to Spark through ``mapInPandas``: every row becomes Python objects twice
(``to_pandas``, then pandas back to Arrow), which made a count of a million
100-byte messages take ~17 s on one executor core, and Arrow ``map`` columns
break on the way. Here each Spark task reads its slices of blocks with
``ray.get`` and yields them as Arrow record batches through ``mapInArrow``:
no per-row Python, maps and binary columns as they are, and any number of
partitions regardless of how many blocks the Dataset has.

The block references live in a small holder actor per Spark application
(``raymq-spark-blocks-<app id>``), so they stay readable for as long as Spark
may re-read the DataFrame: until :func:`release` or the driver's exit.
"""

from __future__ import annotations

import logging
import threading
import uuid
import weakref
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import ray
import ray.data
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from ray.data.block import BlockAccessor

log = logging.getLogger("raymq.spark")

_MAX_BATCH_ROWS = 32_768
_HOLDER_PREFIX = "raymq-spark-blocks-"

# DataFrame -> (holder actor name, namespace, key) of the blocks it reads.
_held: weakref.WeakKeyDictionary[DataFrame, tuple[str, str, str]] = weakref.WeakKeyDictionary()
_holders: dict[tuple[str, str], Any] = {}
_lock = threading.Lock()


class _BlockHolder:
    """Holds block references by DataFrame key; Spark tasks ask it for them."""

    def __init__(self) -> None:
        self._blocks: dict[str, list[Any]] = {}

    def put(self, key: str, refs: list[Any]) -> None:
        self._blocks[key] = refs

    def get(self, key: str, indexes: list[int]) -> list[Any]:
        blocks = self._blocks.get(key)
        if blocks is None:
            raise KeyError(f"the blocks of DataFrame {key} were released")
        return [blocks[i] for i in indexes]

    def release(self, key: str) -> bool:
        return self._blocks.pop(key, None) is not None

    def held(self) -> int:
        return len(self._blocks)


def _holder(spark: SparkSession) -> tuple[Any, str, str]:
    name = _HOLDER_PREFIX + spark.sparkContext.applicationId
    namespace = ray.get_runtime_context().namespace
    with _lock:
        handle = _holders.get((name, namespace))
        if handle is None:
            # Kept here: a named actor that is not detached dies with its last handle.
            handle = _holders[(name, namespace)] = (
                ray.remote(_BlockHolder)
                .options(name=name, namespace=namespace, get_if_exists=True, num_cpus=0)
                .remote()
            )
    return handle, name, namespace


def _plan(rows: list[int], partitions: int) -> list[list[tuple[int, int, int]]]:
    """Cut blocks of ``rows`` rows into ``partitions`` runs of (block, start, stop) slices
    of about equal row counts, in block order."""
    total = sum(rows)
    plan: list[list[tuple[int, int, int]]] = [[] for _ in range(partitions)]
    if total == 0:
        return plan
    # Partition p takes global rows [bounds[p], bounds[p + 1]).
    bounds = [total * p // partitions for p in range(partitions + 1)]
    first = 0
    p = 0
    for index, n in enumerate(rows):
        start = 0
        while start < n:
            while bounds[p + 1] <= first + start:
                p += 1
            stop = min(n, bounds[p + 1] - first)
            plan[p].append((index, start, stop))
            start = stop
        first += n
    return plan


def _reader(
    plan: list[list[tuple[int, int, int]]],
    holder: tuple[str, str],
    key: str,
    ray_address: str,
    schema: pa.Schema,
) -> Any:
    """The function each Spark task runs: its partition's slices as record batches."""

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        if not ray.is_initialized():
            ray.init(address=ray_address, logging_level=logging.WARNING, log_to_driver=False)
        handle = ray.get_actor(holder[0], namespace=holder[1])
        for batch in batches:
            for partition in batch.column(0).to_pylist():
                slices = plan[partition]
                if not slices:
                    continue
                indexes = sorted({i for i, _, _ in slices})
                refs = dict(zip(indexes, ray.get(handle.get.remote(key, indexes))))
                for index, start, stop in slices:
                    block = ray.get(refs[index])
                    table = BlockAccessor.for_block(block).to_arrow().slice(start, stop - start)
                    table = table.select(schema.names).cast(schema)
                    yield from table.to_batches(max_chunksize=_MAX_BATCH_ROWS)

    return read


def arrow_schema(ds: ray.data.Dataset) -> pa.Schema | None:
    schema = ds.schema()
    schema = getattr(schema, "base_schema", schema)
    return schema if isinstance(schema, pa.Schema) else None


def blocks_to_spark(
    spark: SparkSession,
    ds: ray.data.Dataset,
    num_partitions: int,
    schema: pa.Schema,
) -> DataFrame:
    """``ds`` (materialized here) as a DataFrame of ``num_partitions`` partitions."""
    bundles = list(ds.materialize().iter_internal_ref_bundles())
    refs = [ref for bundle in bundles for ref in bundle.block_refs]
    rows = [meta.num_rows or 0 for bundle in bundles for meta in bundle.metadata]
    handle, name, namespace = _holder(spark)
    key = uuid.uuid4().hex
    ray.get(handle.put.remote(key, refs))
    plan = _plan(rows, num_partitions)
    address = ray.get_runtime_context().gcs_address
    spark_schema = from_arrow_schema(schema)
    df = spark.range(0, num_partitions, 1, num_partitions).mapInArrow(
        _reader(plan, (name, namespace), key, address, schema), spark_schema
    )
    with _lock:
        _held[df] = (name, namespace, key)
    log.debug("DataFrame %s reads %d rows of %d blocks", key[:8], sum(rows), len(refs))
    return df


def release(df: DataFrame) -> bool:
    """Let go of the blocks ``df`` reads (it cannot be evaluated again afterwards)."""
    with _lock:
        entry = _held.pop(df, None)
    if entry is None:
        return False
    name, namespace, key = entry
    try:
        handle = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return bool(ray.get(handle.release.remote(key)))


def release_all() -> None:
    """Let go of every block any DataFrame of this process reads (at ``stop_spark``)."""
    with _lock:
        holders = list(_holders.values())
        _holders.clear()
        _held.clear()
    if ray.is_initialized():
        for handle in holders:
            ray.kill(handle)
