"""DLedger groups: three Broker actors elect a leader, acknowledge a put once a majority
holds it, keep identical CommitLogs, fail over at once on a death notice, and a deposed
leader cuts off what was never committed."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from raymq_ha_testkit import (
    RAFT,
    Load,
    broker_config,
    commitlog_bytes,
    kill,
    members,
    read_all,
    start_broker,
    status_of,
)
from raymq_testkit import SMALL_STORE, unique_namespace, wait_until

import actors
from actors import BrokerSpec, SendStatus
from actors.console import pages
from storage import Message

GROUP = [BrokerSpec("broker-a", i) for i in range(3)]


def handles(cluster: actors.Cluster) -> dict[str, Any]:
    return {f"broker-a-{i}": cluster.broker("broker-a", i) for i in range(3)}


def leader_of(cluster: actors.Cluster) -> str:
    return wait_until(
        lambda: members(cluster, "broker-a").get(0), timeout_s=30, what="a registered leader"
    )


def in_sync(group: dict[str, Any]) -> bool:
    """Every live member committed everything the leader holds."""
    statuses = [s for s in (status_of(h, 5.0) for h in group.values()) if s]
    ends = {s["commitlog_max_offset"] for s in statuses}
    return len(ends) == 1 and all(
        s["committed_offset"] == s["commitlog_max_offset"] for s in statuses
    )


def console_raft_rows(cluster: actors.Cluster, leader: str) -> bool:
    """The console's cluster page, rendered from this group's real status: one row per
    member, the leader's term, and each follower's match index at the leader's last
    index (every entry replicated)."""
    status = cluster.admin.cluster_status()
    html = pages.cluster_page(status, {})
    lead = next(b for b in status["brokers"] if b["actor_name"] == leader)
    assert f'leader <span class="raft-leader">{leader}</span>' in html
    assert f'term <span class="raft-term">{lead["term"]}</span>' in html
    table = html[html.index("<table id=raft-broker-a>") :]
    body = table[table.index("<tbody>") : table.index("</table>")]
    cells = [
        re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", body)
    ]
    assert sorted(c[0] for c in cells) == [f"broker-a-{i}" for i in range(3)]
    roles = {c[0]: (c[1], c[6]) for c in cells}
    assert roles[leader] == ("leader", str(lead["last_index"]))
    return all(
        role == "follower" and match == str(lead["last_index"])
        for name, (role, match) in roles.items()
        if name != leader
    )


@pytest.fixture(scope="module")
def raft_group(
    ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[actors.Cluster, str]]:
    """One three-member group (and its store root) for the tests that leave it whole or
    with one member killed: a group costs ~7 s to start, a member ~3 s."""
    root = str(tmp_path_factory.mktemp("raft-group"))
    cluster = actors.start_cluster(
        namespace=unique_namespace("raft"),
        nameservers=1,
        brokers=GROUP,
        store_root=root,
        topics=[actors.TopicConfig("R", 4, 4), actors.TopicConfig("F", 2, 2)],
        broker_options={"store": SMALL_STORE, "heartbeat_interval_s": 2.0, **RAFT},
    )
    yield cluster, root
    cluster.shutdown(timeout_s=10.0)


@pytest.fixture
def whole_group(raft_group: tuple[actors.Cluster, str]) -> actors.Cluster:
    """The shared group with its three members up and in sync: a member an earlier test
    killed is started again from its store (and catches up as a follower)."""
    cluster, root = raft_group
    for i in range(3):
        try:
            alive = bool(status_of(cluster.broker("broker-a", i), 5.0))
        except ValueError:  # killed: its name is free again
            alive = False
        if not alive:
            start_broker(broker_config(cluster, root, "broker-a", i, **RAFT))
    wait_until(
        lambda: (
            all(status_of(h, 5.0) for h in handles(cluster).values()) and in_sync(handles(cluster))
        ),
        timeout_s=30,
        what="the shared group whole and in sync",
    )
    leader_of(cluster)
    return cluster


def test_a_group_elects_a_leader_and_every_member_holds_its_bytes(
    whole_group: actors.Cluster,
) -> None:
    cluster = whole_group
    leader = leader_of(cluster)
    group = handles(cluster)
    roles = {n: status_of(h)["raft_role"] for n, h in group.items()}
    assert sorted(roles.values()) == ["follower", "follower", "leader"]
    assert roles[leader] == "leader"
    assert sorted(members(cluster, "broker-a")) == [0] + sorted(
        int(n[-1]) + 1 for n in group if n != leader
    )

    producer = cluster.producer("p-raft", max_batch_messages=64)
    sent = [b"r%05d" % i for i in range(2000)]
    results = producer.send_batch([Message("R", b, keys=b.decode()) for b in sent])
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    wait_until(lambda: in_sync(group), what="followers committed everything")
    stores = [commitlog_bytes(status_of(h)["store_dir"]) for h in group.values()]
    assert stores[0] == stores[1] == stores[2]
    assert sorted(read_all(cluster.pull_consumer("g-raft"), "R")) == sent
    follower = next(h for n, h in group.items() if n != leader)
    found = ray.get(follower.query_by_key.remote("R", "r01234"))
    assert [m.body for m in found] == [b"r01234"]  # its ConsumeQueues and index are its own
    # the web console's cluster page shows the group's term, leader and match indexes
    wait_until(lambda: console_raft_rows(cluster, leader), what="the console's Raft table")
    # followers refuse writes and follow the leader's topics
    cluster.admin.create_topic("R2", 2, 2)
    wait_until(
        lambda: all("R2" in ray.get(h.topic_configs.remote()) for h in group.values()),
        what="topic on every member",
    )


def test_killing_the_leader_moves_writes_to_a_new_leader_at_once(
    whole_group: actors.Cluster,
) -> None:
    cluster = whole_group
    old = leader_of(cluster)
    group = handles(cluster)
    term_before = status_of(group[old])["term"]
    load = Load(cluster.producer("p-fail", send_timeout_s=2.0), "F").start()
    watcher = cluster.producer("p-watch", route_refresh_s=3600.0)  # caches routes for an hour
    assert watcher.ns.require_route("F").broker("broker-a").master_actor_name() == old
    try:
        wait_until(lambda: len(load.acked) > 200, what="load running")
        ray.kill(group[old], no_restart=True)
        killed = time.monotonic()
        new = wait_until(
            lambda: (leader := members(cluster, "broker-a").get(0)) != old and leader,
            timeout_s=10,
            interval_s=0.01,
            what="a new leader",
        )
        # the NameServer pushes the change: the cached route is dropped, not kept for an hour
        wait_until(
            lambda: watcher.ns.require_route("F").broker("broker-a").master_actor_name() == new,
            timeout_s=2,
            what="a client's cached route pointing at the new leader",
        )
        wait_until(lambda: load.acked_since(killed) > 0, timeout_s=10, interval_s=0.01)
        failover = min(t for t in load.ok_times if t > killed) - killed
        wait_until(lambda: load.acked_since(killed) > 20, what="writes flowing")
    finally:
        load.finish()
    assert failover < 2.0, f"first acknowledged write {failover:.2f}s after the kill"
    survivors = {n: h for n, h in group.items() if n != old}
    wait_until(lambda: in_sync(survivors), what="survivors in sync")
    got = read_all(cluster.pull_consumer("g-fail"), "F")
    assert len(got) == len(set(got))  # exactly once in the new leader's log
    assert set(load.acked) <= set(got), "an acknowledged message was lost"
    assert status_of(survivors[new])["term"] > term_before


def test_a_deposed_leader_cuts_off_what_was_never_committed(
    make_cluster: Any, tmp_path: Path
) -> None:
    root = str(tmp_path / "root")
    cluster = make_cluster(
        nameservers=1,
        brokers=GROUP,
        topics=[actors.TopicConfig("T", 1, 1)],
        store_root=root,
        broker_options={**RAFT, "sync_replication_timeout_s": 0.5},
    )
    old = leader_of(cluster)
    group = handles(cluster)
    producer = cluster.producer("p-cut", retry_times_when_send_failed=0)
    first = producer.send_batch([Message("T", b"kept-%d" % i) for i in range(50)])
    assert {r.status for r in first} == {SendStatus.SEND_OK}
    wait_until(lambda: in_sync(group), what="in sync")
    followers = [n for n in group if n != old]
    for name in followers:
        kill(group[name])
    # alone, the leader stores but cannot commit: nothing is acknowledged
    lost = producer.send_batch([Message("T", b"lost-%d" % i) for i in range(30)])
    assert {r.status for r in lost} == {SendStatus.FLUSH_SLAVE_TIMEOUT}
    end_before = status_of(group[old])["commitlog_max_offset"]
    kill(group[old])

    config = {n: broker_config(cluster, root, "broker-a", int(n[-1]), **RAFT) for n in group}
    for name in followers:
        group[name] = start_broker(config[name])
    new = wait_until(
        lambda: (leader := members(cluster, "broker-a").get(0)) in followers and leader,
        timeout_s=30,
        what="a leader among the two survivors",
    )
    after = producer.send_batch([Message("T", b"new-%d" % i) for i in range(40)])
    assert {r.status for r in after} == {SendStatus.SEND_OK}

    group[old] = start_broker(config[old])
    wait_until(lambda: in_sync(group), what="the old leader caught up as a follower")
    status = status_of(group[old])
    assert status["raft_role"] == "follower" and status["leader"] == new
    assert commitlog_bytes(status["store_dir"]) == commitlog_bytes(
        status_of(group[new])["store_dir"]
    )
    assert status["commitlog_max_offset"] != end_before
    bodies = read_all(cluster.pull_consumer("g-cut"), "T")
    assert sorted(bodies) == sorted(
        [b"kept-%d" % i for i in range(50)] + [b"new-%d" % i for i in range(40)]
    )
