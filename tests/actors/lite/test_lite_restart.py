"""Lite subscriptions and offsets across a broker's restart (real Ray, real store): a
broker killed and restarted by Ray serves the subscriptions and owners it had before
any client sends them again; a lite commit followed by the broker's persist or a clean
stop survives the restart exactly; a restarted member of a Raft group holds the same
tables and committed offsets as the rest of its group (a commit it applied after its
last flush too), and the changes its group commits after."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray
from raymq_ha_testkit import RaftGroup, status_of
from raymq_testkit import wait_until


def owners(broker: Any, lite_topics: list[str]) -> dict[str, dict[str, str | None]]:
    """Per lite topic of ``Chats``: the owner per group subscribing it."""
    out = {}
    for name in lite_topics:
        found = ray.get(broker.lite_describe_topic.remote("Chats", name))
        out[name] = {g: v["owner"] for g, v in (found or {"groups": {}})["groups"].items()}
    return out


def saved(broker: Any) -> bool:
    """The broker's subscription tables are in its file (no change unsaved)."""
    stats = ray.get(broker.lite_stats.remote())
    return stats["subscription_saves"] > 0 and not stats["subscriptions_unsaved"]


def restart(broker: Any, before: str | None = None) -> None:
    """SIGKILL: Ray starts the broker again on its store (``before``: its incarnation,
    if it no longer answers ``status``)."""
    before = before or status_of(broker)["incarnation"]
    ray.kill(broker, no_restart=False)
    wait_until(
        lambda: status_of(broker, 2.0).get("incarnation") not in (None, before),
        timeout_s=60,
        what="the broker restarted",
    )


