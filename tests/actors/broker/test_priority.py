"""actors/broker/priority.py: a broker runs at a server's priority, not at the nice 15
Ray gives its workers, on every thread of its process; where it may not lower its
niceness it keeps Ray's and says why."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import ray

from actors import BrokerSpec
from actors.broker.priority import take_priority


def _thread_nices(pid: int) -> list[int]:
    """The niceness of each thread of process ``pid`` (``/proc/<pid>/task/*/stat``)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            out.append(int(f.read().rsplit(")", 1)[1].split()[16]))
    return out


@ray.remote(num_cpus=0)
def _worker_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_broker_takes_nice_0_on_every_thread_and_none_keeps_rays(
    ray_cluster: Any, make_cluster: Any
) -> None:
    # a node whose Ray starts its workers at Ray's default niceness (the suite's run at 0)
    node = ray_cluster.add_node(
        num_cpus=1, resources={"rmq-nice-15": 1}, env_vars={"RAY_worker_niceness": "15"}
    )
    try:
        ray_cluster.wait_for_nodes()
        on_it = _worker_nice.options(resources={"rmq-nice-15": 0.01})
        ray_nice = ray.get(on_it.remote())
        assert ray_nice == 15, "that node's Ray starts its workers at Ray's default niceness"
        there = [BrokerSpec("broker-a", node=node.node_id)]  # pinned: no keeper to move it
        status = ray.get(
            make_cluster(nameservers=1, brokers=there).broker("broker-a").status.remote()
        )
        assert status["process_nice"] == 0 and status["node_id"] == node.node_id
        nices = _thread_nices(status["pid"])
        assert 0 in nices and ray_nice not in nices, nices
        assert set(nices) <= {0, 19}, nices  # a thread Ray set apart, at 19, stays there

        kept = make_cluster(nameservers=1, brokers=there, broker_options={"process_nice": None})
        status = ray.get(kept.broker("broker-a").status.remote())
        assert status["process_nice"] == ray_nice
        assert ray_nice in _thread_nices(status["pid"])  # its Python threads (some of Ray's at 0)
    finally:
        ray_cluster.remove_node(node)


_REFUSED = """
import logging, os, sys
sys.path[:0] = {paths!r}
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
from actors.broker.priority import take_priority
os.nice(15 - os.nice(0))
if os.getuid() == 0:  # root may lower it: the process goes on as nobody
    os.setgid(65534)
    os.setuid(65534)
print("nice", take_priority(0, "broker x"), os.getpriority(os.PRIO_PROCESS, 0))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="niceness and setuid")
def test_a_process_that_may_not_lower_its_niceness_keeps_it_and_says_why() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _REFUSED.format(paths=sys.path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "nice 15 15" in done.stdout, done.stdout + done.stderr
    assert "broker x runs at nice 15" in done.stdout and "CAP_SYS_NICE" in done.stdout


def test_none_the_same_or_a_higher_niceness_changes_nothing() -> None:
    now = os.getpriority(os.PRIO_PROCESS, 0)
    assert take_priority(None, "test") == now
    assert take_priority(now, "test") == now
    assert take_priority(min(now + 5, 19), "test") == now  # it only ever lowers
    assert os.getpriority(os.PRIO_PROCESS, 0) == now
