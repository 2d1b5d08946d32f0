"""A DLedger group with each member on its own node loses its leader's node under load: a
new leader takes writes within 2 s, every acknowledged message is in its log exactly once,
and the old leader, started again on another node from its store, rejoins as a follower
holding exactly the group's committed log."""

from __future__ import annotations

import time
from typing import Any

from raymq_ha_testkit import (
    Load,
    broker_config,
    commitlog_bytes,
    members,
    read_member,
    start_broker,
    status_of,
)
from raymq_testkit import wait_until
from test_raft_dledger import RAFT, in_sync

import actors
from actors import BrokerSpec


def test_losing_the_leaders_node_fails_over_in_under_two_seconds(
    ray_cluster: Any, make_cluster: Any, tmp_path: Any
) -> None:
    nodes = [ray_cluster.add_node(num_cpus=1, resources={f"raft-node-{i}": 1}) for i in range(3)]
    root = str(tmp_path / "root")
    try:
        ray_cluster.wait_for_nodes()
        cluster = make_cluster(
            nameservers=2,
            store_root=root,
            topics=[actors.TopicConfig("RF", 2, 2)],
            brokers=[BrokerSpec("broker-a", i, node=f"raft-node-{i}") for i in range(3)],
            broker_options=RAFT,
        )
        group = {f"broker-a-{i}": cluster.broker("broker-a", i) for i in range(3)}
        old = wait_until(lambda: members(cluster, "broker-a").get(0), what="a leader")
        old_node = nodes[int(old[-1])]
        assert status_of(group[old])["node_id"] == old_node.node_id
        load = Load(cluster.producer("p-rf", send_timeout_s=2.0), "RF").start()
        try:
            wait_until(lambda: len(load.acked) > 300, what="load running")
            ray_cluster.remove_node(old_node)
            removed = time.monotonic()
            wait_until(lambda: load.acked_since(removed) > 0, timeout_s=10, interval_s=0.01)
            failover = min(t for t in load.ok_times if t > removed) - removed
            wait_until(lambda: load.acked_since(removed) > 20, what="writes flowing again")
        finally:
            load.finish()
        assert failover < 2.0, f"first acknowledged write {failover:.2f}s after the node left"
        new = members(cluster, "broker-a")[0]
        assert new != old
        survivors = {n: h for n, h in group.items() if n != old}
        wait_until(lambda: in_sync(survivors), what="survivors in sync")
        log = read_member(survivors[new], "RF", (0, 1))
        assert len(log) == len(set(log)), "a message is in the new leader's log twice"
        assert set(load.acked) <= set(log), "an acknowledged message was lost"

        # the old leader comes back on the head node from its own store
        config = broker_config(cluster, root, "broker-a", int(old[-1]), **RAFT)
        group[old] = start_broker(config)
        wait_until(lambda: in_sync(group), what="the old leader caught up")
        status = status_of(group[old])
        assert status["raft_role"] == "follower" and status["leader"] == new
        assert commitlog_bytes(status["store_dir"]) == commitlog_bytes(
            status_of(group[new])["store_dir"]
        )
    finally:
        for node in nodes:
            if node in ray_cluster.worker_nodes:
                ray_cluster.remove_node(node)
