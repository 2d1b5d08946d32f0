"""A SYNC_MASTER's raylet is paused under load: the master
fences itself within its cluster lease, Ray declares its node dead, the keeper promotes
a slave, the producer sends to it at once, the old master's process leaves with its
raylet, and Ray started again on its node brings it back from its store as a slave of
the new master, caught up; nothing acknowledged is lost or stored twice.

Nodes: ``a`` (Ray head: the GCS, the NameServer, the keeper), ``b`` (broker-a's
SYNC_MASTER, pinned by the resource ``node-b``), ``c`` and ``d`` (its two slaves: the
promoted one keeps one slave to acknowledge its SYNC_MASTER writes) and ``client`` (an
idempotent producer and the checker). Schedule: sends for a while; b's raylet alone
SIGSTOPped (its broker runs on, reaching the GCS, the NameServer and the client, as in a
partition of the raylet from the head); Ray's verdict on b (short health checks on the
head, still later than the lease); the keeper's promotion (``auto_promote``); the raylet
SIGCONTed: it exits, and the broker with it (its lease sees its raylet gone); Ray started
again on b: the keeper starts broker-a-0 there from its store; it comes back as a slave
and catches up; every queue read back from offset 0.

The lease is the default (10 s, renewed every 2 s); the GCS gives a node up after
``HEALTH_CHECKS`` (~15 s of silence, Ray's default is about a minute).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import time
from typing import Any

from checker import ACK, Verdict
from workload import assert_exactly_once, brokers_on, finish, start_workload

log = logging.getLogger("raymq.tests.faults.paused_raylet")

BROKER = "broker-a"
MEMBERS = ("b", "c", "d")  # broker-a-0 (the master), -1, -2
TOPIC = "FaultPausedRaylet"
LEASE_S = 10.0  # BrokerConfig.cluster_lease_s, the default
MARGIN_S = 2.0
"""A send made later than the pause + ``LEASE_S`` + this and acknowledged by the old
master is one it should have refused (a renewal interval and a round trip)."""
FIRST_SEND_S = 2.0
"""The producer's first acknowledged send to the promoted master comes this soon."""
HEALTH_CHECKS = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "7",
}
"""The GCS gives a silent raylet up after ~15 s (7 failed checks, each a 1 s timeout and
a 1 s period): later than the lease, as Ray's default (~60 s) is, but
short enough for CI."""
CATCH_UP_S = 20.0


def raylet_pid(node: Any) -> int:
    pids = [p for p, cmd in node.pids().items() if cmd.split(" ")[0].endswith("/raylet")]
    assert len(pids) == 1, f"raylets on {node.name}: {node.pids()}"
    return pids[0]


