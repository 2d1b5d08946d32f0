"""The idempotent producer: a send stored once whatever happens to its answer.

Real brokers (over their sockets and over Ray), real stores; the faults are injected
into the live broker (``actors.broker.faults``): the batch is stored, then the
answer is lost, or the broker's process exits before answering.
"""

from __future__ import annotations

import collections
import dataclasses
import socket
import struct
import threading
from typing import Any

import msgpack
import numpy as np
import pytest
import ray
from raymq_ha_testkit import RAFT, kill, members, read_all, status_of
from raymq_testkit import PUSH_FAST, wait_until

import actors
from actors import BrokerSpec, SendStatus
from actors.protocol import frames
from storage import Message, codec
from storage.errors import (
    DuplicateSequenceError,
    InvalidMessageError,
    OutOfOrderSequenceError,
    ProducerFencedError,
)


def once_each(bodies: list[bytes]) -> dict[bytes, int]:
    """The bodies stored more than once (empty when every one is there once)."""
    return {b: n for b, n in collections.Counter(bodies).items() if n != 1}


def check_results_name_the_stored_copy(cluster: actors.Cluster, results: Any, body: bytes) -> None:
    for r in results:
        assert r.status is SendStatus.SEND_OK
        assert cluster.admin.query_by_id(r.offset_msg_id).body == body


@pytest.mark.parametrize("data_path", ["socket", "ray"])
def test_sends_whose_answers_are_lost_are_stored_once(
    one_broker: actors.Cluster, data_path: str
) -> None:
    cluster, topic = one_broker, f"Lost-{data_path}"
    cluster.admin.create_topic(topic, 4, 4)
    broker = cluster.broker("broker-a")
    put_before = ray.get(broker.status.remote())["put_msgs"]
    producer = cluster.producer(f"p-lost-{data_path}", data_path=data_path)
    producer.send(Message(topic, b"warm-up"))  # the producer id, the route, the socket
    ray.get(broker.inject_fault.remote("drop_answer", 3))
    single = [producer.send(Message(topic, b"single-%d" % i)) for i in range(5)]
    for i, r in enumerate(single):
        check_results_name_the_stored_copy(cluster, [r], b"single-%d" % i)
    ray.get(broker.inject_fault.remote("drop_answer", 2))
    batch = producer.send_batch([Message(topic, b"batch-%03d" % i) for i in range(300)])
    assert {r.status for r in batch} == {SendStatus.SEND_OK}
    ray.get(broker.inject_fault.remote("drop_answer", 4))
    futures = [producer.send_async(Message(topic, b"async-%03d" % i)) for i in range(200)]
    futures += [
        producer.send_async([Message(topic, b"alist-%d-%d" % (i, j)) for j in range(5)])
        for i in range(20)
    ]
    for f in futures:
        f.result(timeout=60)
    ordered = [
        producer.send(Message(topic, b"ordered-%d" % i), sharding_key="order-1") for i in range(5)
    ]
    assert len({r.message_queue for r in ordered}) == 1
    got = read_all(cluster.pull_consumer(f"g-lost-{data_path}"), topic)
    assert once_each(got) == {}
    assert len(got) == 1 + 5 + 300 + 200 + 100 + 5
    put = ray.get(broker.status.remote())["put_msgs"] - put_before
    assert put < len(got) + 100  # retries were sent
    producer.close()


