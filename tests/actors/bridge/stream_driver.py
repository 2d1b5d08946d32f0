"""A Spark driver process of its own, for ``test_spark_transactions``: it starts a RayDP
session on the test's Ray cluster (in the Ray namespace ``NAMESPACE``), runs
``stream_to_spark`` from ``IN`` to the sink topic ``OUT`` with :func:`transform` and, at
one step of one batch, says so on stdout and waits for the test to SIGKILL it.

Batch 1's tasks hold (:func:`transform`) until the file ``marker`` exists, after their
writer sent part of their rows: the test kills this session's executor meanwhile.

``python stream_driver.py <ray address> <cluster namespace> <marker> <batch id> <step>``
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import ray
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from actors.bridge.spark import init_spark
from actors.bridge.streaming import stream_to_spark

IN, OUT, GROUP, PER_BATCH = "EoDriverIn", "EoDriverOut", "eo-driver", 100
NAMESPACE = "raymq-test-driver"  # the Ray namespace: its RayDP actors are found there
# Arrow batches of 10 rows between the steps: Spark's default of 10,000 would hand the
# writer nothing before the held step ended
CONFIGS = {"spark.sql.execution.arrow.maxRecordsPerBatch": "10"}


def hold_until(marker: str, after: int) -> Callable[[Iterator[pa.RecordBatch]], Any]:
    """A ``mapInArrow`` step that notes each task attempt in ``marker.attempts``, passes
    its rows on in slices of 10 and, while ``marker`` does not exist, stops after
    ``after`` rows (saying so with ``marker.holding``) until it does (60 s at most): the
    writer behind it sends the first rows' half messages and waits for more while the
    test kills the executor. Once ``marker`` exists (the task's retry on the restarted
    executor) every row passes."""

    def step(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import os
        import time

        from pyspark import TaskContext

        task = TaskContext.get()
        with open(marker + ".attempts", "a") as attempts:
            attempts.write(f"{task.partitionId()} {task.attemptNumber()}\n")
        seen = 0
        for batch in batches:
            for start in range(0, batch.num_rows, 10):
                if seen >= after and not os.path.exists(marker):
                    open(marker + ".holding", "w").close()
                    deadline = time.monotonic() + 60
                    while not os.path.exists(marker):
                        if time.monotonic() > deadline:
                            raise RuntimeError("held 60 s: the executor was never killed")
                        time.sleep(0.05)
                part = batch.slice(start, 10)
                seen += part.num_rows
                yield part

    return step


def transform(marker: str) -> Callable[[DataFrame, int], DataFrame]:
    """``out-<body>|xxx...``: 8 KB bodies, since Spark buffers 64 KB for a Python worker
    before sending (small rows would reach the writer only once the held step ended);
    batch 1 holds as :func:`hold_until` says (batch 0 warms the executor's Python
    workers: a writer cold in its first task did not send before the hold)."""

    def fn(df: DataFrame, batch_id: int) -> DataFrame:
        pad = F.concat(F.lit("|"), F.repeat(F.lit("x"), 8000))
        out = df.select(F.concat(F.lit("out-"), F.col("body"), pad).cast("binary").alias("body"))
        return out.mapInArrow(hold_until(marker, 40), "body binary") if batch_id == 1 else out

    return fn


def main() -> None:
    address, namespace, marker = sys.argv[1], sys.argv[2], sys.argv[3]
    batch, at = int(sys.argv[4]), sys.argv[5]
    ray.init(address=address, namespace=NAMESPACE, logging_level="WARNING", log_to_driver=False)
    spark = init_spark("raymq-test-driver", num_executors=1, executor_cores=1)
    for key, value in CONFIGS.items():
        spark.conf.set(key, value)

    def on_step(step: str, batch_id: int) -> None:
        print(f"step {step} {batch_id}", flush=True)
        if (batch_id, step) == (batch, at):
            print("waiting to be killed", flush=True)
            threading.Event().wait()

    query = stream_to_spark(
        spark,
        IN,
        GROUP,
        transform(marker),
        sink_topic=OUT,
        sink_options={"batch_rows": 5},
        namespace=namespace,
        max_messages_per_batch=PER_BATCH,
        available_now=True,
        num_partitions=2,
        on_step=on_step,
    )
    query.await_termination(timeout_s=300)
    print(f"ended: {query.exception!r}", flush=True)


if __name__ == "__main__":
    main()
