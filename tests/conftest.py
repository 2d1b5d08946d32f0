"""Fixtures every part of the suite may use."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster as RayTestCluster

from actors.config.cluster import LOCAL_RAY_WORKER_NICENESS


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayTestCluster]:
    """One Ray cluster for every test of the run that needs one (tests/actors and the
    docs' examples): a ``ray.cluster_utils.Cluster`` head this process starts itself
    (never a cluster someone else runs on the machine), so multi-node tests can add and
    remove nodes. Started at the first test that asks for it, shut down at the end."""
    if ray.is_initialized():
        ray.shutdown()
    # Ray's per-node agent polls every worker process's stats (psutil) every 5 s for a
    # dashboard no test opens: on two cores, with a process per actor, it took a tenth of
    # the run's CPU. Set before the head starts, its agents inherit it.
    os.environ.setdefault("REPORTER_UPDATE_INTERVAL_MS", "60000")
    # Its workers at nice 0, as a Ray that RayMQ starts runs them (cluster.yaml too), on
    # every node the tests add (their raylets inherit it; a node may set its own). At
    # Ray's 15 an actor's process started at the back of the queue behind the other
    # pytest lanes of a CI run (at 0): ~2 s of CPU to import and start a broker before it
    # takes nice 0 itself. Beside three busy processes a restarted broker answered after
    # 45 s (a CI run's failure); at 0 its whole test took 15 s.
    os.environ.setdefault("RAY_worker_niceness", str(LOCAL_RAY_WORKER_NICENESS))
    cluster = RayTestCluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 4,
            "include_dashboard": False,
            # it copies workers' logs to drivers, and the run's driver takes none
            # (log_to_driver=False below): a process tailing every worker's log for no one
            "include_log_monitor": False,
            # a node whose raylet died is declared dead after 5 failed checks 1 s apart
            # (~5 s) instead of 3 s apart (~15 s): tests that kill a node wait for that
            "_system_config": {"health_check_period_ms": 1000},
        },
    )
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """``tmpfs(mib)``: a fresh tmpfs of that size, unmounted after the test: a small disk
    that really fills. Skipped only where this machine forbids mounting one (not root,
    no CAP_SYS_ADMIN)."""
    mounted: list[Path] = []

    def mount(mib: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(where)],
            capture_output=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


FIRST = ("faults", "cluster")
"""Folders run before the rest, in this order: their tests start Ray nodes of their own
(network namespaces, ``ray up``, a quickstart's local Ray) and time what those do, so
they run on a machine where the session's Ray cluster (``ray_cluster``, started at the
first test that asks for it) and the clusters of other folders are not yet up."""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        path = Path(item.path)
        top = path.relative_to(here).parts[0] if here in path.parents else ""
        return FIRST.index(top) if top in FIRST else len(FIRST)

    items.sort(key=rank)  # stable: each folder's own order (tests/faults/conftest.py) kept
