"""Producers and pull consumers against a real 2-NameServer, 2-broker cluster."""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
from raymq_testkit import CHURN, SMALL_STORE, drain, unique_namespace, wait_until

import actors
from actors import PullStatus, protocol
from rebalance import MessageQueue
from storage import Message, encode_batch
from storage.errors import InvalidMessageError


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    ns = unique_namespace("e2e")
    c = actors.start_cluster(
        namespace=ns,
        nameservers=2,
        brokers=2,
        store_root=str(tmp_path_factory.mktemp("e2e")),
        broker_options={"store": SMALL_STORE, "heartbeat_interval_s": 2.0},
        topics=[actors.TopicConfig("Orders", 4, 4)],
    )
    yield c
    c.shutdown()


def test_actors_are_named_and_detached(cluster: actors.Cluster) -> None:
    names = cluster.actor_names()
    # both brokers pinned to this node: no keeper (it could never move them)
    assert names == ["broker-a-0", "broker-b-0", "nameserver-0", "nameserver-1"]
    handle = ray.get_actor("broker-b-0", namespace=cluster.namespace)
    assert ray.get(handle.status.remote())["broker_name"] == "broker-b"
    again = actors.connect(cluster.namespace)
    assert again.nameserver_names == ["nameserver-0", "nameserver-1"]
    route = again.admin.topic_route("Orders")
    assert sorted(q.broker_name for q in route.queue_datas) == ["broker-a", "broker-b"]


def test_brokers_answer_a_pull_of_4_x_256_records_inline(cluster: actors.Cluster) -> None:
    # Ray's default cut for an inline reply is 100 KiB: a pull of 4 queues x 256
    # records of 100 B (~250 KB) would go through the object store (~1 ms a call more)
    def inline_limit(_: Any) -> int:
        return int(os.environ.get("RAY_max_direct_call_object_size", 100 << 10))  # noqa: SIM112

    for name in ("broker-a", "broker-b"):
        assert ray.get(cluster.broker(name).__ray_call__.remote(inline_limit)) >= 256 << 10


def test_brokers_keep_their_startup_objects_out_of_the_collectors_walks(
    cluster: actors.Cluster,
) -> None:
    """A broker froze what it held once started (Ray, RayMQ, its store's state), so a full
    collection walks only what came since, not the ~90,000 objects of its start."""

    def collector(_: Any) -> tuple[int, int]:
        import gc

        return gc.get_freeze_count(), len(gc.get_objects())

    for name in ("broker-a", "broker-b"):
        frozen, walked = ray.get(cluster.broker(name).__ray_call__.remote(collector))
        assert frozen > 20_000 and walked < frozen // 2, (frozen, walked)


def test_every_message_comes_back_once_in_queue_order(cluster: actors.Cluster) -> None:
    producer = cluster.producer("p-e2e", max_batch_messages=128)
    n = 6000
    msgs = [Message("Orders", b"order-%06d" % i, tags="A", keys=f"k{i}") for i in range(n)]
    result = producer.send_batch(msgs)
    assert len(result) == n
    assert {mq.broker_name for mq, _, _ in result.queues} == {"broker-a", "broker-b"}
    sent_ids = [r.msg_id for r in result]
    assert len(set(sent_ids)) == n
    got = drain(cluster.pull_consumer("c-e2e"), "Orders")
    seen: list[str] = []
    for mq, messages in got.items():
        offsets = [m.queue_offset for m in messages]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), mq
        seqs = [int(m.body[6:]) for m in messages]
        assert seqs == sorted(seqs), f"{mq} out of send order"
        assert all(m.queue_id == mq.queue_id and m.topic == "Orders" for m in messages)
        seen.extend(m.msg_id for m in messages)
    assert sorted(seen) == sorted(sent_ids)
    some = cluster.pull_consumer("c-e2e").pull(next(iter(got)), 0, 100)
    assert some.bodies == [m.body for m in some.messages]
    # the per-message results point at the stored messages
    first = result[0]
    stored = cluster.admin.query_by_id(first.offset_msg_id)
    assert stored.body == b"order-000000" and stored.queue_offset == first.queue_offset


