"""Lite sends and a broker's replication (real Ray): a SYNC_MASTER answers a lite send
once its slave holds it, as it answers a normal send; a Raft group's leader answers one
once the group committed it, and after the leader dies the new one serves every lite
message it acknowledged, and the subscriptions, committed offsets and deletes of lite
topics it acknowledged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray
from raymq_ha_testkit import RaftGroup, kill, members, status_of
from raymq_testkit import wait_until

from actors import BrokerSpec
from actors.client.lite import LiteConsumer, LiteProducer
from storage.errors import BrokerUnavailableError

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


def test_a_raft_group_s_new_leader_serves_the_lite_messages_and_consumer_state_it_took(
    raft_group: Callable[..., RaftGroup],
) -> None:
    started = raft_group("broker-r", "Chats")
    cluster, group, old = started.cluster, started.handles, started.leader
    ns = cluster.namespace
    # resync_s: a subscription is sent once; the new leader must know it from the group
    reader = LiteConsumer("readers", "Chats", namespace=ns, resync_s=3600)
    other = LiteConsumer("readers", "Chats", namespace=ns, resync_s=3600)
    assert reader.subscribe("chat-0", "chat-1", "chat-2") == ["chat-0", "chat-1", "chat-2"]
    assert other.subscribe("chat-1") == []  # the reader owns it: this one waits its turn
    with LiteProducer("Chats", namespace=ns) as producer:
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
    got = {b.lite_topic: b for b in reader.receive()}
    assert [m.body for m in got["chat-0"].messages] == [b"token 0", b"token 2", b"token 4"]
    assert [m.body for m in got["chat-1"].messages] == [
        b"token 1",
        b"token 3",
        b"token 5",
        b"token 6",
    ]
    reader.ack(got["chat-0"])  # all of chat-0
    reader.ack("chat-1", 2)  # chat-1 up to "token 5": the rest was handed out, not acked
    assert ray.get(group[old].lite_delete_topic.remote("Chats", "chat-2")) is True

    kill(group[old])
    new = wait_until(
        lambda: (n := members(cluster, "broker-r").get(0)) != old and n, what="a new leader"
    )
    leader = group[new]
    assert ray.get(leader.lite_describe_parent.remote("Chats"))["quota"] == 10
    assert ray.get(leader.lite_topics.remote("Chats")) == ["chat-0", "chat-1"]  # chat-2 deleted
    chat1 = ray.get(leader.lite_describe_topic.remote("Chats", "chat-1"))
    assert chat1["groups"]["readers"] == {
        "committed_offset": 2,
        "lag": 2,
        "owner": reader.client_id,
    }
    # the reader goes on where it committed: chat-1 from "token 5", nothing of chat-0
    again = answered(lambda: reader.receive())
    assert {b.lite_topic: [m.body for m in b.messages] for b in again} == {
        "chat-1": [b"token 5", b"token 6"]
    }
    reader.ack(again[0])
    with LiteProducer("Chats", namespace=ns) as producer:
        after = producer.send("chat-0", b"token 7")  # the new leader's first lite send
    assert (after["offset"], after["status"]) == (3, "PUT_OK")
    assert [(b.lite_topic, b.offset) for b in reader.receive()] == [("chat-0", 3)]
    # the other consumer's subscription survived too: it takes chat-1 over from the
    # group's committed offset once the reader leaves it
    reader.unsubscribe("chat-1")
    assert other.owned() == ["chat-1"]
    assert other.receive() == []  # nothing past the reader's commit
    assert [m.body for m in reader.pull("chat-1", 0).messages] == [
        b"token 1",
        b"token 3",
        b"token 5",
        b"token 6",
    ]
    reader.close()
    other.close()


def answered(call: Any) -> Any:
    """``call()``'s answer once the client found the group's new leader."""

    def attempt() -> list[Any] | None:
        try:
            return [call()]
        except (ray.exceptions.RayActorError, BrokerUnavailableError):
            return None

    return wait_until(attempt, what="an answer from the new leader")[0]


def test_a_raft_leader_commits_acks_arriving_together_in_fewer_rounds_than_acks(
    raft_group: Callable[..., RaftGroup],
) -> None:
    started = raft_group("broker-q", "Tasks", quota=100)
    group, name, leader = started.handles, started.leader, started.leader_handle()
    lites = [f"task-{i}" for i in range(24)]
    view = ray.get(leader.lite_subscribe.remote("workers", "Tasks", "w1", lites))
    assert view["owned"] == sorted(lites)
    sent = ray.get(leader.lite_send.remote("Tasks", [(n, b"job") for n in lites for _ in "ab"]))
    assert {s["status"] for s in sent} == {"PUT_OK"}
    before = ray.get(leader.lite_stats.remote())
    # every ack at once: each answered only once its change is committed and applied
    ray.get(
        [
            leader.lite_ack.remote("workers", "Tasks", "w1", n, 1 + i % 2)
            for i, n in enumerate(lites)
        ]
    )
    after = ray.get(leader.lite_stats.remote())
    assert after["state_changes"] - before["state_changes"] == len(lites)
    rounds = after["state_rounds"] - before["state_rounds"]
    assert 1 <= rounds <= len(lites) // 2, rounds
    lead = status_of(leader)
    assert lead["commit_index"] == lead["last_index"]
    want = [1 + i % 2 for i in range(len(lites))]
    assert [
        ray.get(leader.lite_committed_offset.remote("workers", "Tasks", n)) for n in lites
    ] == want
    # the followers apply the same records, in one entry or several
    for member, handle in group.items():
        if member != name:
            wait_until(
                lambda h=handle: (
                    [ray.get(h.lite_committed_offset.remote("workers", "Tasks", n)) for n in lites]
                    == want
                ),
                what=f"{member} applied the acks",
            )


def test_a_raft_group_expires_lite_topics_through_its_log_on_every_member_alike(
    raft_group: Callable[..., RaftGroup],
) -> None:
    started = raft_group("broker-x", "Talks", quota=100, ttl_ms=1500, lite_expire_interval_ms=300)
    group, leader = started.handles, started.leader_handle()
    view = ray.get(leader.lite_subscribe.remote("g", "Talks", "c1", ["quiet", "busy"]))
    assert view["subscribed"] == ["busy", "quiet"]
    ray.get(leader.lite_send.remote("Talks", [("quiet", b"q"), ("busy", b"b")]))
    before = ray.get(leader.lite_stats.remote())["state_changes"]

    def quiet_gone_everywhere() -> bool:
        ray.get(leader.lite_send.remote("Talks", [("busy", b"more")]))  # busy stays written
        return all(
            ray.get(h.lite_describe_topic.remote("Talks", "quiet")) is None for h in group.values()
        )

    wait_until(quiet_gone_everywhere, timeout_s=30, interval_s=0.2, what="quiet expired")
    # the leader proposed it: an ``expire`` record of the log, not each member's clock
    assert ray.get(leader.lite_stats.remote())["state_changes"] > before
    for member, handle in group.items():
        found = ray.get(handle.lite_describe_topic.remote("Talks", "busy"))
        assert found is not None, member
        assert found["groups"]["g"]["owner"] == "c1", member  # busy's subscription stands
    again = ray.get(leader.lite_subscribe.remote("g", "Talks", "c1", ["quiet", "busy"], "keep"))
    assert (again["subscribed"], again["gone"]) == (["busy"], ["quiet"])


def test_a_raft_follower_refuses_to_create_a_lite_parent_and_changes_nothing(
    raft_group: Callable[..., RaftGroup],
) -> None:
    # elections slow enough that leadership does not move under a loaded machine while
    # the test runs: the member asked must still be a follower when it answers
    started = raft_group(
        "broker-f", "Chats", dledger_heartbeat_ms=300, dledger_election_timeout_ms=3000
    )
    group, lead = started.handles, started.leader
    follower = next(h for n, h in group.items() if n != lead)
    assert status_of(follower)["role"] == "SLAVE"
    before = ray.get(follower.lite_parents.remote())
    try:
        ray.get(follower.lite_create_parent.remote("Rooms", quota=5))
    except BrokerUnavailableError as exc:
        assert "does not lead its Raft group" in str(exc) and "'Rooms'" in str(exc)
    else:
        raise AssertionError("a follower created a LITE parent its leader never learns of")
    assert ray.get(follower.lite_parents.remote()) == before
    assert ray.get(follower.get_topic_config.remote("Rooms")) is None
    # the leader creates it, and the follower copies it from there
    ray.get(started.leader_handle().lite_create_parent.remote("Rooms", quota=5))
    wait_until(
        lambda: "Rooms" in ray.get(follower.lite_parents.remote()),
        what="the follower copied the leader's new parent",
    )
