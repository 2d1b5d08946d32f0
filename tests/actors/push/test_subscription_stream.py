"""A subscription on a real broker's socket: SUBSCRIBE opens a stream of the new
records of the queues it names, within the credit CREDIT renews; SUBSCRIPTION_UPDATE
adds and drops queues, UNSUBSCRIBE ends it; bad requests get a clear error."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from raymq_testkit import wait_until

import actors
from actors.protocol.connection import BrokerConnection
from actors.protocol.requests.send import SEND
from actors.protocol.requests.subscribe import (
    CREDIT,
    SUBSCRIBE,
    SUBSCRIPTION_UPDATE,
    UNSUBSCRIBE,
)
from actors.protocol.wire import pulls_from_wire
from storage.batch import encode_batch
from storage.errors import InvalidMessageError, PermissionDeniedError, TopicNotFoundError
from storage.message import Message
from storage.record import decode_records

WAIT_S = 20.0


@pytest.fixture
def conn(one_broker: actors.Cluster) -> Iterator[BrokerConnection]:
    handle = one_broker.broker("broker-a")
    info = ray.get(handle.data_path.remote())
    c = BrokerConnection(info["addr"], info["secret"], tls=info["tls"], name="broker-a-0")
    c.open()
    yield c
    c.close()


class Received:
    """A stream's answers as ``(topic, queue id, status, next offset, bodies)``."""

    def __init__(self) -> None:
        self.answers: queue.Queue[tuple[str, int, str, int, list[bytes]]] = queue.Queue()
        self.ids: queue.Queue[int] = queue.Queue()

    def __call__(self, header: dict[str, Any], body: Any) -> None:
        if "s" in header:  # the first answer: the subscription's id
            self.ids.put(header["s"])
            return
        for (topic, qid), raw in zip(header["k"], pulls_from_wire(bytes(body))):
            bodies = [m.body for m in decode_records(raw.data)]
            self.answers.put((topic, qid, raw.status.name, raw.next_offset, bodies))

    def bodies(self, n: int) -> list[tuple[str, bytes]]:
        """The next ``n`` records, as (topic, body)."""
        got: list[tuple[str, bytes]] = []
        while len(got) < n:
            topic, _, _, _, bodies = self.answers.get(timeout=WAIT_S)
            got.extend((topic, b) for b in bodies)
        assert len(got) == n, got
        return got


def call(conn: BrokerConnection, request: Any, *args: Any, **kwargs: Any) -> Any:
    header, parts, read = request.encode(*args, **kwargs)
    h, body = conn.request(header, parts).result(WAIT_S)
    return read(h, body)


def send(cluster: actors.Cluster, topic: str, bodies: list[bytes]) -> None:
    """``bodies`` to ``topic`` (one queue), in order."""
    producer = cluster.producer(f"p-{topic}")
    try:
        producer.send_batch([Message(topic, b) for b in bodies])
    finally:
        producer.close()


def test_a_subscription_streams_within_its_credit(
    one_broker: actors.Cluster, conn: BrokerConnection
) -> None:
    topic, other = "SubStream", "SubStreamMore"
    for t in (topic, other):
        one_broker.admin.create_topic(t, read_queue_nums=1, write_queue_nums=1)
    first = [f"a{i}".encode() for i in range(20)]
    send(one_broker, topic, first)

    got = Received()
    header, parts, read = SUBSCRIBE.encode("g-sub", {(topic, 0): 0}, credit=5, max_count=4)
    stream = conn.stream(header, got, parts)
    assert got.bodies(5) == [(topic, b) for b in first[:5]]  # the credit, in order
    with pytest.raises(queue.Empty):  # no credit left: the stream stops
        got.answers.get(timeout=0.5)
    sid = got.ids.get(timeout=WAIT_S)
    call(conn, CREDIT, sid, 100)
    assert got.bodies(15) == [(topic, b) for b in first[5:]]  # resumed where it stood

    # a new queue on rebalance; new records arrive as they are stored
    call(conn, SUBSCRIPTION_UPDATE, sid, add={(other, 0): 0}, drop=[[topic, 0]])
    send(one_broker, other, [b"b0", b"b1"])
    send(one_broker, topic, [b"dropped"])
    assert got.bodies(2) == [(other, b"b0"), (other, b"b1")]
    send(one_broker, other, [b"b2"])
    assert got.bodies(1) == [(other, b"b2")]  # the dropped queue's record never came

    call(conn, UNSUBSCRIBE, sid)
    assert read(*stream.result(WAIT_S)) == "unsubscribed"
    assert got.answers.empty()
    assert open_subscriptions(one_broker) == 0