def test_a_broker_that_crashes_after_storing_is_retried_after_its_restart(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(
        nameservers=1,
        brokers=1,
        topics=[actors.TopicConfig("Crash", 2, 2)],
        broker_options={"store": {"flush_disk_type": "SYNC_FLUSH"}},
    )
    broker = cluster.broker("broker-a")
    producer = cluster.producer("p-crash", delivery_timeout_s=90.0)
    producer.send(Message("Crash", b"warm-up"))
    ray.get(broker.inject_fault.remote("crash_after_store", 1))
    # stored, then the broker's process is gone before it answers; Ray restarts it, its
    # store recovers the producer's sequences, and the retry is answered from them
    results = producer.send_batch([Message("Crash", b"c-%d" % i) for i in range(10)])
    assert [cluster.admin.query_by_id(r.offset_msg_id).body for r in results] == [
        b"c-%d" % i for i in range(10)
    ]
    got = read_all(cluster.pull_consumer("g-crash"), "Crash")
    assert once_each(got) == {} and len(got) == 11
    producer.close()


def test_a_retry_after_the_leader_dies_lands_on_the_new_leader_and_is_stored_once(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(
        nameservers=1,
        brokers=[BrokerSpec("broker-a", i) for i in range(3)],
        topics=[actors.TopicConfig("Elect", 2, 2)],
        broker_options=RAFT,
    )
    old = wait_until(lambda: members(cluster, "broker-a").get(0), timeout_s=30, what="a leader")
    producer = cluster.producer("p-elect", delivery_timeout_s=60.0)
    producer.send(Message("Elect", b"warm-up"))
    leader = ray.get_actor(old, namespace=cluster.namespace)
    # the batch is committed on a majority, then the leader's process exits unanswered
    ray.get(leader.inject_fault.remote("crash_after_store", 1))
    results = producer.send_batch([Message("Elect", b"e-%d" % i) for i in range(20)])
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    assert members(cluster, "broker-a").get(0) != old  # answered by another leader
    got = read_all(cluster.pull_consumer("g-elect"), "Elect")
    assert once_each(got) == {} and len(got) == 21
    producer.close()


def test_a_broker_refuses_gaps_old_epochs_and_answers_repeats_from_the_record(
    one_broker: actors.Cluster,
) -> None:
    cluster = one_broker
    cluster.admin.create_topic("Hand", 2, 2)
    broker = cluster.broker("broker-a")
    pid = ray.get(broker.allocate_producer_id.remote())
    assert pid.startswith("broker-a-0:") and pid != ray.get(broker.allocate_producer_id.remote())

    def send(seq: int, n: int = 2, epoch: int = 0) -> Any:
        batch = codec.encode_batch([Message("Hand", b"h%d" % (seq + i)) for i in range(n)])
        blob = batch.with_queue(0).with_sequence(pid, epoch, seq).to_bytes()
        return ray.get(broker.send.remote(blob))

    first = send(0)
    assert send(0) == first  # the same answer, not written again
    with pytest.raises(OutOfOrderSequenceError):
        send(5)
    send(2)
    with pytest.raises(DuplicateSequenceError):
        send(1, 1)
    send(0, 1, epoch=1)
    with pytest.raises(ProducerFencedError):
        send(4, 2, epoch=0)
    consumer = cluster.pull_consumer("g-hand")
    assert read_all(consumer, "Hand") == [b"h0", b"h1", b"h2", b"h3", b"h0"]


def _frame(sock: socket.socket) -> dict[str, Any]:
    """The header of the next frame on a raw data-path socket (its body read past)."""
    buf = b""
    while len(buf) < 8 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
        chunk = sock.recv(65536)
        assert chunk, "the broker closed the connection"
        buf += chunk
    hlen = struct.unpack(">I", buf[4:8])[0]
    header: dict[str, Any] = msgpack.unpackb(buf[8 : 8 + hlen])
    return header


def test_a_batch_whose_marks_differ_from_its_header_is_a_bad_request_on_every_path(
    one_broker: actors.Cluster,
) -> None:
    """A batch whose PRODUCER_SEQ (what recovery and slaves rebuild the producer table
    from) differs from its header (what the put de-duplicates by), or a plain batch
    carrying one, is refused where the broker parses it: over its socket as a bad
    request, the connection serving on, and over Ray. Nothing of it is stored."""
    cluster = one_broker
    cluster.admin.create_topic("Marks", 1, 1)
    broker = cluster.broker("broker-a")
    pid = ray.get(broker.allocate_producer_id.remote())
    batch = codec.encode_batch([Message("Marks", b"m%d" % i) for i in range(3)]).with_queue(0)
    good = batch.with_sequence(pid, 0, 0)  # marked "pid,0,0,3"
    # the header says sequence 3 (a new run to the master), the mark 0 (a retry to a
    # promoted slave); and a mark planted on a batch that numbers nothing
    header_differs = dataclasses.replace(good, seq_runs=np.array([[0, 3]]), checked=False)
    planted = dataclasses.replace(good, producer_id=None, seq_runs=None, checked=False)
    bad = [header_differs.to_bytes(), planted.to_bytes()]

    info = ray.get(broker.data_path.remote())
    host, port = info["addr"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        hello = _frame(sock)
        mine = frames.nonce()
        proof = frames.proof(info["secret"], b"client", hello["n"], mine)
        sock.sendall(b"".join(frames.encode({"c": int(frames.Code.AUTH), "n": mine, "p": proof})))
        assert _frame(sock)["c"] == frames.Code.OK
        for opaque, blob in enumerate([*bad, good.to_bytes()]):
            sock.sendall(b"".join(frames.encode({"c": int(frames.Code.SEND), "o": opaque}, [blob])))
            answer = _frame(sock)
            assert answer["o"] == opaque
            if opaque < len(bad):
                assert (answer["c"], answer["e"]) == (frames.Code.ERROR, "InvalidMessageError")
                assert "PRODUCER_SEQ" in answer["m"]
            else:  # the same connection stores the good batch
                assert answer["c"] == frames.Code.OK
    for blob in bad:
        with pytest.raises(InvalidMessageError, match="PRODUCER_SEQ"):
            ray.get(broker.send.remote(blob))
    assert read_all(cluster.pull_consumer("g-marks"), "Marks") == [b"m0", b"m1", b"m2"]


def test_without_idempotence_a_retry_stores_twice(one_broker: actors.Cluster) -> None:
    """What idempotence removes (RocketMQ's at-least-once): the lost answer's retry."""
    cluster = one_broker
    cluster.admin.create_topic("Twice", 1, 1)
    producer = cluster.producer("p-twice", enable_idempotence=False)
    producer.send(Message("Twice", b"warm-up"))
    ray.get(cluster.broker("broker-a").inject_fault.remote("drop_answer", 1))
    producer.send(Message("Twice", b"once?"))
    assert read_all(cluster.pull_consumer("g-twice"), "Twice").count(b"once?") == 2


def test_a_push_consumer_with_a_dedup_window_drops_a_redelivered_id(
    one_broker: actors.Cluster,
) -> None:
    """A message stored twice under one id (a producer without idempotence, its answer
    lost): every delivery path shows the id; dedup_window_s hands the copy to
    "consumed" without calling the listener, a consumer without it sees both."""
    cluster = one_broker
    cluster.admin.create_topic("Redo", 1, 1)
    producer = cluster.producer("p-redo", enable_idempotence=False)
    ray.get(cluster.broker("broker-a").inject_fault.remote("drop_answer", 1))
    sent = producer.send(Message("Redo", b"twice"))
    producer.send_batch([Message("Redo", b"after-%d" % i) for i in range(3)])
    pulled = cluster.pull_consumer("g-redo-pull").pull(
        cluster.pull_consumer("g-redo-pull").fetch_subscribe_queues("Redo")[0], 0, 10
    )
    assert [m.msg_id for m in pulled.messages if m.body == b"twice"] == [sent.msg_id] * 2

    seen: dict[str, list[tuple[bytes, str]]] = {"dedup": [], "plain": []}

    def recorder(name: str) -> Any:
        def listener(messages: list[Any]) -> actors.ConsumeStatus:
            seen[name].extend((m.body, m.msg_id) for m in messages)
            return actors.ConsumeStatus.SUCCESS

        return listener

    consumers = {
        name: actors.PushConsumer(
            f"g-redo-{name}",
            "Redo",
            listener=recorder(name),
            namespace=cluster.namespace,
            consume_from="FIRST",
            consume_threads=1,  # in queue order: the copy comes after the first is acked
            **PUSH_FAST,
            **({"dedup_window_s": 60.0} if name == "dedup" else {}),
        ).start()
        for name in seen
    }
    try:
        for consumer in consumers.values():
            wait_until(lambda c=consumer: c.status().get("consumed", 0) >= 5, what="all consumed")
        assert [b for b, _ in seen["plain"]].count(b"twice") == 2
        assert [b for b, _ in seen["dedup"]].count(b"twice") == 1
        assert (b"twice", sent.msg_id) in seen["dedup"]
        assert consumers["dedup"].status()["deduplicated"] == 1
    finally:
        for consumer in consumers.values():
            consumer.shutdown()


def test_a_retry_after_the_master_stops_answering_lands_on_the_promoted_slave(
    make_cluster: Any,
) -> None:
    """SYNC_MASTER: the batch is stored and replicated, the master never answers; the
    operator promotes the slave; the producer's retry reaches it and is answered from
    the producer state the slave built from the replicated records."""
    cluster = make_cluster(
        nameservers=1,
        brokers=[BrokerSpec("broker-a", 0), BrokerSpec("broker-a", 1)],
        topics=[actors.TopicConfig("Promo", 2, 2)],
        broker_options={
            "broker_role": "SYNC_MASTER",
            "slave_sync_interval_s": 0.2,
            "ha_slave_timeout_s": 1.5,
        },
    )
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    producer = cluster.producer("p-promo", send_timeout_s=1.0, delivery_timeout_s=90.0)
    producer.send(Message("Promo", b"warm-up"))
    before = status_of(master)["commitlog_max_offset"]
    ray.get(master.inject_fault.remote("hang_after_store", 1000))  # the retries hang too
    out: dict[str, Any] = {}
    sender = threading.Thread(
        target=lambda: out.update(
            results=producer.send_batch([Message("Promo", b"p-%d" % i) for i in range(20)])
        )
    )
    sender.start()
    end = wait_until(
        lambda: (e := status_of(master)["commitlog_max_offset"]) > before and e,
        what="the batch stored",
    )
    wait_until(lambda: status_of(slave)["commitlog_max_offset"] >= end, what="and replicated")
    kill(master)
    wait_until(lambda: 0 not in members(cluster, "broker-a"), what="master out of the routes")
    assert cluster.admin.promote("broker-a")["broker"] == "broker-a-1"
    sender.join(120)
    assert [cluster.admin.query_by_id(r.offset_msg_id).body for r in out["results"]] == [
        b"p-%d" % i for i in range(20)
    ]
    got = read_all(cluster.pull_consumer("g-promo"), "Promo")
    assert once_each(got) == {} and len(got) == 21
    producer.close()
