"""A Spark driver process of its own, for ``test_spark_transactions``: it starts a RayDP
session on the test's Ray cluster, runs ``stream_to_spark`` from ``EoDriverIn`` to the
sink topic ``EoDriverOut`` and, at one step of one batch, says so on stdout and waits
for the test to SIGKILL it.

``python stream_driver.py <ray address> <namespace> <batch id> <step>``
"""

from __future__ import annotations

import sys
import threading

import ray
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from actors.bridge.spark import init_spark
from actors.bridge.streaming import stream_to_spark

IN, OUT, GROUP, PER_BATCH = "EoDriverIn", "EoDriverOut", "eo-driver", 100


def transform(df: DataFrame, batch_id: int) -> DataFrame:
    return df.select(F.concat(F.lit("out-"), F.col("body")).cast("binary").alias("body"))


def main() -> None:
    address, namespace, batch, at = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    spark = init_spark("raymq-test-driver", num_executors=1, executor_cores=1)

    def on_step(step: str, batch_id: int) -> None:
        print(f"step {step} {batch_id}", flush=True)
        if (batch_id, step) == (batch, at):
            print("waiting to be killed", flush=True)
            threading.Event().wait()

    query = stream_to_spark(
        spark,
        IN,
        GROUP,
        transform,
        sink_topic=OUT,
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
