"""A SYNC_MASTER group across nodes of a multi-node Ray cluster loses its master's node
under continuous sends: nothing acknowledged is lost, consumers go on from a slave, and
once a slave is promoted, sends resume."""

from __future__ import annotations

import time
from typing import Any

import ray
from raymq_ha_testkit import Load, members, read_all, read_member, status_of
from raymq_testkit import wait_until

import actors
from actors import BrokerSpec, PullStatus, SendStatus


def test_losing_the_masters_node_loses_no_acknowledged_message(
    ray_cluster: Any, make_cluster: Any
) -> None:
    node_m = ray_cluster.add_node(num_cpus=1, resources={"ha-master-node": 1})
    node_s = ray_cluster.add_node(num_cpus=1, resources={"ha-slave-node": 1})
    try:
        ray_cluster.wait_for_nodes()
        cluster = make_cluster(
            nameservers=2,
            topics=[actors.TopicConfig("HAM", 2, 2)],
            brokers=[
                BrokerSpec("broker-a", 0, node="ha-master-node"),
                BrokerSpec("broker-a", 1),  # on the head node
                BrokerSpec("broker-a", 2, node="ha-slave-node"),
            ],
            broker_options={
                "broker_role": "SYNC_MASTER",
                "slave_sync_interval_s": 0.3,
                "ha_slave_timeout_s": 2.0,
            },
        )
        assert status_of(cluster.broker("broker-a", 0))["node_id"] == node_m.node_id
        load = Load(cluster.producer("p-ham", send_timeout_s=3.0), "HAM").start()
        consumer = cluster.pull_consumer("g-ham")
        queues = consumer.fetch_subscribe_queues("HAM")
        try:
            wait_until(lambda: len(load.acked) > 300, what="load running")
            ray_cluster.remove_node(node_m)
            removed = time.monotonic()
            wait_until(
                lambda: 0 not in members(cluster, "broker-a"),
                timeout_s=10,
                what="the master out of the routes",
            )
            acked_before = list(load.acked)
            # every acknowledged message is on some slave (SYNC_MASTER waits for one)
            on_slaves = set()
            for bid in (1, 2):
                on_slaves |= set(read_member(cluster.broker("broker-a", bid), "HAM", (0, 1)))
            assert set(acked_before) <= on_slaves, "an acknowledged message is missing"
            # consumers go on from a slave, and commit there
            got = read_all(consumer, "HAM", queues)
            assert got and set(got) <= on_slaves
            # a queue may hold nothing yet (a batch goes to one queue, and one sent to
            # the other when the node went may be retried there later): commit where
            # the serving member has a record
            held = [q for q in queues if consumer.max_offset(q) >= 1]
            assert held, "the slave serving reads holds no record"
            consumer.commit_offsets({q: 1 for q in held})
            assert load.acked_since(removed + 1.0) == 0  # read-only without a master

            promoted = cluster.admin.promote("broker-a")  # the slave holding the most
            assert promoted["role"] == "SYNC_MASTER"
            wait_until(
                lambda: load.acked_since(time.monotonic() - 0.5) > 0,
                timeout_s=20,
                what="acknowledged sends on the promoted master",
            )
        finally:
            load.finish()
        new_master = members(cluster, "broker-a")[0]
        assert new_master in ("broker-a-1", "broker-a-2")
        final = read_all(cluster.pull_consumer("g-ham-2"), "HAM")
        assert set(load.acked) <= set(final), "an acknowledged message was lost"
        assert len(final) == len(set(final))
        probe = consumer.pull(held[0], 0, 1)
        assert probe.status is PullStatus.FOUND
        # the commits a slave took reach the new master
        wait_until(lambda: all(consumer.fetch_offset(q) >= 1 for q in held), timeout_s=10)
        statuses = {s for s in load.other if s in {e.value for e in SendStatus}}
        assert statuses <= {"FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"}
    finally:
        for node in (node_m, node_s):
            if node in ray_cluster.worker_nodes:
                ray_cluster.remove_node(node)
        ray.get([])  # nothing pending
