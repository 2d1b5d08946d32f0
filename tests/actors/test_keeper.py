"""The keeper (``actors/keeper/keeper.py``) on a multi-node Ray cluster: a broker whose
node died starts again, from its store, on a node that joins with its resource; with
``auto_promote`` a master/slave group whose master's node died gets a new master by
itself, and the old master, back, is its slave."""

from __future__ import annotations

import time
from typing import Any

import ray
from raymq_ha_testkit import Load, members, read_member, status_of
from raymq_testkit import drain, wait_until

import actors
from actors import BrokerSpec
from actors.keeper import KEEPER_ACTOR_NAME
from storage import Message


def keeper_status(cluster: actors.Cluster) -> dict[str, Any]:
    keeper = ray.get_actor(KEEPER_ACTOR_NAME, namespace=cluster.namespace)
    status: dict[str, Any] = ray.get(keeper.status.remote(), timeout=10)
    return status


def _alive(cluster: actors.Cluster, name: str, bid: int = 0) -> dict[str, Any]:
    try:
        return status_of(cluster.broker(name, bid), 2.0)
    except ValueError:  # not registered (yet)
        return {}


def test_a_broker_whose_node_died_comes_back_on_a_node_with_its_resource(
    ray_cluster: Any, make_cluster: Any
) -> None:
    node = ray_cluster.add_node(num_cpus=1, resources={"rmq-keep-b": 1})
    back = None
    try:
        ray_cluster.wait_for_nodes()
        cluster = make_cluster(
            nameservers=1,
            brokers=[BrokerSpec("broker-a"), BrokerSpec("broker-b", node="rmq-keep-b")],
        )
        cluster.admin.create_topic("Kept", 2, 2, brokers=["broker-b"])
        producer = cluster.producer("p-kept")
        producer.send_batch([Message("Kept", b"before-%d" % i) for i in range(50)])
        assert _alive(cluster, "broker-b")["node_id"] == node.node_id

        ray_cluster.remove_node(node, allow_graceful=False)
        waiting = wait_until(
            lambda: keeper_status(cluster)["brokers"]["broker-b-0"]["waiting"],
            what="the keeper waiting for a node with the resource",
        )
        assert "rmq-keep-b" in waiting
        assert _alive(cluster, "broker-b") == {}  # nothing started it anywhere else

        back = ray_cluster.add_node(num_cpus=1, resources={"rmq-keep-b": 1})
        status = wait_until(lambda: _alive(cluster, "broker-b"), timeout_s=60, what="broker-b back")
        assert status["node_id"] == back.node_id
        assert keeper_status(cluster)["brokers"]["broker-b-0"]["restarts"] == 1
        wait_until(lambda: "broker-b" in cluster.admin.brokers(), what="broker-b routed again")
        producer.send_batch([Message("Kept", b"after-%d" % i) for i in range(50)])
        got = drain(cluster.pull_consumer("g-kept"), "Kept")
        bodies = sorted(m.body for msgs in got.values() for m in msgs)
        want = sorted([b"before-%d" % i for i in range(50)] + [b"after-%d" % i for i in range(50)])
        assert bodies == want  # its store recovered: nothing lost, nothing twice
        producer.close()
    finally:
        for n in (node, back):
            if n is not None and n in ray_cluster.worker_nodes:
                ray_cluster.remove_node(n, allow_graceful=False)


def test_auto_promotion_moves_the_group_and_the_old_master_returns_as_its_slave(
    ray_cluster: Any, make_cluster: Any
) -> None:
    node = ray_cluster.add_node(num_cpus=1, resources={"rmq-keep-master": 1})
    back = None
    try:
        ray_cluster.wait_for_nodes()
        cluster = make_cluster(
            nameservers=1,
            topics=[actors.TopicConfig("AutoP", 2, 2)],
            brokers=[
                BrokerSpec("broker-a", 0, node="rmq-keep-master"),
                BrokerSpec("broker-a", 1),  # two slaves on the head node: the promoted
                BrokerSpec("broker-a", 2),  # SYNC_MASTER needs one to acknowledge
            ],
            broker_options={
                "broker_role": "SYNC_MASTER",
                "slave_sync_interval_s": 0.3,
                "ha_slave_timeout_s": 2.0,
            },
            auto_promote=True,
        )
        load = Load(cluster.producer("p-autop", send_timeout_s=3.0), "AutoP").start()
        try:
            wait_until(lambda: len(load.acked) > 200, what="load running")
            ray_cluster.remove_node(node, allow_graceful=False)
            removed = time.monotonic()
            promoted = wait_until(
                lambda: keeper_status(cluster)["promotions"], timeout_s=30, what="a promotion"
            )
            assert promoted[0]["broker_name"] == "broker-a"
            assert members(cluster, "broker-a").get(0) == "broker-a-1"
            promoted_at = time.monotonic()
            wait_until(
                lambda: load.acked_since(promoted_at) > 0, timeout_s=10, what="sends resumed"
            )
            resumed = min(t for t in load.ok_times if t > promoted_at) - promoted_at
            wait_until(lambda: load.acked_since(removed) > 100, what="writes flowing again")
        finally:
            load.finish()
        assert resumed < 2.0, f"first acknowledged send {resumed:.2f}s after the promotion"

        back = ray_cluster.add_node(num_cpus=1, resources={"rmq-keep-master": 1})
        status = wait_until(
            lambda: _alive(cluster, "broker-a", 0), timeout_s=60, what="the old master back"
        )
        assert status["node_id"] == back.node_id
        wait_until(
            lambda: _alive(cluster, "broker-a", 0).get("role") == "SLAVE",
            what="the old master a slave",
        )
        new = cluster.broker("broker-a", 1)
        wait_until(
            lambda: (
                _alive(cluster, "broker-a", 0).get("commitlog_max_offset")
                == status_of(new).get("commitlog_max_offset")
            ),
            what="the old master caught up",
        )
        log = read_member(new, "AutoP", (0, 1))
        assert len(log) == len(set(log)), "a message is stored twice"
        assert set(load.acked) <= set(log), "an acknowledged message was lost"
    finally:
        for n in (node, back):
            if n is not None and n in ray_cluster.worker_nodes:
                ray_cluster.remove_node(n, allow_graceful=False)