def wait_exit(pid: int, timeout_s: float) -> float | None:
    """When the process ``pid`` (not our child) exits (monotonic s), or None if it does not
    within ``timeout_s``: awaited on a pidfd, no polling."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return time.monotonic()
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return time.monotonic() if poller.poll(timeout_s * 1000) else None
    finally:
        os.close(fd)


def host_of(node: Any) -> str:
    return f"{node.ip}:"


def test_paused_raylet_fences_promotes_and_brings_the_master_back(lab_factory: Any) -> None:
    began = time.monotonic()
    lab = lab_factory(["a", *MEMBERS, "client"], cpus={"client": 0}, ray_env=HEALTH_CHECKS)
    b = lab.nodes["b"]
    client = start_workload(
        lab,
        TOPIC,
        brokers_on(lab, BROKER, MEMBERS),
        {
            "broker_role": "SYNC_MASTER",
            "sync_replication_timeout_s": 2.0,
            "slave_sync_interval_s": 0.3,
            "ha_slave_timeout_s": 2.0,
            "heartbeat_interval_s": 2.0,
        },
        auto_promote=True,
        watch=0.2,
    )
    ready = client.wait_for("ready", timeout_s=120)
    master_pid = ready["brokers"][f"{BROKER}-0"]["pid"]
    assert master_pid in b.actor_pids("Broker"), "the master is not on b"
    client.wait_for("progress", timeout_s=60, until=lambda e: e["acked"] >= 300)
    built = time.monotonic()

    raylet = raylet_pid(b)
    lab.pause("b", [raylet])
    paused = time.monotonic()
    log.info("paused b's raylet (pid %d)", raylet)
    verdict_ev = client.wait_for("watch", timeout_s=60, until=lambda e: b.ip in e["dead"])
    promoted_ev = client.wait_for("watch", timeout_s=30, until=lambda e: e["promotions"])
    promotion = promoted_ev["promotions"][0]
    new_master = promotion["broker"]
    new_node = lab.nodes[MEMBERS[int(new_master.rpartition("-")[2])]]
    at_promotion = client.last["progress"]["acked"]
    client.wait_for("progress", timeout_s=30, until=lambda e: e["acked"] > at_promotion)

    lab.resume("b", [raylet])
    resumed = time.monotonic()
    raylet_gone = wait_exit(raylet, 30.0)
    broker_gone = wait_exit(master_pid, 30.0)
    assert raylet_gone is not None, f"b's raylet {raylet} still runs 30 s after SIGCONT"
    assert broker_gone is not None, (
        f"the old master (pid {master_pid}) still runs 30 s after its raylet resumed: {b.pids()}"
    )
    for proc in b.procs:  # `ray start --block` leaves with its raylet
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
    b.procs.clear()
    lab.restart("b")
    ray_back = time.monotonic()
    client.wait_for("watch", timeout_s=30, until=lambda e: e["restarts"].get(f"{BROKER}-0", 0) >= 1)
    name = f"{BROKER}-0"
    caught_up = None
    master_end = reached = None
    st: dict[str, Any] = {}
    deadline = time.monotonic() + CATCH_UP_S
    while caught_up is None and time.monotonic() < deadline:
        client.send("status")
        st = client.wait_for("status", timeout_s=30)["brokers"]
        mine = st[name]
        if (
            master_end is not None
            and mine.get("role") == "SLAVE"
            and mine.get("commitlog_max_offset", -1) >= master_end
        ):
            caught_up, reached = time.monotonic(), master_end
        master_end = st[new_master].get("commitlog_max_offset")
    back_status = st.get(name, {})
    raw, verdict = finish(client)
    acks = [o for o in raw if o["outcome"] == ACK]
    by_old = [o for o in acks if any(h.startswith(host_of(b)) for h in o["hosts"])]
    by_new = [o for o in acks if any(h.startswith(host_of(new_node)) for h in o["hosts"])]
    last_old = max((o for o in by_old if o["invoked"] >= paused), key=lambda o: o["completed"],
                   default=None)  # fmt: skip
    late = [o for o in by_old if o["invoked"] > paused + LEASE_S + MARGIN_S]
    promoted = promoted_ev["since"]  # the promotion was seen between since and t
    first_new = min((o["completed"] for o in by_new if o["completed"] >= promoted), default=None)
    print()
    print(Verdict.HEADER)
    print(verdict.row("paused raylet of b"))
    print(
        "raylet of b paused at 0 s; the old master's last ack at "
        + (
            f"{last_old['completed'] - paused:.1f} s (sent at {last_old['invoked'] - paused:.1f})"
            if last_old
            else "- (none after the pause)"
        )
        + f"; {len(late)} acks of sends after {LEASE_S + MARGIN_S:g} s; Ray's verdict "
        f"{verdict_ev['since'] - paused:.1f}-{verdict_ev['t'] - paused:.1f} s; "
        f"{new_master} promoted {promoted - paused:.1f}-{promoted_ev['t'] - paused:.1f} s "
        f"({promotion}); first ack from it "
        + (f"{first_new - promoted:.2f} s after" if first_new is not None else "never")
    )
    print(
        f"raylet resumed at {resumed - paused:.1f} s: it exited {raylet_gone - resumed:.1f} s "
        f"later, the old master {broker_gone - resumed:.1f} s later; Ray on b again at "
        f"{ray_back - paused:.1f} s; {name} back as {back_status.get('role')} "
        + (f"caught up at {caught_up - paused:.1f} s" if caught_up else "never caught up")
        + f" (its commitlog at {back_status.get('commitlog_max_offset')}, past the "
        f"master's {reached} a look before); lab and warm-up {built - began:.0f} s; {verdict.messages} messages "
        f"sent, {verdict.read} read; run {time.monotonic() - began:.0f}s"
    )
    assert not late, (
        f"{len(late)} sends made after pause + {LEASE_S + MARGIN_S:g} s acknowledged by the "
        f"old master, the last sent at {late[-1]['invoked'] - paused:.1f} s"
    )
    assert verdict_ev["since"] - paused > LEASE_S, "Ray's verdict came before the lease lapsed"
    assert first_new is not None, f"nothing acknowledged by the promoted {new_master}"
    assert first_new - promoted <= FIRST_SEND_S, (
        f"the first send acknowledged by {new_master} came {first_new - promoted:.1f} s "
        "after its promotion"
    )
    assert caught_up is not None, f"{name} did not come back caught up: {back_status}"
    assert_exactly_once(verdict)
