"""A broker's cluster lease (``actors/broker/lease.py``): cut off from Ray's GCS and
every NameServer, it stops acknowledging writes on its own socket within its lease
and takes them again once it hears the cluster; its raylet gone, it exits and frees
its store."""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import ray
from raymq_testkit import drain, wait_until

from actors import BrokerSpec
from actors.broker.offset.consumer_offset_manager import ConsumerOffsetManager
from storage import Message
from storage.config_files import JsonConfigFile
from storage.errors import BrokerUnavailableError

LEASE = {"cluster_lease_s": 1.5, "lease_renew_interval_s": 0.25}


def test_a_broker_cut_off_from_the_cluster_takes_no_writes_until_it_hears_it_again(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(brokers=1, broker_options=LEASE)
    cluster.admin.create_topic("Lease", 2, 2)
    broker = cluster.broker("broker-a")
    producer = cluster.producer("lease", retry_times_when_send_failed=0, delivery_timeout_s=1.0)
    producer.send(Message("Lease", b"before"))
    # its sends go over the socket (the first went through Ray while it opened)
    wait_until(lambda: producer._data_path.is_open("broker-a-0"), what="the producer's socket")

    ray.get(broker.inject_fault.remote("lose_cluster", 1_000_000))  # the partition
    why = wait_until(lambda: ray.get(broker.status.remote())["fenced"], timeout_s=10, what="fenced")
    assert "cluster_lease_s" in why
    with pytest.raises(BrokerUnavailableError, match="cluster_lease_s"):
        producer.send(Message("Lease", b"while cut off"))
    with pytest.raises(BrokerUnavailableError, match="cluster_lease_s"):
        producer.send_async([Message("Lease", b"while cut off, async")] * 3).result(timeout=30)

    ray.get(broker.inject_fault.remote("lose_cluster", 0))  # healed
    wait_until(
        lambda: ray.get(broker.status.remote())["fenced"] is None, timeout_s=10, what="unfenced"
    )
    producer.send(Message("Lease", b"after"))
    bodies = sorted(
        m.body for got in drain(cluster.pull_consumer("lease-check"), "Lease").values() for m in got
    )
    assert bodies == [b"after", b"before"]  # nothing acknowledged, nothing stored, cut off
    producer.close()


def _store_locked(store_dir: str) -> bool:
    fd = os.open(Path(store_dir) / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def test_a_broker_whose_raylet_is_gone_exits_and_frees_its_store(
    ray_cluster: Any, make_cluster: Any
) -> None:
    node = ray_cluster.add_node(num_cpus=1, resources={"rmq-lease-node": 1})
    try:
        ray_cluster.wait_for_nodes()
        cluster = make_cluster(
            nameservers=1,
            topics=["LeaseNode"],
            brokers=[BrokerSpec("broker-a"), BrokerSpec("broker-b", node="rmq-lease-node")],
            # no periodic save of consumer offsets before the broker leaves
            broker_options={**LEASE, "flush_consumer_offset_interval_s": 3600.0},
        )
        broker = cluster.broker("broker-b")
        status = ray.get(broker.status.remote())
        pid, store_dir = status["pid"], status["store_dir"]
        assert _store_locked(store_dir)
        ray.get(broker.commit_offsets.remote("left-behind", {("LeaseNode", 0): 0}))
        node.kill_raylet()
        wait_until(lambda: not os.path.exists(f"/proc/{pid}"), timeout_s=30, what="broker exit")
        assert not _store_locked(store_dir)  # a broker started with this disk can open it
        # and it finds the offsets committed before the broker left (saved as it left,
        # or in the offsets' journal when Ray's end of the worker came first)
        table = ConsumerOffsetManager(
            JsonConfigFile(Path(store_dir) / "config" / "consumerOffset.json")
        )
        assert table.query_topic("left-behind", "LeaseNode") == {0: 0}
    finally:
        ray_cluster.remove_node(node, allow_graceful=False)


def test_a_broker_whose_raylet_is_paused_takes_no_writes_until_it_answers_again(
    ray_cluster: Any, make_cluster: Any
) -> None:
    # a paused raylet is what Ray's GCS takes for a dead node (a minute later); the broker
    # beside it still reaches the GCS and its NameServers, and must not go on
    # acknowledging writes its slave may never have once Ray gives its verdict
    node = ray_cluster.add_node(num_cpus=1, resources={"rmq-paused-node": 1})
    try:
        ray_cluster.wait_for_nodes()
        cluster = make_cluster(
            nameservers=1,
            brokers=[BrokerSpec("broker-a"), BrokerSpec("broker-b", node="rmq-paused-node")],
            broker_options=LEASE,
        )
        cluster.admin.create_topic("Paused", 2, 2, brokers=["broker-b"])
        broker = cluster.broker("broker-b")
        producer = cluster.producer(
            "paused", retry_times_when_send_failed=0, delivery_timeout_s=1.0
        )
        producer.send(Message("Paused", b"before"))
        wait_until(lambda: producer._data_path.is_open("broker-b-0"), what="the socket")
        raylet = node.all_processes["raylet"][0].process
        os.kill(raylet.pid, signal.SIGSTOP)
        try:
            why = wait_until(
                lambda: ray.get(broker.status.remote(), timeout=5)["fenced"],
                timeout_s=10,
                what="fenced",
            )
            assert "raylet" in why
            with pytest.raises(BrokerUnavailableError, match="cluster_lease_s"):
                producer.send(Message("Paused", b"while paused"))
        finally:
            os.kill(raylet.pid, signal.SIGCONT)
        wait_until(
            lambda: ray.get(broker.status.remote())["fenced"] is None,
            timeout_s=15,
            what="unfenced",
        )
        producer.send(Message("Paused", b"after"))
        got = drain(cluster.pull_consumer("paused-check"), "Paused")
        assert sorted(m.body for msgs in got.values() for m in msgs) == [b"after", b"before"]
        producer.close()
    finally:
        ray_cluster.remove_node(node, allow_graceful=False)
