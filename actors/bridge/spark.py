"""The Spark bridge: a Spark session on the Ray cluster (RayDP) and topic data in and out of it.

``init_spark`` starts Spark *inside* Ray through RayDP (the Spark master and
executors are Ray actors), so a topic read into a ``ray.data.Dataset`` becomes a
Spark DataFrame without leaving the object store, and a DataFrame comes back as
a Dataset the same way. ``dataset_to_spark`` and ``spark_to_dataset`` wrap the
two conversions with the fixes this stack needs; ``topic_to_spark`` reads a
topic into a DataFrame (``actors.bridge.datasource.read_topic`` underneath) and
``write_to_topic`` produces a DataFrame's rows into a topic from Spark's own
Python workers (``mapInArrow``; they join the Ray cluster once, as RayDP's Ray ->
Spark path does): converting the DataFrame to a Ray Dataset first through
``from_spark`` took longer than the whole send.
Micro-batch streaming is ``actors.bridge.streaming.stream_to_spark``.

What was checked on ray 2.60.0, raydp 1.6.5, pyspark 3.5.7, pyarrow 26, Java 17
(tests/spark holds the evidence):

* Java 17 needs the ``--add-opens`` flags RayDP's own tests and examples use
  (``JAVA17_OPTIONS``) in the driver, the executors and the RayDP app master
  (``spark.ray.raydp_app_master.extraJavaOptions``); ``init_spark`` sets all three.
  Without them a session starts and ``to_spark`` even works, but
  ``from_spark`` kills the executor: Ray's Java serializer fails with
  "module java.base does not opens java.lang".
* ``Dataset.to_spark(spark)`` (RayDP's own Ray -> Spark path) ships block
  references to the executors, whose Python workers read them with
  ``ray.get`` and hand them to Spark through ``mapInPandas``. It has four
  traps — Arrow ``map`` columns fail at the first action; pandas blocks are
  refused; one Spark partition per Ray block (200 tiny blocks: 45 s for 1 000
  rows); under pandas 3 a string column of several chunks fails with
  "Expected Array, got ChunkedArray" — and it is slow: every row becomes Python
  objects twice (``to_pandas``, then back to Arrow), ~17 s to count a million
  100-byte messages on one executor core. ``dataset_to_spark`` therefore keeps
  RayDP's idea (executors ``ray.get`` the blocks) but uses ``mapInArrow``
  (``actors.bridge.spark_blocks``): no per-row Python, maps and binary columns
  as they are, pandas blocks turned to Arrow in Ray, and partitions cut to
  even row counts whatever the blocks: the same count takes ~4 s.
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
import warnings
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import ray
import ray.data
import raydp
from pyspark.sql import DataFrame, SparkSession
from raydp.spark import from_spark_recoverable

from actors.bridge.arrow_codec import TOPIC_SCHEMA
from actors.bridge.datasource import EndOffsets, QueueRange, StartOffsets, read_topic
from actors.bridge.spark_blocks import arrow_schema, blocks_to_spark, release, release_all
from actors.bridge.write import WriteResult, write_to_topic
from actors.protocol.names import DEFAULT_NAMESPACE
from storage.errors import RayMQError

__all__ = [
    "JAVA17_OPTIONS",
    "TOPIC_SCHEMA",
    "WriteResult",
    "dataset_to_spark",
    "init_spark",
    "read_topic",
    "release_dataframe",
    "spark_to_dataset",
    "stop_spark",
    "topic_to_spark",
    "write_to_topic",
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
    logs = _session_logs_dir()
    if logs is not None:
        # RayDP's Java agent writes the driver's log under -Dray.logging.dir, else under
        # /tmp/ray/session_latest/logs: a link that the newest Ray started on this machine
        # (any user's, any cluster's) moves, and that dangles once its session is removed,
        # which fails the driver's JVM at start ("Error create log dir.").
        key = "spark.driver.extraJavaOptions"
        merged[key] = f"-Dray.logging.dir={logs} {merged[key]}"
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


def _session_logs_dir() -> str | None:
    """The logs directory of the Ray session this process is connected to, on this node;
    ``None`` where Ray does not say (a Ray Client connection)."""
    node = getattr(ray._private.worker, "_global_node", None)
    get = getattr(node, "get_logs_dir_path", None)
    return str(get()) if get is not None else None


def stop_spark(cleanup_data: bool = True) -> None:
    """Stop the session ``init_spark`` started and release its Ray actors and the blocks its
    DataFrames read (no-op if none)."""
    raydp.stop_spark(cleanup_data=cleanup_data)
    release_all()


def _with_arrow_schema(ds: ray.data.Dataset) -> tuple[ray.data.Dataset, pa.Schema]:
    """``ds`` and its Arrow schema; pandas blocks are turned into Arrow ones first."""
    schema = arrow_schema(ds)
    if schema is None and ds.schema() is not None:
        ds = ds.map_batches(_identity, batch_format="pyarrow", batch_size=None)
        schema = arrow_schema(ds)
    if schema is None:
        raise RayMQError(
            "dataset_to_spark: the Dataset is empty and has no Arrow schema; give it one, "
            "e.g. ray.data.from_arrow(TOPIC_SCHEMA.empty_table())"
        )
    return ds, schema


def _identity(batch: pa.Table) -> pa.Table:
    return batch


def dataset_to_spark(
    spark: SparkSession, ds: ray.data.Dataset, num_partitions: int | None = None
) -> DataFrame:
    """Turn a Ray Dataset into a Spark DataFrame of ``num_partitions`` partitions.

    ``num_partitions`` defaults to Spark's default parallelism (its executor
    cores); partitions hold about equal row counts whatever the Dataset's
    blocks. Map columns come out as Spark maps, binary columns byte for byte.
    The Dataset is materialized: its blocks stay in Ray's object store for as
    long as Spark may read them (until ``release_dataframe(df)`` or the
    driver's exit).
    """
    if num_partitions is None:
        num_partitions = spark.sparkContext.defaultParallelism
    if num_partitions < 1:
        raise RayMQError(f"dataset_to_spark: num_partitions={num_partitions} must be >= 1")
    ds, schema = _with_arrow_schema(ds)
    return blocks_to_spark(spark, ds, num_partitions, schema)


def release_dataframe(df: DataFrame) -> bool:
    """Free the Ray blocks a DataFrame of ``dataset_to_spark`` reads; it cannot be
    evaluated again afterwards. False when ``df`` holds none."""
    return release(df)


def spark_to_dataset(df: DataFrame, num_blocks: int | None = None) -> ray.data.Dataset:
    """Turn a DataFrame of a RayDP session into a Ray Dataset (one block per partition).

    ``num_blocks`` repartitions the DataFrame first. Spark keeps the DataFrame
    cached so that Ray can rebuild lost blocks, until
    ``raydp.spark.release_spark_recoverable(df)`` or ``stop_spark``.
    """
    if num_blocks is not None and num_blocks < 1:
        raise RayMQError(f"spark_to_dataset: num_blocks={num_blocks} must be >= 1")
    with warnings.catch_warnings():
        # RayDP reads df.sql_ctx, which PySpark 3.5 warns about on every call.
        warnings.filterwarnings("ignore", "DataFrame.sql_ctx is an internal property")
        return from_spark_recoverable(df, parallelism=num_blocks)


ROWS_PER_PARTITION = 1_000_000
"""``topic_to_spark``'s default partition size: large enough that Spark's per-partition
cost vanishes, small enough that a partition's Arrow batch stays well under 2 GiB."""


def topic_to_spark(
    spark: SparkSession,
    topic: str,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    group: str | None = None,
    start_offsets: StartOffsets | None = None,
    end_offsets: EndOffsets = "latest",
    tags: str | None = None,
    num_partitions: int | None = None,
    ranges: Sequence[QueueRange] | None = None,
    **read_options: Any,
) -> DataFrame:
    """A bounded read of ``topic`` as a Spark DataFrame of ``TOPIC_SCHEMA`` columns.

    The rows go broker -> Ray read tasks -> Spark executors (``read_topic``, then
    ``dataset_to_spark``), never through the driver. ``num_partitions`` defaults
    to Spark's default parallelism, or one partition per ``ROWS_PER_PARTITION``
    rows when that is more. Offsets and ``read_options`` as in ``read_topic``.
    """
    if ranges is None:
        from actors.bridge.datasource import plan_topic_read

        ranges = plan_topic_read(
            topic,
            namespace=namespace,
            group=group,
            start_offsets=start_offsets,
            end_offsets=end_offsets,
        )
    ds = read_topic(topic, namespace=namespace, tags=tags, ranges=ranges, **read_options)
    if num_partitions is None:
        rows = sum(r.count for r in ranges)
        num_partitions = max(spark.sparkContext.defaultParallelism, -(-rows // ROWS_PER_PARTITION))
    return dataset_to_spark(spark, ds, num_partitions)
