"""The lab itself: partitions cut exactly the pairs named, signals reach only the node's
own processes, and nothing the lab made outlives it (nor a crashed run's leftovers)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from harness import (
    BRIDGE,
    PREFIX,
    FaultLab,
    LabError,
    _namespaces,
    can_admin_network,
    missing_tools,
)

PORT = 7000
SERVER = (
    "import socket\n"
    f"s = socket.create_server(('0.0.0.0', {PORT}))\n"
    "while True:\n"
    "    s.accept()[0].close()\n"
)


def reaches(lab: FaultLab, src: str, dst: str) -> bool:
    """A TCP connection from node ``src`` to the listener on node ``dst`` (0.3 s to answer: a bridge answers in well under 1 ms)."""
    probe = f"import socket; socket.create_connection(({lab.nodes[dst].ip!r}, {PORT}), timeout=0.3)"
    done = subprocess.run(
        ["ip", "netns", "exec", lab.nodes[src].netns, sys.executable, "-c", probe],
        capture_output=True,
    )
    return done.returncode == 0


def state(pid: int) -> str:
    """The process's state letter (``T``: stopped), or ``gone``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


def wait_until(predicate: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def test_partition_cuts_the_named_sides_both_ways_and_heal_restores_them(
    lab_factory: Any,
) -> None:
    lab = lab_factory(["a", "b", "c"], ray=False)
    for node in lab.nodes.values():
        lab.popen(node, [sys.executable, "-c", SERVER])
    pairs = [(s, d) for s in "abc" for d in "abc" if s != d]
    wait_until(lambda: all(reaches(lab, s, d) for s, d in pairs), "every listener up")

    lab.partition(["b"], ["c"])
    assert not reaches(lab, "b", "c") and not reaches(lab, "c", "b")
    assert all(reaches(lab, s, d) for s, d in pairs if {s, d} != {"b", "c"})

    lab.partition(["a"], ["b", "c"])  # on top of the first cut
    assert not any(reaches(lab, s, d) for s, d in pairs)

    lab.heal()
    assert "drop" not in lab.rules("b")
    assert all(reaches(lab, s, d) for s, d in pairs)

    lab.drop_one_way("a", "b")  # a's SYNs to b dropped; b's to a still arrive
    assert not reaches(lab, "a", "b")
    assert reaches(lab, "c", "b") and reaches(lab, "b", "c")
    lab.degrade("c", delay_ms=400, loss_pct=100)  # every packet c sends is dropped
    assert not reaches(lab, "a", "c")
    lab.heal()
    shown = lab.ns_exec(lab.nodes["c"], "tc", "qdisc", "show", "dev", "eth0")
    assert "netem" not in shown and "tbf" not in shown
    assert all(reaches(lab, s, d) for s, d in pairs)


def test_pause_resume_and_kill_reach_only_the_nodes_processes(lab_factory: Any) -> None:
    lab = lab_factory(["a", "b"], ray=False)
    pid = lab.popen(lab.nodes["b"], ["sleep", "600"]).pid
    wait_until(lambda: pid in lab.nodes["b"].pids(), "sleep in b's namespace")

    lab.pause("b", [pid])
    wait_until(lambda: state(pid) == "T", "the process stopped")
    lab.resume("b", [pid])
    wait_until(lambda: state(pid) in ("S", "R"), "the process running again")
    with pytest.raises(LabError, match="not in node a's namespace"):
        lab.kill("a", [pid])
    lab.kill("b", [pid])
    wait_until(lambda: pid not in lab.nodes["b"].pids(), "the process killed")


def test_the_lab_removes_what_it_made_and_what_a_crashed_run_left(lab_factory: Any) -> None:
    subprocess.run(["ip", "netns", "add", f"{PREFIX}-stale"], check=True)
    stale = subprocess.Popen(["ip", "netns", "exec", f"{PREFIX}-stale", "sleep", "600"])
    try:
        lab = lab_factory(["a", "b"], ray=False)
        assert sorted(_namespaces()) == [f"{PREFIX}-a", f"{PREFIX}-b"]
        assert stale.wait(timeout=10) == -9  # killed by the lab's sweep
        straggler = lab.popen(lab.nodes["a"], ["sleep", "600"])
        root = lab.root

        lab.close()
        assert not [n for n in _namespaces() if n.startswith(f"{PREFIX}-")]
        assert not Path(f"/sys/class/net/{BRIDGE}").exists()
        assert not root.exists()
        assert straggler.wait(timeout=10) != 0
    finally:
        if stale.poll() is None:
            stale.kill()
        subprocess.run(["ip", "netns", "del", f"{PREFIX}-stale"], capture_output=True)


def test_a_lab_stopped_while_it_waits_for_the_lock_leaves_the_other_labs_alone(
    tmp_path: Path,
) -> None:
    """A lab waiting for another lab's lock that is interrupted (Ctrl-C, the runner's
    SIGTERM) has made nothing, so it takes nothing down: the namespaces are the
    running lab's."""
    if not can_admin_network():
        pytest.skip("needs root with CAP_NET_ADMIN to make network namespaces")
    if missing := missing_tools():
        pytest.fail(f"missing {missing}: .ci/run installs iproute2 and nftables")
    lock = tmp_path / "lock"
    other = f"{PREFIX}-otherlab"
    waiter = (
        "import harness\n"
        f"harness.LOCK = harness.Path({str(lock)!r})\n"
        "with harness.FaultLab(['w'], ray=False):\n"
        "    pass\n"
    )
    held = lock.open("w")
    fcntl.flock(held, fcntl.LOCK_EX)  # the running lab's
    subprocess.run(["ip", "netns", "add", other], check=True)
    try:
        here = Path(__file__).parent
        proc = subprocess.Popen(
            [sys.executable, "-c", waiter], cwd=here, env={**os.environ, "PYTHONPATH": str(here)}
        )
        waits = f"-> FLOCK  ADVISORY  WRITE {proc.pid} "
        wait_until(lambda: waits in Path("/proc/locks").read_text(), "the lab to wait for the lock")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) != 0
        assert other in _namespaces()
    finally:
        held.close()
        subprocess.run(["ip", "netns", "del", other], capture_output=True)
