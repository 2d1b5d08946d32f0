"""One RayDP Spark session for the bridge's tests, on the session's one Ray cluster
(``ray_cluster`` of ``tests/actors/conftest.py``: this process's own, never a cluster
someone else started). This folder is a package so that the session, which holds
Spark's executors and their CPUs, ends with its tests rather than with the run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import ray
from pyspark.sql import DataFrame, SparkSession

import actors
from actors.bridge.spark import TOPIC_SCHEMA, dataset_to_spark, init_spark, stop_spark

NUM_QUEUES = 8
TAGS = ("TagA", "TagB", "TagC", None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kills_spark_executor: kills the package session's Spark executor; runs last in "
        "the package (RayDP 1.6.5 loses a restarted executor a minute or two later)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``kills_spark_executor`` run after the package's other tests. Ray
    restarts a killed RayDP executor and Spark takes it back, but RayDP 1.6.5 loses its
    handle to the restarted actor and Ray destroys it a minute or two later: a later
    job of the session would wait forever for an executor."""
    here = Path(__file__).parent
    mine = [i for i, item in enumerate(items) if here in Path(item.path).parents]
    if not mine:
        return
    last = mine[-1]
    marked = [items[i] for i in mine if items[i].get_closest_marker("kills_spark_executor")]
    for item in marked:
        items.remove(item)
    last -= len(marked)
    items[last + 1 : last + 1] = marked


@pytest.fixture(scope="package")
def spark(ray_cluster: Any) -> Iterator[SparkSession]:
    """A RayDP session with one 1-core executor, on 4 logical CPUs (Ray Data needs some too)."""
    session = init_spark("raymq-test", num_executors=1, executor_cores=1, executor_memory="1g")
    yield session
    stop_spark()


# Store files sized for a few million small messages (RocketMQ's defaults are GiBs).
STORE = {
    "commitlog_file_size": 64 << 20,
    "index_hash_slots": 100_003,
    "index_max_entries": 1_000_000,
    "flush_interval_commitlog_ms": 50,
}


@pytest.fixture(scope="package")
def raymq(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[actors.Cluster]:
    """A RayMQ cluster in the tests' Ray: 1 NameServer, brokers ``broker-a`` and
    ``broker-b``, stores in a temporary directory, its own namespace."""
    cluster = actors.start_cluster(
        namespace=f"spark-{uuid.uuid4().hex[:8]}",
        nameservers=1,
        brokers=2,
        store_root=str(tmp_path_factory.mktemp("raymq")),
        broker_options={
            "store": STORE,
            "heartbeat_interval_s": 2.0,
            # test_spark_transactions: stray half messages resolved within a second
            "transaction_check_interval_s": 0.5,
            "transaction_timeout_s": 1.0,
        },
    )
    yield cluster
    cluster.shutdown(timeout_s=10.0)


@pytest.fixture(scope="package")
def txn_cluster(raymq: actors.Cluster, tmp_path_factory: pytest.TempPathFactory) -> actors.Cluster:
    """The package's cluster with its transaction coordinator logging to a temp dir (the
    first TransactionalProducer of a namespace creates it): the transactional writes'."""
    first = raymq.transactional_producer(
        "bridge-txn-setup",
        "bridge-txn-setup",
        coordinator_log_dir=str(tmp_path_factory.mktemp("txnlog")),
    )
    first.close()
    return raymq


def _topic_table(n: int, seed: int = 7) -> pa.Table:
    """``n`` messages of one topic over ``NUM_QUEUES`` queues, random bodies of 0-511 bytes.

    Row ``i`` is offset ``i // NUM_QUEUES`` of queue ``i % NUM_QUEUES``; tag
    ``TAGS[i % len(TAGS)]`` (None: untagged).
    """
    rng = np.random.default_rng(seed)
    i = np.arange(n, dtype=np.int64)
    lengths = rng.integers(0, 512, n)
    lengths[::1000] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    body = pa.BinaryArray.from_buffers(
        pa.binary(),
        n,
        [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(rng.bytes(int(offsets[-1])))],
    )
    tags = [TAGS[k % len(TAGS)] for k in range(n)]
    keys = [f"order-{k}" for k in range(n)]
    prop_keys = pa.array(["KEYS", "UNIQ_KEY"] * n)
    prop_values = pa.array([v for k in range(n) for v in (keys[k], f"{k:032X}")])
    properties = pa.MapArray.from_arrays(
        pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32)), prop_keys, prop_values
    )
    born = 1_700_000_000_000 + i
    columns = {
        "topic": pa.array(["Orders"] * n),
        "broker_name": pa.array(["broker-a"] * n),
        "queue_id": pa.array(i % NUM_QUEUES, pa.int32()),
        "queue_offset": pa.array(i // NUM_QUEUES),
        "msg_id": pa.array([f"7F00000100002A9F{k:016X}" for k in range(n)]),
        "keys": pa.array(keys),
        "tags": pa.array(tags, pa.string()),
        "born_timestamp": pa.array(born),
        "store_timestamp": pa.array(born + 3),
        "properties": properties,
        "body": body,
    }
    return pa.Table.from_pydict(columns, schema=TOPIC_SCHEMA)


@pytest.fixture(scope="package")
def messages() -> pa.Table:
    """100 000 messages of topic ``Orders`` in ``TOPIC_SCHEMA``."""
    return _topic_table(100_000)


@pytest.fixture(scope="package")
def messages_df(spark: SparkSession, messages: pa.Table) -> DataFrame:
    """``messages`` cut into 16 Ray blocks, handed to Spark as 2 partitions."""
    step = messages.num_rows // 16
    blocks = [messages.slice(k, step) for k in range(0, messages.num_rows, step)]
    return dataset_to_spark(spark, ray.data.from_arrow(blocks), num_partitions=2)