def test_the_plain_and_the_packed_pull_answer_alike(cluster: actors.Cluster) -> None:
    # consumers call pull_packed; pull keeps plain arguments (one queue) for handle callers
    cluster.admin.create_topic("Alike", 2, 2)
    producer = cluster.producer("p-alike")
    for i in range(40):  # round robin: 10 in each of the 4 queues (2 per broker)
        producer.send(Message("Alike", b"%d" % i))
    broker = cluster.broker("broker-a")
    requests = [("Alike", 0, 0), ("Alike", 1, 3)]

    def plain_pulls(queues: list[tuple[str, int, int]], max_count: int) -> list[Any]:
        """Each queue's ``pull``, with plain arguments."""
        calls = [broker.pull.remote("g-alike", *q, max_count, None, 0.0, "c1") for q in queues]
        return ray.get(calls)

    plain = plain_pulls(requests, 8)
    packed = protocol.pulls_from_wire(
        ray.get(
            broker.pull_packed.remote(
                protocol.pull_request_to_wire("g-alike", requests, 8, None, 0.0, "c1")
            )
        )
    )

    def fields(raw: Any) -> tuple[Any, ...]:
        sizes = None if raw.sizes is None else raw.sizes.tolist()
        return (raw.status, raw.data, raw.count, raw.next_offset, raw.max_offset, sizes)

    assert [fields(protocol.pull_from_wire(w)) for w in plain] == list(map(fields, packed))
    assert [raw.count for raw in packed] == [8, 7]  # max 8; 10 - 3 from offset 3

    # an answer past OUT_OF_BAND_BYTES comes unjoined: its records as uint8 arrays
    body = b"x" * 300
    ray.get(
        broker.send.remote(encode_batch([Message("Alike", body, queue_id=0)] * 1200).to_bytes())
    )
    big_requests = [("Alike", 0, 0), ("Alike", 1, 0), ("Alike", 0, 10**6)]
    request = protocol.pull_request_to_wire("g-alike", big_requests, 2000, None, 0.0, "c1")
    wire = ray.get(broker.pull_packed.remote(request))
    assert isinstance(wire, list) and isinstance(wire[0], bytes)
    assert [type(part) for part in wire[1:]] == [np.ndarray] * 3
    assert sum(map(len, wire)) >= protocol.OUT_OF_BAND_BYTES
    big = protocol.pulls_from_wire(wire)
    plain_big = plain_pulls(big_requests, 2000)
    assert [fields(protocol.pull_from_wire(w)) for w in plain_big] == list(map(fields, big))
    assert all(isinstance(raw.data, bytes) for raw in big)
    assert [raw.count for raw in big] == [1210, 10, 0]
    with pytest.raises(InvalidMessageError, match="record parts"):
        protocol.pulls_from_wire(wire[:-1])
    with pytest.raises(InvalidMessageError, match="bytes of records"):
        protocol.pulls_from_wire([wire[0], wire[1][:-1], *wire[2:]])
    joined = b"".join([wire[0], *(part.tobytes() for part in wire[1:])])
    assert list(map(fields, protocol.pulls_from_wire(joined))) == list(map(fields, big))
    with pytest.raises(InvalidMessageError, match="bytes of records"):
        protocol.pulls_from_wire(joined[:-1])


def test_a_broker_keeps_the_memory_it_frees(cluster: actors.Cluster) -> None:
    # a pull of 4 x 4096 records allocates and frees ~10 MB; glibc would give it back
    # and fault it in again on the next pull (actors/broker/memory.py, tests/actors/test_malloc.py)
    def churn(_: Any, source: str = CHURN) -> list[int]:  # defined here, sent by value
        namespace: dict[str, Any] = {}
        exec(source, namespace)
        return namespace["churn"]()  # type: ignore[no-any-return]

    faults = ray.get(cluster.broker("broker-a").__ray_call__.remote(churn))
    assert faults[0] > 0 and max(faults[1:]) < 100, faults