def test_queues_left_with_records_when_the_credit_ran_out_come_after_it_is_renewed(
    one_broker: actors.Cluster, conn: BrokerConnection
) -> None:
    first, second = "SubNewsA", "SubNewsB"
    for t in (first, second):
        one_broker.admin.create_topic(t, read_queue_nums=1, write_queue_nums=1)
        send(one_broker, t, [f"{t}-{i}".encode() for i in range(6)])
    got = Received()
    queues = {(first, 0): 0, (second, 0): 0}
    header, parts, read = SUBSCRIBE.encode("g-news", queues, credit=4, max_count=4)
    stream = conn.stream(header, got, parts)
    sid = got.ids.get(timeout=WAIT_S)
    before = got.bodies(4)
    with pytest.raises(queue.Empty):  # no credit left, records left in both queues
        got.answers.get(timeout=0.5)
    call(conn, CREDIT, sid, 100)  # no dispatch since: what was left comes all the same
    after = got.bodies(8)
    for t in (first, second):
        assert [b for topic, b in before + after if topic == t] == [
            f"{t}-{i}".encode() for i in range(6)
        ]
    send(one_broker, second, [b"late"])  # and a dispatch to one of them still wakes it
    assert got.bodies(1) == [(second, b"late")]
    call(conn, UNSUBSCRIBE, sid)
    assert read(*stream.result(WAIT_S)) == "unsubscribed"


def open_subscriptions(cluster: actors.Cluster) -> int:
    """The broker's open subscriptions (asked in its actor)."""

    def count(broker: Any) -> int:  # local: sent by value, not by this module's name
        return int(broker.subscriber.open)

    return int(ray.get(cluster.broker("broker-a").__ray_call__.remote(count)))


def test_a_lost_connection_ends_its_subscriptions(
    one_broker: actors.Cluster, conn: BrokerConnection
) -> None:
    topic = "SubLost"
    one_broker.admin.create_topic(topic, read_queue_nums=1, write_queue_nums=1)
    got = Received()
    header, parts, _ = SUBSCRIBE.encode("g-lost", {(topic, 0): 0}, credit=10)
    conn.stream(header, got, parts)
    got.ids.get(timeout=WAIT_S)
    assert open_subscriptions(one_broker) == 1
    conn.close()
    wait_until(lambda: open_subscriptions(one_broker) == 0, what="the subscription's end")


def test_bad_subscription_requests_get_a_clear_error(
    one_broker: actors.Cluster, conn: BrokerConnection
) -> None:
    topic = "SubBad"
    one_broker.admin.create_topic(topic, read_queue_nums=1, write_queue_nums=1)
    header, parts, _ = SUBSCRIBE.encode("g-bad", {("NoSuchTopic", 0): 0}, credit=1)
    with pytest.raises(TopicNotFoundError):
        conn.stream(header, Received(), parts).result(WAIT_S)
    header, parts, _ = SUBSCRIBE.encode("g-bad", {(topic, 0): 0}, credit=-1)
    with pytest.raises(InvalidMessageError, match="credit"):
        conn.stream(header, Received(), parts).result(WAIT_S)
    with pytest.raises(InvalidMessageError, match="no subscription"):
        call(conn, CREDIT, 999_999, 1)

    header, parts, read = SUBSCRIBE.encode("g-bad", {(topic, 0): 0}, credit=1)
    opened = Received()
    stream = conn.stream(header, opened, parts)
    sid = opened.ids.get(timeout=WAIT_S)
    with pytest.raises(InvalidMessageError, match="credit"):
        call(conn, CREDIT, sid, -5)
    with pytest.raises(InvalidMessageError):
        call(conn, SUBSCRIPTION_UPDATE, sid, add={(topic, 7): 0})
    call(conn, UNSUBSCRIBE, sid)  # the errors changed nothing: it is still open
    assert read(*stream.result(WAIT_S)) == "unsubscribed"


