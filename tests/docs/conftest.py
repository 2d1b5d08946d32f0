"""The docs' examples run against a real local cluster: on the run's one Ray cluster
(``ray_cluster`` of tests/conftest.py), one NameServer with one broker
(small store files) in a namespace of their own, shared by the pages whose examples use
a ``cluster`` they do not start."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ray.cluster_utils import Cluster as RayTestCluster
from raymq_testkit import SMALL_STORE, unique_namespace

import actors


@pytest.fixture(scope="package")
def docs_cluster(
    ray_cluster: RayTestCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[actors.Cluster]:
    cluster = actors.start_cluster(
        namespace=unique_namespace("docs"),
        nameservers=1,
        brokers=1,
        store_root=str(tmp_path_factory.mktemp("docs-cluster")),
        broker_options={"store": SMALL_STORE, "heartbeat_interval_s": 2.0},
    )
    yield cluster
    cluster.shutdown(timeout_s=10.0)