def test_tags_are_filtered_exactly(cluster: actors.Cluster) -> None:
    producer = cluster.producer("p-tags")
    tags = ["TagA", "TagB", "TagC", None]
    producer.send_batch([Message("Tagged", b"m%d" % i, tags=tags[i % 4]) for i in range(400)])
    consumer = cluster.pull_consumer("c-tags")
    got = drain(consumer, "Tagged", tags="TagA || TagC", batch=64)
    bodies = sorted(int(m.body[1:]) for msgs in got.values() for m in msgs)
    assert bodies == [i for i in range(400) if i % 4 in (0, 2)]
    assert all(m.tags in ("TagA", "TagC") for msgs in got.values() for m in msgs)
    mq = next(iter(got))
    none = consumer.pull(mq, 0, 1000, tags="NoSuchTag")
    assert none.status is PullStatus.NO_MATCHED_MSG and not none.messages
    assert none.next_offset == none.max_offset


def test_offsets_survive_a_consumer_restart(cluster: actors.Cluster) -> None:
    producer = cluster.producer("p-off")
    producer.send_batch([Message("Offsets", b"x%d" % i) for i in range(50)])
    first = cluster.pull_consumer("g-off")
    queues = first.fetch_subscribe_queues("Offsets")
    results = first.pull_many([(q, 0) for q in queues], 10)
    first.commit_offsets({r.queue: r.next_offset for r in results})
    expected = {r.queue: r.next_offset for r in results}
    first.close()
    second = cluster.pull_consumer("g-off")
    assert second.fetch_offsets("Offsets") == expected
    assert all(second.fetch_offset(q) == expected[q] for q in queues)
    other = cluster.pull_consumer("g-other")
    assert set(other.fetch_offsets("Offsets").values()) == {-1}
    assert second.client_id != first.client_id
    assert first.client_id in cluster.admin.consumer_list("g-off")


def test_long_poll_is_answered_when_a_message_arrives(cluster: actors.Cluster) -> None:
    cluster.admin.create_topic("Poll", 1, 1)
    consumer = cluster.pull_consumer("g-poll")
    mq = consumer.fetch_subscribe_queues("Poll")[0]
    start = consumer.max_offset(mq)
    box: dict[str, Any] = {}

    def pull() -> None:
        t = time.monotonic()
        box["result"] = consumer.pull(mq, start, 10, long_poll_s=20.0)
        box["took"] = time.monotonic() - t

    thread = threading.Thread(target=pull)
    thread.start()
    broker = cluster.broker(mq.broker_name)
    wait_until(lambda: ray.get(broker.status.remote())["held_pulls"] >= 1, what="a held pull")
    cluster.producer("p-poll").send(Message("Poll", b"wake up"))
    thread.join(20)
    assert box["result"].status is PullStatus.FOUND
    assert [m.body for m in box["result"].messages] == [b"wake up"]
    assert box["took"] < 10.0
    # nothing new: held for the time asked, then NO_NEW_MSG
    t = time.monotonic()
    empty = consumer.pull(mq, start + 1, 10, long_poll_s=0.3)
    assert empty.status is PullStatus.NO_NEW_MSG and time.monotonic() - t >= 0.25


def test_pull_many_is_one_call_per_broker_and_long_polls_any_queue(
    cluster: actors.Cluster,
) -> None:
    cluster.admin.create_topic("PollMany", 4, 4)
    consumer = cluster.pull_consumer("g-poll-many")
    queues = consumer.fetch_subscribe_queues("PollMany")
    assert len({mq.broker_name for mq in queues}) == 2 and len(queues) == 8
    starts = {mq: consumer.max_offset(mq) for mq in queues}
    brokers = {name: cluster.broker(name) for name in {mq.broker_name for mq in queues}}
    before = {n: ray.get(b.status.remote())["pulls"] for n, b in brokers.items()}
    results = consumer.pull_many(list(starts.items()), 10)
    assert [r.queue for r in results] == queues  # answers in the order asked
    assert all(r.status is PullStatus.NO_NEW_MSG for r in results)
    after = {n: ray.get(b.status.remote())["pulls"] for n, b in brokers.items()}
    assert all(after[n] - before[n] == 1 for n in brokers)  # one call per broker
    # held while every queue of the broker is empty; a message on any one answers the call
    name = queues[0].broker_name
    mine = {mq: off for mq, off in starts.items() if mq.broker_name == name}
    box: dict[str, Any] = {}

    def pull() -> None:
        box["results"] = consumer.pull_many(list(mine.items()), 10, long_poll_s=20.0)

    thread = threading.Thread(target=pull)
    thread.start()
    wait_until(lambda: ray.get(brokers[name].status.remote())["held_pulls"] >= 4, what="held")
    producer = cluster.producer("p-poll-many")
    while (sent := producer.send(Message("PollMany", b"any"))).message_queue.broker_name != name:
        pass  # round robin: the next queue may be the other broker's
    thread.join(20)
    found = [r for r in box["results"] if r.status is PullStatus.FOUND]
    assert [(r.queue, [m.body for m in r.messages]) for r in found] == [
        (sent.message_queue, [b"any"])
    ]


