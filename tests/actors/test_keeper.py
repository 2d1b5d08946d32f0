"""The keeper (``actors/keeper/keeper.py``) on a multi-node Ray cluster: a broker whose
node died starts again, from its store, on a node that joins with its resource; with
``auto_promote`` it promotes a slave each time the group's current master dies with its
node (the configured master, then the slave it promoted), and a NameServer that does not
answer costs it a round. Automatic promotion, and the old master's return as a slave,
are shown end to end by ``tests/faults/test_paused_raylet.py`` (a paused raylet, Ray's
verdict, the keeper's promotion, 0 lost and 0 duplicated)."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from pathlib import Path
from typing import Any

import ray
from raymq_ha_testkit import broker_config, members, status_of
from raymq_testkit import drain, wait_until

import actors
from actors import BrokerSpec, ClusterConfig, SendStatus
from actors.keeper import KEEPER_ACTOR_NAME, BrokerKeeper, KeptBroker
from actors.namesrv.client import NS_CALL_TIMEOUT_S
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


def _bodies(cluster: actors.Cluster, topic: str, group: str) -> list[bytes]:
    got = drain(cluster.pull_consumer(group), topic)
    return sorted(m.body for msgs in got.values() for m in msgs)


def _follows(slave: Any, master: str, end: int) -> bool:
    status = status_of(slave, 2.0)
    return status.get("master") == master and status.get("commitlog_max_offset") == end


def test_the_keeper_promotes_again_when_the_promoted_slave_dies(
    ray_cluster: Any, make_cluster: Any
) -> None:
    """A group of three, each member on a node of its own: the master's node dies, a
    slave is promoted; then the promoted slave's node dies (the configured master is
    still away) and the keeper promotes the last slave, from the group's current master
    as the NameServers registered it, not from the configured one."""
    nodes = [ray_cluster.add_node(num_cpus=1, resources={f"rmq-again-{i}": 1}) for i in range(3)]
    try:
        ray_cluster.wait_for_nodes()
        cluster = make_cluster(
            config=ClusterConfig(keeper_interval_s=0.5, auto_promote=True),
            nameservers=1,
            brokers=[BrokerSpec("broker-a", i, node=f"rmq-again-{i}") for i in range(3)],
            broker_options={"slave_sync_interval_s": 0.3},
        )
        cluster.admin.create_topic("Again", 2, 2)
        producer = cluster.producer("p-again")
        sent: list[bytes] = []

        def send(prefix: bytes) -> None:
            bodies = [b"%s-%03d" % (prefix, i) for i in range(30)]
            results = producer.send_batch([Message("Again", b) for b in bodies])
            assert {r.status for r in results} == {SendStatus.SEND_OK}
            sent.extend(bodies)

        def caught_up(master: str) -> None:
            """Every live slave follows ``master`` and holds all it has."""
            handle = ray.get_actor(master, namespace=cluster.namespace)
            end = status_of(handle)["commitlog_max_offset"]
            for bid, name in members(cluster, "broker-a").items():
                if bid != 0:
                    slave = ray.get_actor(name, namespace=cluster.namespace)
                    wait_until(
                        functools.partial(_follows, slave, master, end),
                        what=f"{name} caught up with {master}",
                    )

        def promoted(count: int) -> str:
            try:
                done = wait_until(
                    lambda: keeper_status(cluster)["promotions"][count - 1 :], timeout_s=30
                )
            except AssertionError:
                raise AssertionError(
                    f"no promotion {count}: {keeper_status(cluster)}, "
                    f"nodes {[(n['NodeID'][:8], n['Alive']) for n in ray.nodes()]}"
                ) from None
            name: str = done[0]["broker"]
            wait_until(lambda: members(cluster, "broker-a").get(0) == name, what=f"{name} routed")
            return name

        send(b"first")
        caught_up("broker-a-0")
        # each node killed hard (its raylet and every process on it SIGKILLed at once),
        # as a machine that loses power: Ray finds it dead only by its health checks
        ray_cluster.remove_node(nodes[0], allow_graceful=False)  # the configured master's
        first = promoted(1)
        assert first in ("broker-a-1", "broker-a-2")
        send(b"second")
        caught_up(first)

        ray_cluster.remove_node(nodes[int(first[-1])], allow_graceful=False)  # the promoted
        second = promoted(2)
        assert {first, second} == {"broker-a-1", "broker-a-2"}
        status = wait_until(
            lambda: (
                (st := keeper_status(cluster))["masters"]["broker-a"]["actor_name"] == second and st
            ),
            what="the keeper watching the new master",
        )
        assert status["refused"] == {}
        send(b"third")
        assert _bodies(cluster, "Again", "g-again") == sorted(sent)
        producer.close()
    finally:
        for n in nodes:
            if n in ray_cluster.worker_nodes:
                ray_cluster.remove_node(n, allow_graceful=False)


def test_a_nameserver_that_does_not_answer_costs_the_keeper_a_round(
    make_cluster: Any, tmp_path: Path
) -> None:
    cluster = make_cluster(nameservers=1, brokers=[BrokerSpec("broker-a", i) for i in range(2)])
    here = ray.get_runtime_context().get_node_id()
    master = status_of(cluster.broker("broker-a", 0))
    keeper = BrokerKeeper(  # in this process, rounds called by hand
        cluster.namespace,
        [
            KeptBroker(broker_config(cluster, str(tmp_path), "broker-a", i), None, here)
            for i in (0, 1)
        ],
        auto_promote=True,
    )
    keeper.tend()
    status = asyncio.run(keeper.status())
    assert status["masters"] == {"broker-a": {"actor_name": "broker-a-0", "node_id": here}}
    assert status["nameservers_error"] is None
    assert master["node_id"] == here

    pid = ray.get(cluster.nameserver(0).get_cluster_info.remote(), timeout=10)["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        keeper.tend()
        took = time.monotonic() - began
        status = asyncio.run(keeper.status())
    finally:
        os.kill(pid, signal.SIGCONT)
    assert took < 2 * NS_CALL_TIMEOUT_S + 2.0, f"a round took {took:.1f} s"
    assert "no NameServer answered" in status["nameservers_error"]
    assert status["promotions"] == [] and status["refused"] == {}
    keeper.tend()  # the NameServer answers again: the next round sees the group
    assert asyncio.run(keeper.status())["nameservers_error"] is None