def test_a_restarted_broker_serves_its_subscriptions_before_any_client_resends_them(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(nameservers=1, brokers=1)
    broker = cluster.broker("broker-a")
    ray.get(broker.lite_create_parent.remote("Chats", quota=10, ttl_ms=3_600_000))

    def subscribe(group: str, client: str, *names: str, action: str = "add") -> Any:
        return ray.get(broker.lite_subscribe.remote(group, "Chats", client, list(names), action))

    subscribe("readers", "c1", "chat-0", "chat-1")
    subscribe("readers", "c2", "chat-1", "chat-0")
    subscribe("readers", "c3", "chat-1")
    subscribe("audit", "c9", "chat-1")
    subscribe("readers", "c1", "chat-1", action="remove")  # c2 takes it, c3 waits
    sent = ray.get(broker.lite_send.remote("Chats", [("chat-1", b"m%d" % i) for i in range(3)]))
    assert [s["offset"] for s in sent] == [0, 1, 2]
    got = ray.get(broker.lite_receive.remote("readers", "Chats", "c2"))
    assert [(b["lite_topic"], len(b["messages"])) for b in got] == [("chat-1", 3)]
    before = owners(broker, ["chat-0", "chat-1"])
    assert before == {
        "chat-0": {"readers": "c1"},
        "chat-1": {"audit": "c9", "readers": "c2"},
    }
    wait_until(lambda: saved(broker), what="the subscription tables saved")
    # a commit, saved by persist (not left to the lite store's periodic flush): it
    # survives the SIGKILL that follows at once
    ray.get(broker.lite_ack.remote("readers", "Chats", "c2", "chat-1", 2))
    ray.get(broker.persist.remote())

    restart(broker)
    assert owners(broker, ["chat-0", "chat-1"]) == before  # no client sent them again
    # c2 receives exactly where the group committed; c1 and c3 own nothing of chat-1
    got = ray.get(broker.lite_receive.remote("readers", "Chats", "c2"))
    assert [(b["lite_topic"], b["offset"], len(b["messages"])) for b in got] == [("chat-1", 2, 1)]
    assert ray.get(broker.lite_receive.remote("readers", "Chats", "c3")) == []
    # the order of the subscribers came back too: c3 is next for chat-1, c2 for chat-0
    subscribe("readers", "c2", "chat-1", action="remove")
    subscribe("readers", "c1", "chat-0", action="remove")
    assert owners(broker, ["chat-0", "chat-1"]) == {
        "chat-0": {"readers": "c2"},
        "chat-1": {"audit": "c9", "readers": "c3"},
    }


def test_a_lite_commit_followed_by_a_persist_or_a_clean_stop_survives_a_restart(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(nameservers=1, brokers=1)
    broker = cluster.broker("broker-a")
    ray.get(broker.lite_create_parent.remote("Chats", quota=10, ttl_ms=3_600_000))
    ray.get(broker.lite_subscribe.remote("readers", "Chats", "c1", ["chat-0"]))
    ray.get(broker.lite_send.remote("Chats", [("chat-0", b"m%d" % i) for i in range(4)]))
    ray.get(broker.lite_ack.remote("readers", "Chats", "c1", "chat-0", 1))
    ray.get(broker.persist.remote())
    # a second commit with nothing else written since the flush: saved by the clean stop
    ray.get(broker.lite_ack.remote("readers", "Chats", "c1", "chat-0", 3))
    incarnation = status_of(broker)["incarnation"]
    ray.get(broker.shutdown.remote())

    restart(broker, incarnation)
    assert ray.get(broker.lite_committed_offset.remote("readers", "Chats", "chat-0")) == 3
    got = ray.get(broker.lite_receive.remote("readers", "Chats", "c1"))
    # exactly what follows the commit: nothing delivered again
    assert [(b["lite_topic"], b["offset"], [m.body for m in b["messages"]]) for b in got] == [
        ("chat-0", 3, [b"m3"])
    ]


def committed(broker: Any, lite_topic: str) -> int:
    """The offset ``readers`` committed in a lite topic of ``Chats``, as the broker
    holds it (-1: none, or no such lite topic)."""
    found = ray.get(broker.lite_describe_topic.remote("Chats", lite_topic))
    return (found or {"groups": {}})["groups"].get("readers", {}).get("committed_offset", -1)


def test_a_restarted_raft_member_holds_the_same_subscriptions_as_its_group(
    raft_group: Callable[..., RaftGroup],
) -> None:
    started = raft_group("broker-s", "Chats")
    group, lead, leader = started.handles, started.leader, started.leader_handle()
    names = ["chat-0", "chat-1", "chat-2"]

    def subscribe(client: str, *lites: str, action: str = "add", grp: str = "readers") -> Any:
        return ray.get(leader.lite_subscribe.remote(grp, "Chats", client, list(lites), action))

    subscribe("c1", *names)
    subscribe("c2", "chat-1", "chat-2")
    subscribe("c3", "chat-2", "chat-1")
    subscribe("c9", "chat-0", grp="audit")
    subscribe("c1", "chat-2", action="remove")  # c2 takes chat-2
    want = owners(leader, names)
    assert want == {
        "chat-0": {"audit": "c9", "readers": "c1"},
        "chat-1": {"readers": "c1"},
        "chat-2": {"readers": "c2"},
    }
    follower = next(h for n, h in group.items() if n != lead)
    wait_until(
        lambda: owners(follower, names) == want and saved(follower),
        what="a follower applied and saved the subscriptions",
    )

    # a commit, then a send that the member indexes past it, with no wait for a flush
    # of its lite store: the kill finds the commit in its log only
    ray.get(leader.lite_send.remote("Chats", [("chat-0", b"m%d" % i) for i in range(4)]))
    ray.get(leader.lite_ack.remote("readers", "Chats", "c1", "chat-0", 3))
    ray.get(leader.lite_send.remote("Chats", [("chat-1", b"later")]))

    def indexed_past_the_commit() -> bool:
        later = ray.get(follower.lite_describe_topic.remote("Chats", "chat-1"))
        return committed(follower, "chat-0") == 3 and later["max_offset"] == 1

    wait_until(indexed_past_the_commit, what="the follower applied the commit and the send")

    restart(follower)
    assert owners(follower, names) == want  # from its file, before the group told it more
    assert ray.get(follower.lite_committed_offset.remote("readers", "Chats", "chat-0")) == 3
    # a change committed after the restart reaches it from the log
    subscribe("c1", "chat-1", action="remove")  # c2 next (before c3)
    want["chat-1"] = {"readers": "c2"}
    assert owners(leader, names) == want
    wait_until(lambda: owners(follower, names) == want, what="the restarted member applied it")
