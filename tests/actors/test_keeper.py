"""The keeper (``actors/keeper/keeper.py``) on a multi-node Ray cluster: a broker whose
node died starts again, from its store, on a node that joins with its resource.
Automatic promotion, and the old master's return as a slave, are shown end to end by
``tests/faults/test_paused_raylet.py`` (a paused raylet, Ray's verdict, the keeper's
promotion, 0 lost and 0 duplicated)."""

from __future__ import annotations

from typing import Any

import ray
from raymq_ha_testkit import status_of
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