def test_async_pulls_read_one_ahead_and_answer_as_sync_pulls_do(cluster: actors.Cluster) -> None:
    cluster.admin.create_topic("Ahead", 4, 4)
    producer = cluster.producer("p-ahead")
    producer.send_batch([Message("Ahead", b"%d" % i) for i in range(3000)])
    consumer = cluster.pull_consumer("g-ahead")
    queues = consumer.fetch_subscribe_queues("Ahead")
    got: dict[MessageQueue, list[bytes]] = defaultdict(list)
    ahead = consumer.pull_many_async([(mq, 0) for mq in queues], 100)
    while ahead is not None:
        results = ahead.result(30)
        found = [r for r in results if r.status is PullStatus.FOUND]
        # the next pull is on its way before these answers are read
        ahead = consumer.pull_many_async([(r.queue, r.next_offset) for r in found], 100)
        ahead = ahead if found else None
        for r in found:
            got[r.queue].extend(r.bodies)
    expected = {mq: [m.body for m in msgs] for mq, msgs in drain(consumer, "Ahead").items()}
    assert dict(got) == expected and sum(map(len, got.values())) == 3000

    # a bad argument is refused before anything is sent; a broker's refusal comes back as itself
    with pytest.raises(InvalidMessageError, match="max_count"):
        consumer.pull_many_async([(queues[0], 0)], 0)
    bad = MessageQueue("Ahead", queues[0].broker_name, 99)
    with pytest.raises(InvalidMessageError, match="read_queue_nums"):
        consumer.pull_async(bad, 0, 10).result(30)

    # a long-polled async pull stays out while held and is answered by the next message
    mq = queues[0]
    end = consumer.max_offset(mq)
    held = consumer.pull_async(mq, end, 10, long_poll_s=20.0)
    broker = cluster.broker(mq.broker_name)
    wait_until(lambda: ray.get(broker.status.remote())["held_pulls"] >= 1, what="a held pull")
    assert not held.done()
    while producer.send(Message("Ahead", b"wake")).message_queue != mq:
        pass  # round robin: the message for the held queue comes within one turn
    answer = held.result(20)
    assert answer.status is PullStatus.FOUND and answer.bodies == [b"wake"]
    consumer.close()


def test_a_large_pull_is_copied_out_of_the_object_store_only_when_read(
    cluster: actors.Cluster,
) -> None:
    cluster.admin.create_topic("Lazy", 1, 1)
    cluster.producer("p-lazy").send_batch(
        [Message("Lazy", b"%04d" % i + bytes(296), tags="T") for i in range(1200)],
        sharding_key="one queue",
    )
    consumer = cluster.pull_consumer("g-lazy", data_path="ray")  # what Ray's path does
    mq = next(q for q in consumer.fetch_subscribe_queues("Lazy") if consumer.max_offset(q))
    bodies = [b"%04d" % i + bytes(296) for i in range(1200)]
    first = consumer.pull(mq, 0, 2000)  # ~440 KB: past OUT_OF_BAND_BYTES
    assert first.count == 1200 and isinstance(first._data, memoryview)  # still Ray's
    copied = pickle.loads(pickle.dumps(consumer.pull(mq, 0, 2000)))  # a view doesn't pickle
    assert copied.bodies == bodies and copied.next_offset == 1200
    assert first.bodies == bodies and isinstance(first._data, memoryview)  # cut from there
    assert isinstance(first.data, bytes) and first._data is first.data  # one copy, kept
    second = consumer.pull(mq, 0, 2000)
    assert [m.body for m in second.messages] == bodies and isinstance(second.data, bytes)
    assert second.data == first.data and all(m.tags == "T" for m in second.messages)
    small = consumer.pull(mq, 0, 10)
    assert isinstance(small._data, bytes) and small.bodies == bodies[:10]
    consumer.close()


