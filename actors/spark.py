"""The Spark bridge: a Spark session on the Ray cluster (RayDP) and topic data in and out of it.

``init_spark`` starts Spark *inside* Ray through RayDP (the Spark master and
executors are Ray actors), so a topic read into a ``ray.data.Dataset`` becomes a
Spark DataFrame without leaving the object store, and a DataFrame comes back as
a Dataset the same way. ``dataset_to_spark`` and ``spark_to_dataset`` wrap the
two conversions with the fixes this stack needs.

What was checked on ray 2.60.0, raydp 1.6.5, pyspark 3.5.7, pyarrow 26, Java 17
(tests/spark holds the evidence):

* Java 17 needs the ``--add-opens`` flags RayDP's own tests and examples use
  (``JAVA17_OPTIONS``) in the driver, the executors and the RayDP app master
  (``spark.ray.raydp_app_master.extraJavaOptions``); ``init_spark`` sets all three.
  Without them a session starts and ``to_spark`` even works, but
  ``from_spark`` kills the executor: Ray's Java serializer fails with
  "module java.base does not opens java.lang".
* ``Dataset.to_spark(spark)`` works for Arrow blocks: it ships block references
  to the executors, whose Python workers read them back with ``ray.get``.
  Strings, int32, int64, binary (byte-identical) and list<string> arrive with
  the right Spark types. Four traps, all handled by ``dataset_to_spark``:

  - Arrow ``map`` columns fail at the first action (PySpark's pandas converter
    asserts a dict but gets Arrow's list of pairs). Workaround: cast the map to
    ``list<struct<key, value>>`` in Ray and rebuild it with
    ``map_from_entries`` in Spark, which yields a proper ``map<k, v>``.
  - Pandas blocks (``from_pandas``, ``map_batches`` returning pandas) are
    refused ("to_spark does not support converting non-arrow ray datasets").
    Workaround: a ``map_batches`` in ``pyarrow`` format first.
  - One Spark partition per Ray block: 200 tiny blocks meant 45 s for 1 000
    rows. Workaround: ``repartition`` the Dataset to a few blocks first.
  - With pandas 3 (its Arrow-backed ``str`` dtype), a string column stored in
    several Arrow chunks (what ``repartition`` makes) fails in Spark with
    "Expected Array, got ChunkedArray". Workaround: ``combine_chunks`` per block
    after the repartition.

* ``ray.data.from_spark(df)`` (for any DataFrame of a RayDP session) works,
  ``map``, ``binary`` and all the other topic types included, with no
  workaround. It is RayDP's *recoverable* conversion: Spark caches the
  DataFrame's Arrow bytes so Ray can rebuild lost blocks; the cache lives until
  ``raydp.spark.release_spark_recoverable(df)`` or ``stop_spark``. Through
  ``ray.data.from_spark`` it also logs a bogus ``parallelism`` deprecation
  warning, so ``spark_to_dataset`` calls RayDP directly.
* Results reach the driver fast with Arrow on
  (``spark.sql.execution.arrow.pyspark.enabled``, a default here): ``toPandas``
  of 100 000 rows with binary bodies takes ~2 s against ~11 s for ``collect``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import pyarrow as pa
import ray
import ray.data
import raydp
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from raydp.spark import from_spark_recoverable

from storage.errors import RayMQError

__all__ = [
    "JAVA17_OPTIONS",
    "TOPIC_SCHEMA",
    "dataset_to_spark",
    "init_spark",
    "spark_to_dataset",
    "stop_spark",
]

log = logging.getLogger("raymq.spark")

# RayDP's list (python/raydp/tests/conftest.py, examples/data_process.py):
# Spark, Arrow and Ray's serializers reach into these JDK internals by reflection.
JAVA17_OPTIONS: tuple[str, ...] = (
    "-XX:+IgnoreUnrecognizedVMOptions",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.invoke=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.net=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/java.math=ALL-UNNAMED",
    "--add-opens=java.base/java.text=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.cs=ALL-UNNAMED",
    "--add-opens=java.base/sun.security.action=ALL-UNNAMED",
    "--add-opens=java.base/sun.util.calendar=ALL-UNNAMED",
)

_JAVA_OPTION_KEYS = (
    "spark.driver.extraJavaOptions",
    "spark.executor.extraJavaOptions",
    "spark.ray.raydp_app_master.extraJavaOptions",
)

TOPIC_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("msg_id", pa.string()),
        ("keys", pa.string()),
        ("tags", pa.string()),
        ("born_timestamp", pa.int64()),
        ("store_timestamp", pa.int64()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("body", pa.binary()),
    ]
)
"""One row per message of a topic, as the Spark bridge carries it (keys space-separated)."""

# Marks, on the Arrow field, a map column that travels as list<struct<key, value>>.
_MAP_MARK = b"raymq.spark.map"


def _default_configs(num_executors: int, executor_cores: int) -> dict[str, str]:
    python = sys.executable
    return {
        # 200 shuffle partitions (Spark's default) is two orders too many for a few cores.
        "spark.sql.shuffle.partitions": str(max(2, 2 * num_executors * executor_cores)),
        "spark.driver.memory": "1g",
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": python,
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Progress bars are noise in logs and CI output.
        "spark.ui.showConsoleProgress": "false",
        # The master only relays; its CPU is better left to executors and Ray tasks.
        "spark.ray.raydp_spark_master.actor.resource.CPU": "0",
    }


def _merge_configs(
    num_executors: int, executor_cores: int, configs: dict[str, str] | None
) -> dict[str, str]:
    merged = _default_configs(num_executors, executor_cores)
    user = dict(configs or {})
    java = " ".join(JAVA17_OPTIONS)
    for key in _JAVA_OPTION_KEYS:
        # The caller's options come last so that they win where the JVM lets the last one win.
        merged[key] = f"{java} {user.pop(key)}" if key in user else java
    merged.update(user)
    return merged


def init_spark(
    app_name: str = "raymq",
    num_executors: int = 1,
    executor_cores: int = 1,
    executor_memory: str | int = "1g",
    configs: dict[str, str] | None = None,
    **kwargs: Any,
) -> SparkSession:
    """Start Spark on the current Ray cluster through RayDP and return its session.

    Connects to Ray first when this process is not connected (``ray.init()``:
    ``RAY_ADDRESS``, else a cluster started on this node, else a new local one).
    ``configs`` override the defaults here; Java options given in ``configs`` are
    appended to ``JAVA17_OPTIONS``. ``kwargs`` go to ``raydp.init_spark``
    (``placement_group_strategy``, ``fault_tolerant_mode``, ...). One session per
    process: call ``stop_spark`` before starting another.
    """
    merged = _merge_configs(num_executors, executor_cores, configs)
    # Python workers started by Spark (and PySpark's own launcher) read these.
    os.environ["PYSPARK_PYTHON"] = merged["spark.pyspark.python"]
    os.environ["PYSPARK_DRIVER_PYTHON"] = merged["spark.pyspark.driver.python"]
    if not ray.is_initialized():
        ray.init()
    log.info(
        "starting Spark %r on Ray: %d executor(s) x %d core(s), %s each",
        app_name,
        num_executors,
        executor_cores,
        executor_memory,
    )
    return raydp.init_spark(
        app_name, num_executors, executor_cores, executor_memory, configs=merged, **kwargs
    )


def stop_spark(cleanup_data: bool = True) -> None:
    """Stop the session ``init_spark`` started and release its Ray actors (no-op if none)."""
    raydp.stop_spark(cleanup_data=cleanup_data)


def _spark_ready_batch(batch: pa.Table) -> pa.Table:
    """Give a block the shape to_spark can carry: one chunk per column, maps as entry lists.

    One chunk, because under pandas 3 a string column of several chunks becomes
    a pandas string array that PySpark 3.5 turns into a ChunkedArray, and its
    ``mapInPandas`` fails ("Expected Array, got ChunkedArray").
    """
    batch = batch.combine_chunks()
    fields, columns = [], []
    for field, column in zip(batch.schema, batch.columns):
        if pa.types.is_map(field.type):
            entries = pa.list_(
                pa.struct(
                    [pa.field("key", field.type.key_type), pa.field("value", field.type.item_type)]
                )
            )
            column = column.cast(entries)
            field = pa.field(field.name, entries, field.nullable, metadata={_MAP_MARK: b"1"})
        fields.append(field)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _arrow_schema(ds: ray.data.Dataset) -> pa.Schema | None:
    schema = ds.schema()
    schema = getattr(schema, "base_schema", schema)
    return schema if isinstance(schema, pa.Schema) else None


def dataset_to_spark(
    spark: SparkSession, ds: ray.data.Dataset, num_partitions: int | None = None
) -> DataFrame:
    """Turn a Ray Dataset into a Spark DataFrame of ``num_partitions`` partitions.

    ``num_partitions`` defaults to Spark's default parallelism (its executor
    cores). Map columns come out as Spark maps, binary columns byte for byte.
    The Dataset is materialized: its blocks stay in Ray's object store for as
    long as Spark may read them.
    """
    if num_partitions is None:
        num_partitions = spark.sparkContext.defaultParallelism
    if num_partitions < 1:
        raise RayMQError(f"dataset_to_spark: num_partitions={num_partitions} must be >= 1")
    # Repartition first: it leaves blocks of many chunks, which the map step joins.
    ready = (
        ds.repartition(num_partitions)
        .map_batches(
            _spark_ready_batch, batch_format="pyarrow", batch_size=None, zero_copy_batch=True
        )
        .materialize()
    )
    arrow_schema = _arrow_schema(ready)
    if arrow_schema is None:
        # No rows went through the map step: derive its output schema from the input's.
        source = _arrow_schema(ds)
        if source is None:
            raise RayMQError(
                "dataset_to_spark: the Dataset is empty and has no Arrow schema; give it one, "
                "e.g. ray.data.from_arrow(TOPIC_SCHEMA.empty_table())"
            )
        arrow_schema = _spark_ready_batch(source.empty_table()).schema
    if ready.count() == 0:
        df = spark.createDataFrame([], from_arrow_schema(arrow_schema))
    else:
        df = ready.to_spark(spark)
    maps = [f.name for f in arrow_schema if f.metadata and _MAP_MARK in f.metadata]
    for name in maps:
        df = df.withColumn(name, F.map_from_entries(F.col(name)))
    return df


def spark_to_dataset(df: DataFrame, num_blocks: int | None = None) -> ray.data.Dataset:
    """Turn a DataFrame of a RayDP session into a Ray Dataset (one block per partition).

    ``num_blocks`` repartitions the DataFrame first. Spark keeps the DataFrame
    cached so that Ray can rebuild lost blocks, until
    ``raydp.spark.release_spark_recoverable(df)`` or ``stop_spark``.
    """
    if num_blocks is not None and num_blocks < 1:
        raise RayMQError(f"spark_to_dataset: num_blocks={num_blocks} must be >= 1")
    return from_spark_recoverable(df, parallelism=num_blocks)
