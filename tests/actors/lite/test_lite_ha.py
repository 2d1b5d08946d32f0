"""Lite sends and a broker's replication (real Ray): a SYNC_MASTER answers a lite send
once its slave holds it, as it answers a normal send; a Raft group's leader answers one
once the group committed it, and after the leader dies the new one serves every lite
message it acknowledged."""

from __future__ import annotations

from typing import Any

import ray
from raymq_ha_testkit import RAFT, kill, members, status_of
from raymq_testkit import wait_until

from actors import BrokerSpec
from actors.client.lite import LiteConsumer, LiteProducer

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


def test_a_raft_group_commits_lite_sends_and_a_new_leader_serves_them(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(
        nameservers=1,
        brokers=[BrokerSpec("broker-r", i) for i in range(3)],
        broker_options=RAFT,
    )
    group = {f"broker-r-{i}": cluster.broker("broker-r", i) for i in range(3)}
    old = wait_until(lambda: members(cluster, "broker-r").get(0), what="a Raft leader")
    ray.get(group[old].lite_create_parent.remote("Chats", quota=10, ttl_ms=3_600_000))
    settings = {"Chats": {"quota": 10, "ttlMs": 3_600_000}}
    wait_until(
        lambda: all(ray.get(h.lite_parents.remote()) == settings for h in group.values()),
        what="the followers took the leader's LITE parent",
    )
    with LiteProducer("Chats", namespace=cluster.namespace) as producer:
        sent = producer.send_batch([(f"chat-{i % 2}", b"token %d" % i) for i in range(6)])
        sent.append(producer.send("chat-1", b"token 6"))
    assert [(s["lite_topic"], s["offset"], s["status"]) for s in sent] == [
        ("chat-0", 0, "PUT_OK"),
        ("chat-1", 0, "PUT_OK"),
        ("chat-0", 1, "PUT_OK"),
        ("chat-1", 1, "PUT_OK"),
        ("chat-0", 2, "PUT_OK"),
        ("chat-1", 2, "PUT_OK"),
        ("chat-1", 3, "PUT_OK"),
    ]
    # answered once a majority held it: at least one follower holds it already
    lead = status_of(group[old])
    assert any(
        status_of(h)["commitlog_max_offset"] >= lead["committed_offset"] > 0
        for n, h in group.items()
        if n != old
    )
    kill(group[old])
    new = wait_until(
        lambda: (n := members(cluster, "broker-r").get(0)) != old and n, what="a new leader"
    )
    assert ray.get(group[new].lite_describe_parent.remote("Chats"))["quota"] == 10
    with LiteConsumer("readers", "Chats", namespace=cluster.namespace) as consumer:
        got = consumer.pull("chat-1", 0)  # the new leader's first lite call
        assert [m.body for m in got.messages] == [b"token 1", b"token 3", b"token 5", b"token 6"]
        with LiteProducer("Chats", namespace=cluster.namespace) as producer:
            after = producer.send("chat-1", b"token 7")  # the new leader's first lite send
        assert (after["offset"], after["status"]) == (4, "PUT_OK")
        assert [m.body for m in consumer.pull("chat-1", 4).messages] == [b"token 7"]
        assert [m.body for m in consumer.pull("chat-0", 0).messages] == [
            b"token 0",
            b"token 2",
            b"token 4",
        ]
