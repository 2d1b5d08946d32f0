"""The client core (``actors.client.instance``): every client of a process shares one
instance per cluster, and with it one connection per broker; the last client to close
closes the connections. Real Ray, a real broker, real sockets."""

from __future__ import annotations

from typing import Any

import pytest
import ray
from raymq_testkit import wait_until

import actors
from storage import Message

BROKER = "broker-a-0"


def status(cluster: actors.Cluster) -> dict[str, Any]:
    return ray.get(cluster.broker("broker-a").status.remote())


@pytest.fixture
def cluster(one_broker: actors.Cluster) -> actors.Cluster:
    one_broker.admin.create_topic("Shared", 2, 2)
    return one_broker


def test_two_producers_share_one_socket_per_broker_until_the_last_closes(
    cluster: actors.Cluster,
) -> None:
    before = status(cluster)
    first = cluster.producer("p-share-1")
    second = cluster.producer("p-share-2")
    assert first.instance is second.instance
    instance = first.instance
    assert instance.shares >= 2
    assert first.client_id != second.client_id

    first.send(Message("Shared", b"warm-up"))
    wait_until(lambda: first.ns.data_path.is_open(BROKER), what="the shared connection")
    sent = status(cluster)
    for p in (first, second):
        p.send_batch([Message("Shared", b"m%d" % i) for i in range(10)])
    after = status(cluster)
    assert after["data_connections"] - before["data_connections"] == 1
    assert after["data_requests"] - sent["data_requests"] >= 2  # both over that socket
    assert after["put_msgs"] - sent["put_msgs"] == 20

    # closing one client gives back its share: the other still sends on the socket
    shares = instance.shares
    first.close()
    first.close()  # again: nothing more is given back
    assert instance.shares == shares - 1 and not instance.closed
    second.send(Message("Shared", b"after-first-closed"))
    assert status(cluster)["data_connections"] == after["data_connections"]

    # the last share closes the instance and its connections; the next client makes anew
    second.close()
    assert instance.closed and second.ns.data_path.closed
    third = cluster.producer("p-share-3")
    try:
        assert third.instance is not instance
        third.send(Message("Shared", b"third"))
        wait_until(lambda: third.ns.data_path.is_open(BROKER), what="a new connection")
        assert status(cluster)["data_connections"] == after["data_connections"] + 1
    finally:
        third.close()