def test_a_queue_no_longer_readable_ends_its_subscription_with_the_refusal(
    one_broker: actors.Cluster, conn: BrokerConnection
) -> None:
    topic = "SubPerm"
    one_broker.admin.create_topic(topic, read_queue_nums=1, write_queue_nums=1)
    got = Received()
    header, parts, _ = SUBSCRIBE.encode("g-perm", {(topic, 0): 0}, credit=10)
    stream = conn.stream(header, got, parts)
    send(one_broker, topic, [b"r0"])
    assert got.bodies(1) == [(topic, b"r0")]
    one_broker.admin.update_topic(topic, perm=2)  # write only: the records to come are refused
    send(one_broker, topic, [b"r1"])
    with pytest.raises(PermissionDeniedError):
        stream.result(WAIT_S)
    assert got.answers.empty()
    assert open_subscriptions(one_broker) == 0


def send_on(conn: BrokerConnection, topic: str, bodies: list[bytes], on_ack: Any) -> Any:
    """``bodies`` to ``topic``'s queue 0 as one SEND on ``conn``; ``on_ack()`` runs on the
    connection's I/O thread when the answer's frame is read."""
    blob = encode_batch([Message(topic, b, queue_id=0) for b in bodies]).to_bytes()
    header, parts, read = SEND.encode(blob)

    def decode(h: dict[str, Any], body: Any) -> Any:
        on_ack()
        return read(h, body)

    return conn.request(header, parts, decode=decode)


def test_a_waiting_stream_gets_a_record_before_its_sender_gets_the_answer(
    one_broker: actors.Cluster, conn: BrokerConnection
) -> None:
    """A stream waiting for news gets the record before the send's answer goes out (a
    held read answers first, as a held pull does): on one connection its frame comes
    first."""
    topic = "SubFirst"
    one_broker.admin.create_topic(topic, read_queue_nums=1, write_queue_nums=1)
    order: list[str] = []
    got = Received()

    def on_stream(header: dict[str, Any], body: Any) -> None:
        if "k" in header:
            order.append("stream")
        got(header, body)

    header, parts, read = SUBSCRIBE.encode("g-first", {(topic, 0): 0}, credit=100)
    stream = conn.stream(header, on_stream, parts)
    sid = got.ids.get(timeout=WAIT_S)
    for i in range(3):
        send_on(conn, topic, [f"m{i}".encode()], lambda: order.append("ack")).result(WAIT_S)
        assert got.bodies(1) == [(topic, f"m{i}".encode())]
    assert order == ["stream", "ack"] * 3
    call(conn, UNSUBSCRIBE, sid)
    assert read(*stream.result(WAIT_S)) == "unsubscribed"


def test_a_batch_larger_than_max_count_streams_in_order_within_the_credit(
    one_broker: actors.Cluster, conn: BrokerConnection
) -> None:
    """A stream answer holds at most ``max_count`` records within the credit: the rest
    of a batch follows in order, and what the credit stopped comes after CREDIT."""
    topic = "SubRest"
    one_broker.admin.create_topic(topic, read_queue_nums=1, write_queue_nums=1)
    got = Received()
    header, parts, read = SUBSCRIBE.encode("g-rest", {(topic, 0): 0}, credit=7, max_count=2)
    stream = conn.stream(header, got, parts)
    sid = got.ids.get(timeout=WAIT_S)
    bodies = [f"r{i}".encode() for i in range(10)]
    send_on(conn, topic, bodies, lambda: None).result(WAIT_S)
    assert got.bodies(7) == [(topic, b) for b in bodies[:7]]  # in answers of 2 at most
    with pytest.raises(queue.Empty):  # the credit ran out
        got.answers.get(timeout=0.5)
    call(conn, CREDIT, sid, 100)
    assert got.bodies(3) == [(topic, b) for b in bodies[7:]]
    send_on(conn, topic, [b"after"], lambda: None).result(WAIT_S)
    assert got.bodies(1) == [(topic, b"after")]  # waiting again: woken by the put
    call(conn, UNSUBSCRIBE, sid)
    assert read(*stream.result(WAIT_S)) == "unsubscribed"
    assert got.answers.empty()