def test_send_async_oneway_and_single(cluster: actors.Cluster) -> None:
    producer = cluster.producer("p-async")
    one = producer.send(Message("Async", b"single", keys="only-key"))
    assert one.status is actors.SendStatus.SEND_OK
    future = producer.send_async([Message("Async", b"a%d" % i) for i in range(300)])
    single = producer.send_async(Message("Async", b"one more"))
    batch = future.result(timeout=30)
    assert len(batch) == 300 and single.result(timeout=30).queue_offset >= 0
    producer.send_oneway([Message("Async", b"fire%d" % i) for i in range(10)])
    admin = cluster.admin

    def total() -> int:
        return sum(r["max_offset"] for r in admin.topic_status("Async"))

    wait_until(lambda: total() == 312, what="oneway messages stored")
    found = admin.query_by_key("Async", "only-key")
    assert [m.body for m in found] == [b"single"]


def test_same_sharding_key_same_queue(cluster: actors.Cluster) -> None:
    producer = cluster.producer("p-order")
    queues = {}
    for key in ("order-1", "order-2", "order-3"):
        sent = [
            producer.send(Message("Orders", b"%s-%d" % (key.encode(), i)), sharding_key=key)
            for i in range(5)
        ]
        assert len({r.message_queue for r in sent}) == 1
        offsets = [r.queue_offset for r in sent]
        assert offsets == sorted(offsets)
        queues[key] = sent[0].message_queue
    again = producer.send(Message("Orders", b"again"), sharding_key="order-2")
    assert again.message_queue == queues["order-2"]


def test_auto_created_topic_gets_the_producers_queue_count(cluster: actors.Cluster) -> None:
    producer = cluster.producer("p-auto", default_topic_queue_nums=2)
    producer.send_batch([Message("AutoMade", b"x%d" % i) for i in range(40)], timeout_s=10)
    route = wait_until(lambda: cluster.admin.ns.route("AutoMade", refresh=True), what="route")
    assert all(q.write_queue_nums <= 2 for q in route.queue_datas)
    assert "AutoMade" in cluster.admin.list_topics()
    total = sum(r["max_offset"] for r in cluster.admin.topic_status("AutoMade"))
    assert total == 40


def test_admin_status_lag_reset_and_update(cluster: actors.Cluster) -> None:
    admin = cluster.admin
    admin.create_topic("Lag", 2, 2)
    before_ms = int(time.time() * 1000)
    cluster.producer("p-lag").send_batch([Message("Lag", b"l%d" % i) for i in range(20)])
    consumer = cluster.pull_consumer("g-lag")
    queues = consumer.fetch_subscribe_queues("Lag")
    consumer.commit_offsets({q: 0 for q in queues})
    rows = admin.consumer_lag("g-lag", "Lag")
    assert len(rows) == 4 and sum(r["lag"] for r in rows) == 20
    reset = admin.reset_offset("g-lag", "Lag", int(time.time() * 1000) + 60_000)
    assert sum(reset.values()) == 20
    assert sum(r["lag"] for r in admin.consumer_lag("g-lag")) == 0
    reset = admin.reset_offset("g-lag", "Lag", before_ms)
    assert set(reset.values()) == {0}
    status = admin.topic_status("Lag")
    assert {(r["broker"], r["queue_id"]) for r in status} == {
        ("broker-a", 0),
        ("broker-a", 1),
        ("broker-b", 0),
        ("broker-b", 1),
    }
    assert all(r["last_update_ms"] >= before_ms for r in status if r["max_offset"])
    updated = admin.update_topic("Lag", perm=4)
    assert {tc.perm for tc in updated.values()} == {4}
    cs = admin.cluster_status()
    assert [b["broker_name"] for b in cs["brokers"]] == ["broker-a", "broker-b"]
    assert all(n["alive"] for n in cs["nameservers"])
    assert all(b["role"] == "MASTER" and b["disk_total"] > 0 for b in cs["brokers"])
    assert admin.delete_topic("Lag") == ["broker-a", "broker-b"]
    assert "Lag" not in admin.list_topics()
