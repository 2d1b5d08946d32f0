"""A DLedger (Raft) follower's machine loses power under load: its CommitLog keeps only
what its store had confirmed flushed. Started again, the follower rejoins, takes back
what it lost from the leader, and the group loses and doubles nothing acknowledged.

Nodes: ``a`` (Ray head: the GCS and the NameServer), ``b``, ``c``, ``d`` (one member of
``broker-a`` each) and ``client`` (the producer and the checker). Schedule: sends for a
while; every process of one follower's node SIGKILLed; its CommitLog cut back to the
flushed offset its checkpoint records (the worst a power loss leaves: bytes past it were
only in the page cache; the Raft index, ``raft/index``, is left as the kill left it, and
the ConsumeQueues too, so recovery must reconcile them with the shorter CommitLog); sends
for ``DOWN_S`` with the two others; Ray started again on the node and the broker started
from its store; sends until it has caught up, then every queue read back from offset 0
and the three CommitLogs compared byte for byte.

What this guards: the leader once never probed the follower below the match index it had
acknowledged before the crash (``probe_from`` clamped to ``match + 1``), so a follower
that lost entries it had acknowledged was refused forever. Now a refusal at or below
``match`` makes the leader forget it and probe from what the follower holds
(``storage/raft/replication.py``), and members acknowledge only what they fsynced,
whatever the flush mode (``actors/broker/ha/raft_log.py``). The checkpoint this cut
reads is written periodically and lags the CommitLog's real fsync, so the cut takes
acknowledged, fsynced bytes too: the worst a lost disk cache could do, not only a power
loss of unsynced writes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from checker import Verdict
from store_faults import commitlog_bytes, lose_unflushed
from test_isolated_raft_leader import BROKER, MEMBERS, RAFT
from workload import assert_exactly_once, brokers_on, finish, start_workload

DOWN_S = 3.0
CATCH_UP_S = 15.0
TOPIC = "FaultRaftFollower"
HEALTH_CHECKS = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}
"""The GCS gives a crashed node up in ~2 s (default ~15 s) so Ray can start there again."""


def test_follower_losing_unflushed_writes_rejoins_and_nothing_acknowledged_is_lost(
    lab_factory: Any,
) -> None:
    began = time.monotonic()
    lab = lab_factory(["a", *MEMBERS, "client"], cpus={"client": 0}, ray_env=HEALTH_CHECKS)
    brokers = brokers_on(lab, BROKER, MEMBERS)
    stores = {n: Path(b["store_dir"]) for n, b in zip(MEMBERS, brokers)}
    client = start_workload(lab, TOPIC, brokers, RAFT)
    client.wait_for("ready", timeout_s=120)
    progress = client.wait_for("progress", timeout_s=60, until=lambda e: e["acked"] >= 300)
    node_of = {lab.nodes[n].ip: n for n in MEMBERS}
    leader = node_of[progress["hosts"][0].rpartition(":")[0]]
    victim = next(n for n in MEMBERS if n != leader)
    index = MEMBERS.index(victim)

    lab.crash(victim)
    crashed = time.monotonic()
    flushed, end = lose_unflushed(stores[victim])
    at_crash = client.last["progress"]["acked"]
    time.sleep(DOWN_S)
    client.wait_for("progress", timeout_s=30, until=lambda e: e["acked"] > at_crash)
    lab.restart(victim)
    client.send(f'{{"restart": {index}}}')
    restarted = client.wait_for("restarted", timeout_s=90)
    assert restarted["error"] is None, restarted["error"]
    back = time.monotonic()
    name = f"{BROKER}-{index}"
    caught_up = None
    deadline = time.monotonic() + CATCH_UP_S
    while caught_up is None and time.monotonic() < deadline:
        client.send("status")
        st = client.wait_for("status", timeout_s=30)["brokers"]
        lead = next((s for s in st.values() if s.get("raft_role") == "leader"), {})
        if lead and st[name].get("committed_offset", -1) >= lead["committed_offset"] - (1 << 16):
            caught_up = time.monotonic() - back
        else:
            time.sleep(0.3)
    role = st[name].get("raft_role")
    matched = lead.get("match_index", {}).get(name) if lead else None
    _, verdict = finish(client)
    logs = {n: commitlog_bytes(s) for n, s in stores.items()}
    same = {n: logs[n] == logs[leader] for n in MEMBERS}
    print()
    print(Verdict.HEADER)
    print(verdict.row(f"raft follower {victim} power loss"))
    print(
        f"leader {leader}; {victim} crashed with CommitLog end {end}, flushed {flushed} "
        f"({end - flushed} bytes lost); down {back - crashed:.1f}s; rejoined as {role}, "
        + (f"caught up {caught_up:.1f}s later" if caught_up is not None else "never caught up")
        + f"; the leader's match index for it {matched}, its last index "
        f"{st[name].get('last_index')}, commit index {st[name].get('commit_index')}"
        + f"; CommitLogs equal to the leader's: {same}; "
        f"{verdict.messages} messages sent, {verdict.read} read; run {time.monotonic() - began:.0f}s"
    )
    assert caught_up is not None, f"{victim} did not catch up: {st[name]}"
    assert role == "follower", st[name]
    assert all(same.values()), f"CommitLogs differ from the leader's: {same}"
    assert_exactly_once(verdict)
