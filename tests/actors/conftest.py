"""Clusters for the actors tests, on the run's one Ray cluster (``ray_cluster`` of
tests/conftest.py). Every test gets its own namespace."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ray.cluster_utils import Cluster as RayTestCluster
from raymq_testkit import DEFAULT_SIZES, SMALL_STORE, unique_namespace

import actors

ClusterFactory = Callable[..., actors.Cluster]


@pytest.fixture(scope="module")
def one_broker(
    ray_cluster: RayTestCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[actors.Cluster]:
    """One NameServer and one broker (small store files) shared by the tests of a module
    that leave it as they found it: each with its own topics, groups and producers,
    comparing the broker's counters before and after. A cluster costs ~4 s to start."""
    cluster = actors.start_cluster(
        namespace=unique_namespace("one"),
        nameservers=1,
        brokers=1,
        store_root=str(tmp_path_factory.mktemp("one-broker")),
        broker_options={"store": SMALL_STORE, "heartbeat_interval_s": 2.0},
    )
    yield cluster
    cluster.shutdown(timeout_s=10.0)


@pytest.fixture
def make_cluster(
    ray_cluster: RayTestCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[ClusterFactory]:
    """``make_cluster(**start_cluster kwargs)``: a cluster in a fresh namespace on
    ``tmp_path`` with small store files; shut down after the test.

    Parametrized indirectly with ``"default"`` (``DEFAULT_SIZES_PARAMS``), its brokers
    have the default file sizes instead, and their stores (~1.4 GB each) are deleted
    once the cluster is shut down."""
    sizes = getattr(request, "param", "small")
    if sizes not in ("small", "default"):
        raise ValueError(f"make_cluster param {sizes!r}: must be 'small' or 'default'")
    store = SMALL_STORE if sizes == "small" else {**SMALL_STORE, **DEFAULT_SIZES}
    started: list[tuple[actors.Cluster, str]] = []

    def factory(**kwargs: Any) -> actors.Cluster:
        options = dict(kwargs.pop("broker_options", {}) or {})
        options["store"] = {**store, **options.get("store", {})}
        options.setdefault("heartbeat_interval_s", 2.0)
        kwargs.setdefault("namespace", unique_namespace())
        kwargs.setdefault("store_root", str(tmp_path / kwargs["namespace"]))
        cluster = actors.start_cluster(broker_options=options, **kwargs)
        started.append((cluster, kwargs["store_root"]))
        return cluster

    yield factory
    for cluster, _ in started:
        cluster.shutdown(timeout_s=10.0)
    if sizes == "default":
        for _, root in started:
            shutil.rmtree(root, ignore_errors=True)
