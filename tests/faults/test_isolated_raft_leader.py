"""A DLedger (Raft) group's leader cut off from both its followers, while the client and
the NameServer still reach it: the followers elect a new leader that takes the writes,
the old leader acknowledges nothing it cannot commit, and every acknowledged message is
read back exactly once after the heal.

Nodes: ``a`` (Ray head: the GCS and the NameServer), ``b``, ``c``, ``d`` (one member of
the group ``broker-a`` each) and ``client`` (the producer and the checker), each in its
own network namespace. The leader is the member whose host the acknowledged sends carry
(a member's host is in every offset message id it writes). Schedule: sends for a while,
the leader's node partitioned from the other two members' nodes (it keeps ``a`` and the
client: the harder case, as a stale route still reaches it) for ``CUT_S``, healed, a
quiet period of ``QUIET_S`` with sends going on, then every queue read back from offset 0.
"""

from __future__ import annotations

import time
from typing import Any

from checker import ACK, Verdict
from workload import SHARED_NODES, assert_exactly_once, brokers_on, finish, start_workload

LAB_GROUP = "shared"  # one lab for the tests on SHARED_NODES (conftest.py)

RAFT = {
    "enable_dledger": True,
    "dledger_tick_ms": 50,
    "dledger_heartbeat_ms": 150,
    "dledger_election_timeout_ms": 600,
    "slave_sync_interval_s": 0.3,
    "heartbeat_interval_s": 1.0,
}
"""``tests/actors/raymq_ha_testkit.RAFT``'s timings (every broker of a name is a member)."""
MARGIN_S = 0.5
"""An acknowledgement by the old leader of a send made later than cut + this, before the
heal, is a commit without a majority (the margin covers a send already replicated, its
acknowledgement on its way back, when the cut fell)."""
CUT_S = 10.0
QUIET_S = 5.0
TOPIC = "FaultRaftLeader"
BROKER = "broker-a"
MEMBERS = ("b", "c", "d")


def test_isolated_raft_leader_commits_nothing_and_a_new_leader_takes_over(
    lab_factory: Any,
) -> None:
    began = time.monotonic()
    lab = lab_factory(SHARED_NODES, cpus={"client": 0})
    client = start_workload(lab, TOPIC, brokers_on(lab, BROKER, MEMBERS), RAFT)
    ready = client.wait_for("ready", timeout_s=120)
    for i, n in enumerate(MEMBERS):
        pid = ready["brokers"][f"{BROKER}-{i}"]["pid"]
        assert pid in lab.nodes[n].actor_pids("Broker"), f"{BROKER}-{i} is not on {n}"
    progress = client.wait_for("progress", timeout_s=60, until=lambda e: e["acked"] >= 200)
    node_of = {lab.nodes[n].ip: n for n in MEMBERS}
    hosts = progress["hosts"]
    assert len(hosts) == 1 and hosts[0].rpartition(":")[0] in node_of, hosts
    old_host = hosts[0]
    old = node_of[old_host.rpartition(":")[0]]
    followers = [n for n in MEMBERS if n != old]

    lab.partition([old], followers)  # the old leader keeps a and the client
    cut = time.monotonic()
    time.sleep(CUT_S)  # the fault schedule
    lab.heal()
    healed = time.monotonic()
    at_heal = client.last["progress"]["acked"]
    client.wait_for("progress", timeout_s=30, until=lambda e: e["acked"] > at_heal)
    time.sleep(QUIET_S)
    raw, verdict = finish(client)
    acks = [o for o in raw if o["outcome"] == ACK]
    during = [o for o in acks if cut <= o["invoked"] < healed]
    by_old = [o for o in during if old_host in o["hosts"]]
    late = [o for o in by_old if o["invoked"] > cut + MARGIN_S]
    new_hosts = sorted({h for o in during for h in o["hosts"]} - {old_host})
    by_new = [o for o in during if set(o["hosts"]) & set(new_hosts)]
    first_new = min((o["completed"] for o in by_new), default=None)
    print()
    print(Verdict.HEADER)
    print(verdict.row(f"raft leader {old}|{''.join(followers)} {CUT_S:.0f}s"))
    print(
        f"cut {healed - cut:.1f}s; old leader {old} ({old_host}) acknowledged "
        f"{len(by_old)} sends made during the cut"
        + (
            f", the last made at cut + {max(o['invoked'] for o in by_old) - cut:.2f} s"
            if by_old
            else ""
        )
        + f"; {len(late)} made after cut + {MARGIN_S:g} s"
    )
    print(
        f"new leader {', '.join(node_of[h.rpartition(':')[0]] for h in new_hosts) or 'none'}: "
        + (
            f"first ack at cut + {first_new - cut:.1f} s, {len(by_new)} sends acked during the cut"
            if first_new is not None
            else "acknowledged nothing during the cut"
        )
        + f"; {verdict.messages} messages sent, {verdict.read} read; "
        f"run {time.monotonic() - began:.0f}s"
    )
    assert not late, (
        f"{len(late)} sends made after cut + {MARGIN_S:g} s acknowledged by the old leader "
        f"without a majority, the last made at cut + {late[-1]['invoked'] - cut:.2f} s"
    )
    assert len(new_hosts) == 1, f"acknowledged during the cut by {new_hosts} besides {old_host}"
    assert by_new, "no new leader acknowledged a send during the cut"
    assert_exactly_once(verdict)
