"""Lite sends and a broker's replication (real Ray): a SYNC_MASTER answers a lite send
once its slave holds it, as it answers a normal send; a Raft group refuses lite sends
clearly and stores nothing."""

from __future__ import annotations

from typing import Any

import pytest
import ray
from raymq_ha_testkit import RAFT, status_of
from raymq_testkit import wait_until

from actors import BrokerSpec
from actors.client.lite import LiteConsumer, LiteProducer
from storage.errors import PermissionDeniedError

FAST = {"slave_sync_interval_s": 0.2, "ha_slave_timeout_s": 1.5}


def test_a_sync_master_answers_a_lite_send_once_its_slave_holds_it(make_cluster: Any) -> None:
    cluster = make_cluster(
        nameservers=1,
        brokers=[BrokerSpec("broker-a", 0), BrokerSpec("broker-a", 1)],
        broker_options={"broker_role": "SYNC_MASTER", **FAST},
    )
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    ray.get(master.lite_create_parent.remote("Chats", quota=100))
    wait_until(lambda: status_of(slave).get("role") == "SLAVE", what="the slave registered")
    with LiteProducer("Chats", namespace=cluster.namespace) as producer:
        for i in range(5):
            sent = producer.send(f"chat-{i % 2}", b"token %d" % i)
            assert sent["status"] == "PUT_OK"
            # answered only once the slave holds the master's CommitLog up to it
            held = status_of(slave)["commitlog_max_offset"]
            assert held >= status_of(master)["commitlog_max_offset"] > 0
    with LiteConsumer("readers", "Chats", namespace=cluster.namespace) as consumer:
        got = consumer.pull("chat-1", 0)
        assert [m.body for m in got.messages] == [b"token 1", b"token 3"]


def test_a_raft_group_refuses_lite_sends_and_stores_nothing(make_cluster: Any) -> None:
    cluster = make_cluster(
        nameservers=1,
        brokers=[BrokerSpec("broker-r", i) for i in range(3)],
        broker_options=RAFT,
    )
    handles = [cluster.broker("broker-r", i) for i in range(3)]

    def leader() -> Any:
        for h in handles:
            if status_of(h).get("role") == "MASTER":
                return h
        return None

    wait_until(lambda: leader() is not None, what="a Raft leader")
    head = leader()
    ray.get(head.lite_create_parent.remote("Chats", quota=10))
    before = status_of(head)["commitlog_max_offset"]
    with pytest.raises(PermissionDeniedError, match="Raft"):
        ray.get(head.lite_send.remote("Chats", [("chat-0", b"x")]))
    assert status_of(head)["commitlog_max_offset"] == before
    assert ray.get(head.lite_topics.remote("Chats")) == []
