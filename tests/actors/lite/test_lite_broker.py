"""Lite topics through a broker actor (real Ray, real store): a parent of type LITE,
sends that create lite topics, exclusive consumption within a group, dynamic
subscriptions, acks that a new owner resumes from, and a resume from an offset."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from raymq_testkit import SMALL_STORE, unique_namespace, wait_until

import actors
from actors.aio import AsyncLiteConsumer, AsyncLiteProducer
from actors.client.lite import LiteConsumer, LiteProducer, home_broker
from storage.errors import InvalidMessageError, PermissionDeniedError
from storage.lite import IllegalLiteTopicError, LiteTopicQuotaExceededError


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = actors.start_cluster(
        namespace=unique_namespace("lite"),
        nameservers=1,
        brokers=2,
        store_root=str(tmp_path_factory.mktemp("lite")),
        broker_options={"store": SMALL_STORE, "lite_expire_interval_ms": 300},
    )
    for name in ("broker-a", "broker-b"):
        ray.get(c.broker(name).lite_create_parent.remote("Sessions", quota=5, ttl_ms=3_600_000))
        ray.get(c.broker(name).lite_create_parent.remote("Agents", quota=100))
        ray.get(c.broker(name).lite_create_parent.remote("Short", quota=100, ttl_ms=SHORT_TTL_MS))
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def broker(cluster: actors.Cluster) -> Any:
    return cluster.broker("broker-a")


SHORT_TTL_MS = 1500
"""The TTL of the parent ``Short``, whose lite topics the tests let expire."""


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
    assert one["owned"] == ["agent-1"] and two == {
        "subscribed": ["agent-1"],
        "owned": [],
        "gone": [],
    }
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


def _stored(broker: Any) -> dict[str, int]:
    """The broker's lite stats but the subscription tables' saving, which an earlier
    test's subscribe sets going on the broker's own schedule (``flush_interval_ms``)."""
    stats = ray.get(broker.lite_stats.remote())
    return {k: v for k, v in stats.items() if not k.startswith("subscription")}


def test_bad_names_and_the_quota_are_refused_clearly(broker: Any) -> None:
    before = _stored(broker)
    with pytest.raises(IllegalLiteTopicError, match="must be 1 to 128"):
        ray.get(broker.lite_send.remote("Sessions", [("ok-1", b"x"), ("bad name", b"y")]))
    left = 5 - len(ray.get(broker.lite_topics.remote("Sessions")))
    with pytest.raises(LiteTopicQuotaExceededError, match="quota of 5"):
        ray.get(broker.lite_send.remote("Sessions", [(f"q-{i}", b"z") for i in range(left + 1)]))
    assert _stored(broker) == before
    assert {"lite_topics", "lite_index_entries"} <= before.keys()


@pytest.mark.parametrize("data_path", ["socket", "ray"])
def test_the_python_clients_route_each_lite_topic_to_one_broker(
    cluster: actors.Cluster, data_path: str
) -> None:
    ns = cluster.namespace
    brokers = ("broker-a-0", "broker-b-0")
    with LiteProducer("Agents", namespace=ns, data_path=data_path) as producer:
        if data_path == "socket":  # each broker's socket opens on the first call
            producer.send_batch([(f"open-{k}", b"o") for k in range(8)])
            for b in brokers:
                wait_until(lambda b=b: producer.ns.data_path.is_open(b), what=f"{b}'s socket")
        agents = [f"agent-{data_path}-{k}" for k in range(6)]
        sent = producer.send_batch([(a, f"{a}:task{i}".encode()) for i in range(3) for a in agents])
        assert [s["offset"] for s in sent[:6]] == [0] * 6 and sent[-1]["offset"] == 2
        on = {
            n: set(ray.get(cluster.broker(n).lite_topics.remote("Agents")))
            for n in ("broker-a", "broker-b")
        }
        assert (on["broker-a"] | on["broker-b"]) & set(agents) == set(agents)
        assert not on["broker-a"] & on["broker-b"]  # each lite topic on one broker
        a0, a1, a4 = agents[0], agents[1], agents[4]
        on_socket = [producer.ns.data_path.is_open(b) for b in brokers]
    assert on_socket == [data_path == "socket"] * 2  # "ray" keeps every call on Ray
    group = f"workers-{data_path}"
    first = LiteConsumer(group, "Agents", namespace=ns, data_path=data_path)
    second = LiteConsumer(group, "Agents", namespace=ns, data_path=data_path)
    if data_path == "socket":  # the consumers' pool opens its own sockets
        for a in agents:  # on both brokers
            first.pull(a, 0)
        for b in brokers:
            wait_until(lambda b=b: first.ns.data_path.is_open(b), what=f"{b}'s socket")
    assert first.subscribe(*agents) == sorted(agents)
    assert second.subscribe(a0, a1) == []  # owned by the first
    got = {b.lite_topic: b for b in first.receive(100)}
    assert [m.body for m in got[a4].messages] == [f"{a4}:task{i}".encode() for i in range(3)]
    first.ack(got[a0])  # a0 done; a1 not acked
    with pytest.raises(PermissionDeniedError):  # the same type over either path
        second.ack(a1, 1)
    first.close()  # its lite topics pass to the second, from the group's offsets
    assert second.owned() == [a0, a1]
    again = {b.lite_topic: [m.body for m in b.messages] for b in second.receive(100)}
    assert again == {a1: [f"{a1}:task{i}".encode() for i in range(3)]}
    assert second.committed_offset(a0) == 3
    assert [m.body for m in second.pull(a4, 2).messages] == [f"{a4}:task2".encode()]
    assert second.pull(a4, 3).messages == []
    with (
        LiteProducer("Sessions", namespace=ns, data_path=data_path) as p,
        pytest.raises(LiteTopicQuotaExceededError),
    ):
        p.send_batch([(f"q-{data_path}-{i}", b"x") for i in range(20)])
    second.close()


def test_the_async_clients_send_receive_ack_and_resume_on_the_callers_loop(
    cluster: actors.Cluster,
) -> None:
    ns = cluster.namespace
    sessions = [f"aio-{k}" for k in range(4)]

    async def main() -> None:
        async with (
            AsyncLiteProducer("Agents", namespace=ns) as producer,
            AsyncLiteConsumer("aio-readers", "Agents", namespace=ns) as first,
            AsyncLiteConsumer("aio-readers", "Agents", namespace=ns) as second,
        ):
            sent = await producer.send_batch(
                [(s, f"{s}:{i}".encode()) for i in range(3) for s in sessions]
            )
            assert [r["offset"] for r in sent] == [0] * 4 + [1] * 4 + [2] * 4
            assert {r["status"] for r in sent} == {"PUT_OK"}
            one = await producer.send(sessions[0], b"last", tags="t")
            assert one["offset"] == 3
            # the same homes as the synchronous clients
            for s in sessions:
                home = await producer._home(s)
                assert s in ray.get(cluster.broker(home).lite_topics.remote("Agents"))
            assert await first.subscribe(*sessions) == sessions
            assert await second.subscribe(*sessions) == []
            got = {b.lite_topic: b for b in await first.receive(100)}
            assert [m.body for m in got[sessions[0]].messages] == [
                f"{sessions[0]}:{i}".encode() for i in range(3)
            ] + [b"last"]
            await first.ack(got[sessions[1]])
            await first.ack(sessions[2], 1)
            with pytest.raises(PermissionDeniedError):
                await second.ack(sessions[3], 1)
            await first.unsubscribe(*sessions)
            assert await second.owned() == sessions
            again = {b.lite_topic: [m.body for m in b.messages] for b in await second.receive(100)}
            assert sessions[1] not in again
            assert again[sessions[2]] == [f"{sessions[2]}:{i}".encode() for i in (1, 2)]
            assert await second.committed_offset(sessions[1]) == 3
            resumed = await second.pull(sessions[0], 2)
            assert [m.body for m in resumed.messages] == [f"{sessions[0]}:2".encode(), b"last"]
            assert resumed.next_offset == 4
        with pytest.raises(InvalidMessageError, match="closed"):
            await producer.send(sessions[0], b"x")

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_held_receive_and_pull_answer_at_the_send_and_empty_at_their_timeout(
    cluster: actors.Cluster,
) -> None:
    """Over the socket: a receive or pull that finds nothing waits at the broker (no
    polling) until a send to its lite topic, or answers empty when ``wait_s`` is up."""
    ns = cluster.namespace
    lite = "held-1"
    with (
        LiteProducer("Agents", namespace=ns) as producer,
        LiteConsumer("held", "Agents", namespace=ns) as consumer,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        assert consumer.subscribe(lite) == [lite]
        home = cluster.broker(home_broker(producer.ns.require_route("Agents"), "Agents", lite))
        for held_call in (
            lambda: consumer.receive(wait_s=30.0),
            lambda: consumer.pull(lite, 1, wait_s=30.0),
        ):
            before = ray.get(home.status.remote())["held_pulls"]
            answer = pool.submit(held_call)
            wait_until(
                lambda before=before: ray.get(home.status.remote())["held_pulls"] > before,
                what="the call held at the broker",
            )
            sent_at = time.monotonic()
            producer.send(lite, b"now")
            got: Any = answer.result(timeout=30)  # a receive's batches or a pull's answer
            latency = time.monotonic() - sent_at
            batch = got[0] if isinstance(got, list) else got
            assert batch.lite_topic == lite and [m.body for m in batch.messages] == [b"now"]
            assert latency < 1.0, latency  # woken by the send: far from wait_s
        consumer.ack(lite, 2)  # both sends consumed
        started = time.monotonic()
        assert consumer.receive(wait_s=0.3) == []
        assert consumer.pull(lite, 2, wait_s=0.3).messages == []
        assert time.monotonic() - started >= 0.55  # each waited its wait_s out
        with pytest.raises(InvalidMessageError, match="wait_s"):
            consumer.receive(wait_s=-1)


def test_a_held_receive_over_two_brokers_answers_when_one_has_messages(
    cluster: actors.Cluster,
) -> None:
    """A consumer whose lite topics live on two brokers: a held receive answers with the
    first broker's messages at its send, not once the other broker's hold is over; the
    other broker hands nothing out meanwhile."""
    ns = cluster.namespace
    with LiteProducer("Agents", namespace=ns) as producer:
        route = producer.ns.require_route("Agents")
    homes: dict[str, str] = {}
    for k in range(64):  # a lite topic on each broker
        homes.setdefault(home_broker(route, "Agents", f"spread-{k}"), f"spread-{k}")
    quiet, busy = homes["broker-a"], homes["broker-b"]
    held = {n: cluster.broker(n) for n in ("broker-a", "broker-b")}

    def holding() -> dict[str, int]:
        return {n: ray.get(h.status.remote())["held_pulls"] for n, h in held.items()}

    def held_on_both(before: dict[str, int]) -> bool:
        return all(v > before[n] for n, v in holding().items())

    with (
        LiteProducer("Agents", namespace=ns) as producer,
        LiteConsumer("spread", "Agents", namespace=ns) as consumer,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        assert consumer.subscribe(quiet, busy) == sorted([quiet, busy])
        before = holding()
        answer = pool.submit(consumer.receive, 32, 30.0)
        wait_until(lambda: held_on_both(before), what="the receive held on both brokers")
        sent_at = time.monotonic()
        producer.send(busy, b"first")
        got = answer.result(timeout=30)
        assert time.monotonic() - sent_at < 5.0  # not the quiet broker's 30 s
        assert [(b.lite_topic, [m.body for m in b.messages]) for b in got] == [(busy, [b"first"])]
        consumer.ack(got[0])
        producer.send(quiet, b"second")  # the quiet broker handed nothing out before
        assert [(b.lite_topic, b.offset) for b in consumer.receive(32, 30.0)] == [(quiet, 0)]

    async def from_asyncio() -> list[Any]:
        async with (
            AsyncLiteProducer("Agents", namespace=ns) as producer,
            AsyncLiteConsumer("spread-aio", "Agents", namespace=ns) as consumer,
        ):
            assert await consumer.subscribe(quiet, busy) == sorted([quiet, busy])
            for batch in await consumer.receive(32):
                await consumer.ack(batch)
            before = await asyncio.to_thread(holding)
            receiving = asyncio.ensure_future(consumer.receive(32, 30.0))
            await asyncio.to_thread(
                wait_until, lambda: held_on_both(before), what="the async receive held"
            )
            await producer.send(busy, b"third")
            return await asyncio.wait_for(receiving, 5.0)

    got = asyncio.run(from_asyncio())
    assert [(b.lite_topic, [m.body for m in b.messages]) for b in got] == [(busy, [b"third"])]


def test_an_expired_lite_topic_ends_its_subscriptions_and_a_resync_does_not_revive_it(
    cluster: actors.Cluster,
) -> None:
    ns = cluster.namespace
    with (
        LiteProducer("Short", namespace=ns) as producer,
        LiteConsumer("expiring", "Short", namespace=ns, resync_s=0.05) as consumer,
    ):
        assert consumer.subscribe("quiet", "busy") == ["busy", "quiet"]
        producer.send_batch([("quiet", b"q"), ("busy", b"b0")])
        homes = {n: home_broker(producer._route(), "Short", n) for n in ("quiet", "busy")}

        def on(name: str) -> Any:
            return cluster.broker(homes[name])

        def quiet_expired() -> bool:
            producer.send("busy", b"more")  # written all along: busy stays
            return "quiet" not in ray.get(on("quiet").lite_topics.remote("Short"))

        wait_until(quiet_expired, timeout_s=20, interval_s=0.2, what="quiet expired")
        view = ray.get(
            on("quiet").lite_subscribe.remote("expiring", "Short", consumer.client_id, [])
        )
        assert "quiet" not in view["subscribed"]  # its subscription ended with it
        consumer.receive(10)  # the resync (due at once) keeps busy, learns quiet is gone
        assert consumer.subscription() == ["busy"]
        consumer.receive(10)
        assert "quiet" not in ray.get(on("quiet").lite_topics.remote("Short"))  # not revived
        assert "busy" in ray.get(on("busy").lite_topics.remote("Short"))


def test_a_lite_send_over_the_socket_is_answered_at_once_and_stores_the_same_records(
    cluster: actors.Cluster,
) -> None:
    """An ASYNC_FLUSH master stores a lite send that comes over its socket and answers it
    from the socket's reader (no task per request), single sends and batches alike: the
    same answer, and records of the same fields and properties in the same order as the
    same send through Ray (the general path) stores."""
    ns = cluster.namespace
    broker = cluster.broker("broker-a")
    with LiteProducer("Agents", namespace=ns) as producer:
        route = producer.ns.require_route("Agents")
        on_a = [
            n
            for n in (f"same-{k:02d}" for k in range(64))
            if home_broker(route, "Agents", n) == "broker-a"
        ]
        warm = on_a[0]
        producer.send(warm, b"opens the socket")
        wait_until(lambda: producer.ns.data_path.is_open("broker-a-0"), what="broker-a's socket")
        producer.send(warm, b"on the socket")
        opts = {"tags": "TagA", "keys": ["k1", "k2"], "properties": {"trace": "on"}}

        def items(first: str, second: str) -> list[Any]:
            return [
                (first, b"b0"),
                (second, b"b1", opts),
                (first, b"b2", {"tags": "TagB", "keys": "k3", "properties": None}),
                (second, b"b3"),
            ]

        by_socket, by_ray = on_a[1:3], on_a[3:5]
        before = ray.get(broker.status.remote())["data_answered_at_once"]
        sent_socket = [
            producer.send(by_socket[0], b"s0"),
            producer.send(
                by_socket[1], b"s1", tags="TagA", keys=["k1", "k2"], properties={"trace": "on"}
            ),
            *producer.send_batch(items(*by_socket)),
        ]
        after = ray.get(broker.status.remote())["data_answered_at_once"]
        assert after - before == 3  # two single sends and one batch, none as a task
    sent_ray = [
        *ray.get(broker.lite_send.remote("Agents", [(by_ray[0], b"s0")])),
        *ray.get(broker.lite_send.remote("Agents", [(by_ray[1], b"s1", opts)])),
        *ray.get(broker.lite_send.remote("Agents", items(*by_ray))),
    ]

    def shape(answers: list[dict[str, Any]], names: list[str]) -> list[tuple[Any, ...]]:
        rename = dict(zip(names, ("first", "second")))
        return [
            (sorted(a), rename[a["lite_topic"]], a["offset"], a["status"], len(a["msg_id"]))
            for a in answers
        ]

    assert shape(sent_socket, by_socket) == shape(sent_ray, by_ray)
    assert [a["offset"] for a in sent_socket] == [0, 0, 1, 1, 2, 2]

    def records(name: str) -> list[tuple[Any, ...]]:
        got = ray.get(broker.lite_pull.remote("Agents", name, 0, 32))["messages"]
        out = []
        for m in got:
            props = dict(m.properties)
            assert len(props.pop("UNIQ_KEY")) == 32 and props.pop("__LITE_TOPIC") == name
            out.append((m.topic, m.body, m.tags, m.keys, props, m.flag, m.sys_flag, m.store_size))
        return out

    for mine, theirs in zip(by_socket, by_ray):
        assert records(mine) == records(theirs) and len(records(mine)) == 3
        # a single send's record is a batch's: all but the body alike
        single, in_batch = records(mine)[:2]
        assert single[2:] == in_batch[2:]
    assert [r[1] for r in records(by_socket[0])] == [b"s0", b"b0", b"b2"]
    props = {"TAGS": "TagA", "KEYS": "k1 k2", "trace": "on"}
    assert records(by_socket[1])[0][2:5] == ("TagA", ("k1", "k2"), props)
