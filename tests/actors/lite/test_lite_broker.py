"""Lite topics through a broker actor (real Ray, real store): a parent of type LITE,
sends that create lite topics, exclusive consumption within a group, dynamic
subscriptions, acks that a new owner resumes from, and a resume from an offset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import ray
from raymq_testkit import SMALL_STORE, unique_namespace

import actors
from actors.client.lite import LiteConsumer, LiteProducer
from storage.errors import PermissionDeniedError
from storage.lite import IllegalLiteTopicError, LiteTopicQuotaExceededError


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = actors.start_cluster(
        namespace=unique_namespace("lite"),
        nameservers=1,
        brokers=2,
        store_root=str(tmp_path_factory.mktemp("lite")),
        broker_options={"store": SMALL_STORE},
    )
    for name in ("broker-a", "broker-b"):
        ray.get(c.broker(name).lite_create_parent.remote("Sessions", quota=5, ttl_ms=3_600_000))
        ray.get(c.broker(name).lite_create_parent.remote("Agents", quota=100))
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def broker(cluster: actors.Cluster) -> Any:
    return cluster.broker("broker-a")


def bodies(batches: list[dict[str, Any]]) -> dict[str, list[bytes]]:
    return {b["lite_topic"]: [m.body for m in b["messages"]] for b in batches}


def test_a_session_s_tokens_arrive_in_order_and_resume_from_an_offset(broker: Any) -> None:
    sent = ray.get(
        broker.lite_send.remote("Sessions", [("chat-1", f"tok{i}".encode()) for i in range(10)])
    )
    assert [s["offset"] for s in sent] == list(range(10))
    got = ray.get(broker.lite_pull.remote("Sessions", "chat-1", 6, 32))
    assert [m.body for m in got["messages"]] == [b"tok6", b"tok7", b"tok8", b"tok9"]
    assert got["next_offset"] == got["max_offset"] == 10
    assert "chat-1" in ray.get(broker.lite_topics.remote("Sessions"))


def test_a_lite_topic_is_consumed_by_one_client_of_a_group_at_a_time(broker: Any) -> None:
    ray.get(broker.lite_send.remote("Sessions", [("agent-1", b"a0"), ("agent-1", b"a1")]))
    one = ray.get(broker.lite_subscribe.remote("g", "Sessions", "c1", ["agent-1"]))
    two = ray.get(broker.lite_subscribe.remote("g", "Sessions", "c2", ["agent-1"]))
    assert one["owned"] == ["agent-1"] and two == {"subscribed": ["agent-1"], "owned": []}
    assert ray.get(broker.lite_receive.remote("g", "Sessions", "c2")) == []
    assert bodies(ray.get(broker.lite_receive.remote("g", "Sessions", "c1"))) == {
        "agent-1": [b"a0", b"a1"]
    }
    with pytest.raises(PermissionDeniedError, match="does not own"):
        ray.get(broker.lite_ack.remote("g", "Sessions", "c2", "agent-1", 1))
    ray.get(broker.lite_ack.remote("g", "Sessions", "c1", "agent-1", 1))  # a0 consumed
    # c1 unsubscribes: c2 takes over from the group's committed offset
    ray.get(broker.lite_subscribe.remote("g", "Sessions", "c1", ["agent-1"], "remove"))
    assert bodies(ray.get(broker.lite_receive.remote("g", "Sessions", "c2"))) == {
        "agent-1": [b"a1"]
    }
    # another group reads the lite topic on its own, from the start
    ray.get(broker.lite_subscribe.remote("other", "Sessions", "c9", ["agent-1"], "complete"))
    assert bodies(ray.get(broker.lite_receive.remote("other", "Sessions", "c9"))) == {
        "agent-1": [b"a0", b"a1"]
    }


def test_bad_names_and_the_quota_are_refused_clearly(broker: Any) -> None:
    before = ray.get(broker.lite_stats.remote())
    with pytest.raises(IllegalLiteTopicError, match="must be 1 to 128"):
        ray.get(broker.lite_send.remote("Sessions", [("ok-1", b"x"), ("bad name", b"y")]))
    left = 5 - len(ray.get(broker.lite_topics.remote("Sessions")))
    with pytest.raises(LiteTopicQuotaExceededError, match="quota of 5"):
        ray.get(broker.lite_send.remote("Sessions", [(f"q-{i}", b"z") for i in range(left + 1)]))
    assert ray.get(broker.lite_stats.remote()) == before


def test_the_python_clients_route_each_lite_topic_to_one_broker(cluster: actors.Cluster) -> None:
    ns = cluster.namespace
    with LiteProducer("Agents", namespace=ns) as producer:
        agents = [f"agent-{k}" for k in range(6)]
        sent = producer.send_batch([(a, f"{a}:task{i}".encode()) for i in range(3) for a in agents])
        assert [s["offset"] for s in sent[:6]] == [0] * 6 and sent[-1]["offset"] == 2
        on = {
            n: set(ray.get(cluster.broker(n).lite_topics.remote("Agents")))
            for n in ("broker-a", "broker-b")
        }
        assert on["broker-a"] | on["broker-b"] == set(agents)
        assert not on["broker-a"] & on["broker-b"]  # each lite topic on one broker
    first = LiteConsumer("workers", "Agents", namespace=ns)
    second = LiteConsumer("workers", "Agents", namespace=ns)
    assert first.subscribe(*agents) == sorted(agents)
    assert second.subscribe("agent-0", "agent-1") == []  # owned by the first
    got = {b.lite_topic: b for b in first.receive(100)}
    assert [m.body for m in got["agent-4"].messages] == [
        b"agent-4:task0",
        b"agent-4:task1",
        b"agent-4:task2",
    ]
    first.ack(got["agent-0"])  # agent-0 done; agent-1 not acked
    first.close()  # its lite topics pass to the second, from the group's offsets
    assert second.owned() == ["agent-0", "agent-1"]
    again = {b.lite_topic: [m.body for m in b.messages] for b in second.receive(100)}
    assert again == {"agent-1": [b"agent-1:task0", b"agent-1:task1", b"agent-1:task2"]}
    assert second.committed_offset("agent-0") == 3
    assert [m.body for m in second.pull("agent-4", 2).messages] == [b"agent-4:task2"]
    second.close()
