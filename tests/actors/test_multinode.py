"""Brokers pinned to nodes of a multi-node Ray cluster (``ray.cluster_utils.Cluster``)."""

from __future__ import annotations

import time
from typing import Any

import ray
from raymq_testkit import wait_until

from actors import BrokerSpec
from storage import Message


def live_brokers(cluster: Any, topic: str) -> list[str]:
    route = ray.get(cluster.nameserver(0).get_route.remote(topic))
    return sorted(q.broker_name for q in route.queue_datas) if route else []


def status_of(broker: Any) -> dict[str, Any]:
    """The broker's status, or {} while Ray restarts it."""
    try:
        return ray.get(broker.status.remote(), timeout=30)
    except ray.exceptions.RayActorError:
        return {}


def node_of(broker: Any) -> str | None:
    return status_of(broker).get("node_id")


def test_broker_pinned_to_a_node_restarts_there_and_leaves_with_it(
    ray_cluster: Any, make_cluster: Any
) -> None:
    node = ray_cluster.add_node(num_cpus=1, resources={"rmq-node-b": 1})
    try:
        ray_cluster.wait_for_nodes()
        cluster = make_cluster(
            nameservers=1,
            topics=["Pinned"],
            brokers=[BrokerSpec("broker-a"), BrokerSpec("broker-b", node="rmq-node-b")],
        )
        broker_b = cluster.broker("broker-b")
        assert node_of(broker_b) == node.node_id
        assert node_of(cluster.broker("broker-a")) == ray.get_runtime_context().get_node_id()
        producer = cluster.producer("p-pinned")
        producer.send_batch([Message("Pinned", b"x%d" % i) for i in range(64)])

        pid = ray.get(broker_b.status.remote())["pid"]
        ray.kill(broker_b, no_restart=False)
        wait_until(
            lambda: status_of(broker_b).get("pid") not in (None, pid),
            timeout_s=60,
            what="broker-b restarted",
        )
        assert node_of(broker_b) == node.node_id
        wait_until(
            lambda: live_brokers(cluster, "Pinned") == ["broker-a", "broker-b"],
            what="broker-b re-registered",
        )
        assert sum(r["max_offset"] for r in cluster.admin.topic_status("Pinned")) == 64

        # large async sends: through the shared ring to the broker on this node only
        body = b"z" * 100
        futures = [producer.send_async([Message("Pinned", body)] * 4096) for _ in range(8)]
        results = [f.result(timeout=60) for f in futures]
        assert {s.message_queue.broker_name for r in results for s in r} == {"broker-a", "broker-b"}
        assert status_of(cluster.broker("broker-a"))["shared_batches"] > 0
        assert status_of(broker_b)["shared_batches"] == 0
        assert list(producer._rings) == ["broker-a-0"]
        total = 64 + 8 * 4096
        assert sum(r["max_offset"] for r in cluster.admin.topic_status("Pinned")) == total

        # the broker on the other node takes single sends over its own socket
        wait_until(
            lambda: status_of(broker_b).get("data_connections", 0) >= 1,
            what="the producer's socket to broker-b",
        )
        before = status_of(broker_b)["data_requests"]
        sent = [producer.send(Message("Pinned", b"s%d" % i)) for i in range(16)]
        on_b = sum(r.message_queue.broker_name == "broker-b" for r in sent)
        assert on_b > 0
        assert status_of(broker_b)["data_requests"] - before >= on_b

        ray_cluster.remove_node(node)
        removed = time.monotonic()
        wait_until(
            lambda: live_brokers(cluster, "Pinned") == ["broker-a"],
            timeout_s=5,
            interval_s=0.01,
            what="broker-b gone from routes",
        )
        assert time.monotonic() - removed < 1.0
        results = producer.send_batch([Message("Pinned", b"y%d" % i) for i in range(32)])
        assert {mq.broker_name for mq, _, _ in results.queues} == {"broker-a"}
    finally:
        if node in ray_cluster.worker_nodes:
            ray_cluster.remove_node(node)
