"""RocketMQ 5's gRPC protocol served by RayMQ's brokers, driven by the official Python
client from PyPI (``rocketmq-python-client``): what it sends, a native RayMQ consumer
reads, with the same bodies and ids; unsigned, badly signed and malformed calls get
RocketMQ's status codes and change nothing.

The official client's generated protocol modules live in this process; RayMQ's own
are loaded only inside the broker actors (docs/rocketmq5.md)."""

from __future__ import annotations

import base64
import gzip
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import ray
from node_client import node_client
from raymq_testkit import SMALL_STORE, drain, unique_namespace, wait_until
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import (
    AckMessageEntry,
    AckMessageRequest,
    ClientType,
    Code,
    EndTransactionRequest,
    ForwardMessageToDeadLetterQueueRequest,
    MessagingServiceStub,
    QueryAssignmentRequest,
    QueryRouteRequest,
    RecallMessageRequest,
    ReceiveMessageRequest,
    Resource,
    SendMessageRequest,
    Settings,
    TelemetryCommand,
)
from rocketmq.grpc_protocol.definition_pb2 import Encoding, MessageQueue, QueryOffsetPolicy
from rocketmq.grpc_protocol.service_pb2 import (
    GetOffsetRequest,
    QueryOffsetRequest,
    UpdateOffsetRequest,
)
from rocketmq.v5.exception import (
    IllegalArgumentException,
    InternalErrorException,
    PayloadTooLargeException,
)
from rocketmq.v5.util.signature import Signature

import actors
from actors import SendStatus, TopicConfig
from storage.message import Message as NativeMessage

TOPIC = "grpc-orders"
POP_TOPIC = "grpc-pop"
PUSH_TOPIC = "grpc-push"
NODE_TOPIC = "grpc-node"
NODE_IN_TOPIC = "grpc-node-in"
DLQ_TOPIC = "grpc-dlq"
FIFO_TOPIC = "grpc-fifo"
TXN_POP_TOPIC = "grpc-txn-pop"
RENEW_TOPIC = "grpc-renew"
GZIP_TOPIC = "grpc-gzip"
RECALL_TOPIC = "grpc-recall"
ACK_TOPIC = "grpc-ack"
BURST_TOPIC = "grpc-burst"


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    ns = unique_namespace("grpc")
    root: Path = tmp_path_factory.mktemp("grpc")
    c = actors.start_cluster(
        namespace=ns,
        nameservers=1,
        brokers=2,
        store_root=str(root),
        topics=[
            TOPIC,
            "grpc-txn",
            "grpc-orphan",
            "grpc-guarded",
            TopicConfig(POP_TOPIC, read_queue_nums=2, write_queue_nums=2),
            TopicConfig(PUSH_TOPIC, read_queue_nums=2, write_queue_nums=2),
            TopicConfig(NODE_TOPIC, read_queue_nums=2, write_queue_nums=2),
            TopicConfig(NODE_IN_TOPIC, read_queue_nums=2, write_queue_nums=2),
            TopicConfig(DLQ_TOPIC, read_queue_nums=2, write_queue_nums=2),
            TopicConfig(TXN_POP_TOPIC, read_queue_nums=2, write_queue_nums=2),
            TopicConfig(RENEW_TOPIC, read_queue_nums=2, write_queue_nums=2),
            TopicConfig(GZIP_TOPIC, read_queue_nums=1, write_queue_nums=1),
            TopicConfig(RECALL_TOPIC, read_queue_nums=2, write_queue_nums=2),
            TopicConfig(ACK_TOPIC, read_queue_nums=2, write_queue_nums=2),
            TopicConfig(BURST_TOPIC, read_queue_nums=1, write_queue_nums=1),
        ],
        broker_options={
            "store": SMALL_STORE,
            "heartbeat_interval_s": 2.0,
            "grpc_enable": True,
            "grpc_bind": "127.0.0.1",
            "transaction_timeout_s": 0.5,  # a half message is checked once this old
            "grpc_renew_invisible_s": 1.0,  # a push consumer's messages: renewed 0.5 s
            "grpc_renew_ahead_s": 0.5,  # before they would lapse, 1 s at a time
        },
    )
    yield c
    c.shutdown(timeout_s=10.0)


@pytest.fixture(scope="module")
def endpoints(cluster: Any) -> dict[str, Any]:
    found = cluster.grpc_endpoints()
    assert sorted(found) == ["broker-a-0", "broker-b-0"]
    return found


@pytest.fixture(scope="module")
def config(cluster: Any, endpoints: dict[str, Any]) -> ClientConfiguration:
    ak, sk = cluster.grpc_credentials()
    assert ak and len(sk) >= 40
    return ClientConfiguration(endpoints["broker-a-0"]["addr"], Credentials(ak, sk))


@pytest.fixture(scope="module")
def producer(config: ClientConfiguration) -> Iterator[Producer]:
    p = Producer(config, (TOPIC,))
    p.startup()
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def stub(endpoints: dict[str, Any]) -> Iterator[MessagingServiceStub]:
    """A raw stub of the official client's generated code: for calls the client would
    refuse to make itself (oversized bodies, bad signatures)."""
    channel = grpc.insecure_channel(endpoints["broker-a-0"]["addr"])
    yield MessagingServiceStub(channel)
    channel.close()


def _signed(config: ClientConfiguration) -> list[tuple[str, str]]:
    return Signature.metadata(config, "raw-stub")


def _by_id(cluster: Any, topic: str) -> dict[str, Any]:
    consumer = cluster.pull_consumer("grpc-reader")
    try:
        return {m.msg_id: m for msgs in drain(consumer, topic).values() for m in msgs}
    finally:
        consumer.close()


def _message(topic: str, body: bytes, **fields: Any) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    for key, value in fields.items():
        setattr(m, key, value)
    return m


def test_official_producer_normal_fifo_and_delayed_reach_native_consumers(
    cluster: Any, producer: Producer
) -> None:
    normal = _message(TOPIC, b"plain", tag="TagA", keys="order-1")
    normal.add_property("region", "eu")
    sent = {producer.send(normal).message_id: normal}
    fifo = []
    for i in range(6):
        m = _message(TOPIC, f"step-{i}".encode(), message_group="order-42")
        fifo.append(producer.send(m).message_id)
        sent[fifo[-1]] = m
    at_ms = int(time.time() * 1000) + 1500
    delayed = _message(TOPIC, b"later", delivery_timestamp=at_ms)  # ms, as the client documents
    delayed_id = producer.send(delayed).message_id
    sent[delayed_id] = delayed

    # every id found (the delayed one once due)
    got = wait_until(
        lambda: (lambda seen: seen if set(sent) <= set(seen) else None)(_by_id(cluster, TOPIC)),
        timeout_s=20,
        what="every message the official producer sent",
    )
    for msg_id, m in sent.items():
        assert got[msg_id].body == m.body
    plain = got[next(iter(sent))]
    assert plain.properties["TAGS"] == "TagA"
    assert plain.properties["KEYS"] == "order-1"
    assert plain.properties["region"] == "eu"
    # a message group is one queue of one broker, in send order
    group = [got[i] for i in fifo]
    assert len({(m.store_host, m.queue_id) for m in group}) == 1
    assert [m.queue_offset for m in group] == sorted(m.queue_offset for m in group)
    assert [m.body for m in group] == [f"step-{i}".encode() for i in range(6)]
    assert all(m.properties["__SHARDINGKEY"] == "order-42" for m in group)
    # the timer wheel held it until its time, then put it in its topic, timer cleared
    assert got[delayed_id].store_timestamp >= at_ms
    assert "TIMER_DELIVER_MS" not in got[delayed_id].properties


class _Checker(TransactionChecker):
    def check(self, message: Message) -> TransactionResolution:
        return TransactionResolution.ROLLBACK


def test_official_transactions_commit_and_rollback(cluster: Any, config: Any) -> None:
    p = Producer(config, ("grpc-txn",), _Checker())
    p.startup()
    try:
        committed = p.begin_transaction()
        kept = p.send(_message("grpc-txn", b"kept"), committed)
        committed.commit()
        dropped_txn = p.begin_transaction()
        dropped = p.send(_message("grpc-txn", b"dropped"), dropped_txn)
        dropped_txn.rollback()
    finally:
        p.shutdown()
    got = wait_until(
        lambda: (lambda seen: seen if kept.message_id in seen else None)(
            _by_id(cluster, "grpc-txn")
        ),
        what="the committed message",
    )
    assert got[kept.message_id].body == b"kept"
    assert dropped.message_id not in got
    assert len(got) == 1


class _CommitChecker(TransactionChecker):
    def __init__(self) -> None:
        self.checked: list[str] = []

    def check(self, message: Message) -> TransactionResolution:
        self.checked.append(message.message_id)
        return TransactionResolution.COMMIT


def _publishers(cluster: Any) -> list[int]:
    return [e["stats"]["publishers"] for _, e in sorted(cluster.grpc_endpoints().items())]


def test_an_orphaned_transaction_is_resolved_by_the_official_checker(
    cluster: Any, config: Any
) -> None:
    """A half message its producer never ends: the broker's check service asks the
    producer over its Telemetry stream, the checker commits it."""
    before = _publishers(cluster)
    checker = _CommitChecker()
    p = Producer(config, ("grpc-orphan",), checker)
    p.startup()
    try:
        wait_until(
            lambda: all(n > b for n, b in zip(_publishers(cluster), before)),
            what="the producer's Telemetry stream on both brokers",
        )
        orphan = p.send(_message("grpc-orphan", b"orphan"), p.begin_transaction())
        assert _by_id(cluster, "grpc-orphan") == {}  # a half message: not readable
        brokers = [cluster.broker("broker-a"), cluster.broker("broker-b")]

        def checked() -> bool:
            ray.get([b.check_transactions.remote() for b in brokers])
            return orphan.message_id in checker.checked

        wait_until(checked, interval_s=0.3, what="the check pushed over Telemetry")
        got = wait_until(
            lambda: _by_id(cluster, "grpc-orphan"), what="the message the checker committed"
        )
        assert list(got) == [orphan.message_id]
        assert got[orphan.message_id].body == b"orphan"
    finally:
        p.shutdown()
    wait_until(lambda: _publishers(cluster) == before, what="the stream's end unregistering it")


class _UnknownChecker(TransactionChecker):
    """Answers every check UNKNOW (the client sends it as the unspecified resolution)."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    def check(self, message: Message) -> TransactionResolution:
        self.checked.append(message.message_id)
        return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED


def test_a_simple_consumer_never_receives_uncommitted_or_rolled_back_messages(
    cluster: Any, config: Any
) -> None:
    """Three transactions of the official Producer: one committed, one rolled back, one
    whose checker keeps answering UNKNOW (checked again after each answer: still a half
    message). The official SimpleConsumer gets the committed one and nothing else."""
    before = _publishers(cluster)
    checker = _UnknownChecker()
    p = Producer(config, (TXN_POP_TOPIC,), checker)
    p.startup()
    consumer = SimpleConsumer(
        config, "grpc-txn-pop", {TXN_POP_TOPIC: FilterExpression()}, await_duration=1
    )
    consumer.startup()
    try:
        wait_until(
            lambda: all(n > b for n, b in zip(_publishers(cluster), before)),
            what="the producer's Telemetry stream on both brokers",
        )
        txn = p.begin_transaction()
        committed = p.send(_message(TXN_POP_TOPIC, b"committed"), txn)
        txn.commit()
        txn = p.begin_transaction()
        p.send(_message(TXN_POP_TOPIC, b"rolled-back"), txn)
        txn.rollback()
        unknown = p.send(_message(TXN_POP_TOPIC, b"unknown"), p.begin_transaction())
        brokers = [cluster.broker("broker-a"), cluster.broker("broker-b")]

        def checked_twice() -> bool:  # asked, answered UNKNOW, still pending: asked again
            ray.get([b.check_transactions.remote() for b in brokers])
            return checker.checked.count(unknown.message_id) >= 2

        wait_until(checked_twice, interval_s=0.3, what="the unknown one checked twice")
        got = _receive_ids(consumer, {committed.message_id}, invisible_s=20)
        ends = time.monotonic() + 1.5  # and a short while more: nothing else comes
        while time.monotonic() < ends:
            for m in consumer.receive(16, 20):
                got[m.message_id] = m
        assert {i: m.body for i, m in got.items()} == {committed.message_id: b"committed"}
        consumer.ack(got[committed.message_id])
    finally:
        consumer.shutdown()
        p.shutdown()


def test_unsigned_and_badly_signed_calls_are_refused_and_change_nothing(
    cluster: Any, config: Any, stub: MessagingServiceStub
) -> None:
    before = _by_id(cluster, "grpc-guarded")
    route = QueryRouteRequest(topic=Resource(name="grpc-guarded"))
    forged = ClientConfiguration(
        "127.0.0.1:1", Credentials(config.credentials.ak, "not-the-secret")
    )
    send = SendMessageRequest()
    m = send.messages.add()
    m.topic.name = "grpc-guarded"
    m.body = b"intruder"
    m.system_properties.message_id = "01INTRUDER"
    for metadata in ([], _signed(forged)):
        assert stub.QueryRoute(route, metadata=metadata).status.code == Code.UNAUTHORIZED
        assert stub.SendMessage(send, metadata=metadata).status.code == Code.UNAUTHORIZED
    assert stub.QueryRoute(route, metadata=_signed(config)).status.code == Code.OK
    assert _by_id(cluster, "grpc-guarded") == before == {}


def test_malformed_requests_get_rocketmq_status_codes(
    cluster: Any, config: Any, stub: MessagingServiceStub, producer: Producer
) -> None:
    md = _signed(config)
    unknown = QueryRouteRequest(topic=Resource(name="no-such-topic"))
    assert stub.QueryRoute(unknown, metadata=md).status.code == Code.TOPIC_NOT_FOUND

    def send(body: bytes, topic: str = TOPIC, **system: Any) -> int:
        req = SendMessageRequest()
        m = req.messages.add()
        m.topic.name = topic
        m.body = body
        m.system_properties.message_id = system.pop("message_id", "01RAWSTUB")
        for key, value in system.items():
            setattr(m.system_properties, key, value)
        return int(stub.SendMessage(req, metadata=md).status.code)

    before = _by_id(cluster, TOPIC)
    assert send(b"x" * (SMALL_STORE["max_message_size"] + 1)) == Code.MESSAGE_BODY_TOO_LARGE
    assert send(b"") == Code.MESSAGE_BODY_EMPTY
    assert send(b"x", topic="no-such-topic") == Code.TOPIC_NOT_FOUND
    assert send(b"x", topic="bad topic!") == Code.ILLEGAL_TOPIC
    assert send(b"x", message_id="") == Code.ILLEGAL_MESSAGE_ID
    assert send(b"x", message_group="") == Code.ILLEGAL_MESSAGE_GROUP
    assert _by_id(cluster, TOPIC).keys() == before.keys()
    end = EndTransactionRequest(
        topic=Resource(name="grpc-txn"),
        message_id="01NOPE",
        transaction_id="not-an-offset",
        resolution=TransactionResolution.COMMIT,
    )
    assert stub.EndTransaction(end, metadata=md).status.code == Code.INVALID_TRANSACTION_ID
    end.transaction_id = "0"  # an offset, but not a half message of that topic
    assert stub.EndTransaction(end, metadata=md).status.code == Code.INVALID_TRANSACTION_ID
    # the official client refuses an oversized body itself, from the server's settings
    with pytest.raises((IllegalArgumentException, PayloadTooLargeException)):
        producer.send(_message(TOPIC, b"x" * (SMALL_STORE["max_message_size"] + 1)))


def test_gzip_bodies_are_stored_as_sent_and_bombs_and_corrupt_ones_refused(
    cluster: Any, config: Any, stub: MessagingServiceStub
) -> None:
    """Neither official Python nor Node.js client compresses (both send IDENTITY); Java's
    compresses bodies over 4 KiB with GZIP. A GZIP body is stored as the original bytes
    and received back with IDENTITY; a corrupt one is BAD_REQUEST, one inflating past the
    store's max message size MESSAGE_BODY_TOO_LARGE, and neither stores anything."""
    md = _signed(config)
    original = b"".join(b"order %06d: 3 x widget, paid\n" % i for i in range(600))  # 18 KB
    packed = gzip.compress(original)
    assert len(original) > 4096 > len(packed)

    def send(body: bytes, message_id: str) -> Any:
        req = SendMessageRequest()
        m = req.messages.add()
        m.topic.name = GZIP_TOPIC
        m.body = body
        m.system_properties.message_id = message_id
        m.system_properties.body_encoding = Encoding.GZIP
        return stub.SendMessage(req, metadata=md)

    bomb = gzip.compress(b"\0" * (SMALL_STORE["max_message_size"] + 1))  # ~1 KB
    assert send(packed[:-12] + b"garbage!" * 2, "01GZCORRUPT").status.code == Code.BAD_REQUEST
    assert send(b"not gzip", "01GZNOTGZIP").status.code == Code.BAD_REQUEST
    assert send(bomb, "01GZBOMB").status.code == Code.MESSAGE_BODY_TOO_LARGE
    assert _by_id(cluster, GZIP_TOPIC) == {}
    answer = send(packed, "01GZIPPEDBODY")
    assert answer.status.code == Code.OK
    stored = _by_id(cluster, GZIP_TOPIC)
    assert [(i, m.body) for i, m in stored.items()] == [("01GZIPPEDBODY", original)]
    receive = ReceiveMessageRequest(
        group=Resource(name="grpc-gzip-group"),
        message_queue=MessageQueue(topic=Resource(name=GZIP_TOPIC), id=-1),
        batch_size=4,
        auto_renew=False,
    )
    receive.invisible_duration.FromSeconds(5)
    receive.long_polling_timeout.FromSeconds(2)
    got = [
        r.message
        for r in stub.ReceiveMessage(receive, metadata=md, timeout=10)
        if r.HasField("message")
    ]
    assert [(m.system_properties.message_id, m.body) for m in got] == [("01GZIPPEDBODY", original)]
    assert got[0].system_properties.body_encoding == Encoding.IDENTITY


def _recall_handle_broker(handle: str) -> str:
    return base64.urlsafe_b64decode(handle).decode().split(" ")[2]


def test_official_producer_recalls_a_timer_message_which_is_never_delivered(
    cluster: Any, config: Any, stub: MessagingServiceStub
) -> None:
    """Producer.recall_message (RocketMQ 5.3): a timer message's send answers a recall
    handle; recalled (at its own broker, or forwarded there by the access point's), it is
    never delivered while its neighbours of the same time are; a handle of a message
    already delivered, a malformed one, or one of another topic get RocketMQ's answer
    (INTERNAL_SERVER_ERROR with its reason)."""
    producer = Producer(config, (RECALL_TOPIC,))
    producer.startup()
    try:
        at_ms = int(time.time() * 1000) + 2500
        receipts: dict[str, list[Any]] = {}  # broker -> receipts, until both have two
        for i in range(40):
            r = producer.send(
                _message(RECALL_TOPIC, f"timer-{i}".encode(), delivery_timestamp=at_ms)
            )
            assert r.recall_handle, "a timer message's send answers a recall handle"
            receipts.setdefault(_recall_handle_broker(r.recall_handle), []).append(r)
            if len(receipts) == 2 and all(len(v) >= 2 for v in receipts.values()):
                break
        assert sorted(receipts) == ["broker-a", "broker-b"]  # the access point is broker-a
        recalled = {v[0].message_id for v in receipts.values()}
        for v in receipts.values():
            assert producer.recall_message(RECALL_TOPIC, v[0].recall_handle) == v[0].message_id
        sent = {r.message_id for v in receipts.values() for r in v}
        kept = sent - recalled
        assert time.time() * 1000 < at_ms, "recalled before their time"
        got = wait_until(
            lambda: (lambda seen: seen if kept <= set(seen) else None)(
                _by_id(cluster, RECALL_TOPIC)
            ),
            timeout_s=20,
            what="the timer messages not recalled",
        )
        assert set(got) == kept  # delivered in the same ticks as the recalled ones: never
        md = _signed(config)
        delivered = receipts["broker-b"][1].recall_handle
        with pytest.raises(InternalErrorException, match="timestamp invalid"):
            producer.recall_message(RECALL_TOPIC, delivered)
        for handle, topic, reason in (
            ("bm90IGEgaGFuZGxl", RECALL_TOPIC, "recall handle is invalid"),
            (delivered, TOPIC, "topic not match"),
        ):
            answer = stub.RecallMessage(
                RecallMessageRequest(topic=Resource(name=topic), recall_handle=handle), metadata=md
            )
            assert answer.status.code == Code.INTERNAL_SERVER_ERROR
            assert reason in answer.status.message
        assert set(_by_id(cluster, RECALL_TOPIC)) == kept
    finally:
        producer.shutdown()


def test_ack_message_with_several_entries_answers_each(
    cluster: Any, config: Any, endpoints: dict[str, Any]
) -> None:
    """One AckMessage of several entries (acked in one store operation at the broker):
    each entry answers its own status, a forged one INVALID_RECEIPT_HANDLE and the call
    MULTIPLE_RESULTS; the acked messages never come back, the forged entry changed
    nothing. Each receive's messages are acked at once, so however long receiving all
    six takes on a loaded machine, none lapses before its ack."""
    sent = _send_native(cluster, ACK_TOPIC, "ack", 6)
    group = "grpc-ack-group"
    invisible_s = 3
    consumer = SimpleConsumer(config, group, {ACK_TOPIC: FilterExpression()}, await_duration=1)
    consumer.startup()
    acked: set[str] = set()
    lapses_by = 0.0

    def ack_all(msgs: list[Any]) -> None:
        by_broker: dict[str, list[Any]] = {}
        for m in msgs:
            by_broker.setdefault(m.receipt_handle.split(" ")[6], []).append(m)
        for broker, some in by_broker.items():
            entries = [
                AckMessageEntry(message_id=m.message_id, receipt_handle=m.receipt_handle)
                for m in some
            ]
            entries.insert(1, AckMessageEntry(message_id="01FORGED", receipt_handle="forged"))
            channel = grpc.insecure_channel(endpoints[f"{broker}-0"]["addr"])
            try:
                answer = MessagingServiceStub(channel).AckMessage(
                    AckMessageRequest(
                        group=Resource(name=group), topic=Resource(name=ACK_TOPIC), entries=entries
                    ),
                    metadata=_signed(config),
                )
            finally:
                channel.close()
            assert answer.status.code == Code.MULTIPLE_RESULTS
            assert [(e.message_id, e.status.code) for e in answer.entries] == [
                (
                    e.message_id,
                    Code.INVALID_RECEIPT_HANDLE if e.receipt_handle == "forged" else Code.OK,
                )
                for e in entries
            ]

    def more() -> bool:
        nonlocal lapses_by
        msgs = consumer.receive(16, invisible_s)
        if msgs:
            lapses_by = time.monotonic() + invisible_s + 0.5
            assert not {m.message_id for m in msgs} & acked, "an acked message came back"
            ack_all(msgs)
            acked.update(m.message_id for m in msgs)
        return acked >= set(sent)

    try:
        wait_until(more, interval_s=0, what="6 messages received and acked")
        assert acked == set(sent)
        while time.monotonic() < lapses_by:  # past their invisible time: none comes back
            assert consumer.receive(16, invisible_s) == []
    finally:
        consumer.shutdown()


def test_offset_rpcs_answer_from_the_brokers_offsets(
    cluster: Any, config: Any, stub: MessagingServiceStub
) -> None:
    """QueryOffset (a queue's first, next, or first-at-a-time offset), GetOffset and
    UpdateOffset (a group's committed offset, as the native consumers and lag see it);
    bad queues and offsets refused and change nothing."""
    md = _signed(config)
    topic, group = "grpc-offsets", "grpc-offsets-group"
    cluster.admin.create_topic(topic, 1, 1, brokers=["broker-a"])  # the stub's broker
    native = cluster.producer("grpc-native-offsets")
    try:
        first = [native.send(NativeMessage(topic, f"o-{i}".encode())).msg_id for i in range(2)]
        stored = _by_id(cluster, topic)
        wait_until(lambda: time.time() * 1000 > max(m.store_timestamp for m in stored.values()))
        last = native.send(NativeMessage(topic, b"o-2")).msg_id
    finally:
        native.close()
    at = _by_id(cluster, topic)[last].store_timestamp
    assert sorted(stored) == sorted(first)
    mq = MessageQueue(topic=Resource(name=topic), id=0)

    def query(policy: int, ms: int | None = None) -> Any:
        req = QueryOffsetRequest(message_queue=mq, query_offset_policy=policy)
        if ms is not None:
            req.timestamp.FromMilliseconds(ms)
        return stub.QueryOffset(req, metadata=md)

    answers = [
        query(QueryOffsetPolicy.BEGINNING),
        query(QueryOffsetPolicy.END),
        query(QueryOffsetPolicy.TIMESTAMP, at),
    ]
    assert [(a.status.code, a.offset) for a in answers] == [
        (Code.OK, 0),
        (Code.OK, 3),
        (Code.OK, 2),
    ]
    assert query(QueryOffsetPolicy.TIMESTAMP).status.code == Code.BAD_REQUEST

    def get() -> Any:
        return stub.GetOffset(
            GetOffsetRequest(group=Resource(name=group), message_queue=mq), metadata=md
        )

    def update(offset: int, queue: MessageQueue = mq) -> int:
        req = UpdateOffsetRequest(group=Resource(name=group), message_queue=queue, offset=offset)
        return int(stub.UpdateOffset(req, metadata=md).status.code)

    assert get().status.code == Code.OFFSET_NOT_FOUND
    assert update(2) == Code.OK
    assert (get().status.code, get().offset) == (Code.OK, 2)
    assert [(r["queue_id"], r["lag"]) for r in cluster.admin.consumer_lag(group, topic)] == [(0, 1)]
    # refused, and the offset stays where it was
    assert update(4) == Code.ILLEGAL_OFFSET  # past the queue's end
    assert update(-1) == Code.ILLEGAL_OFFSET
    assert update(0, MessageQueue(topic=Resource(name=topic), id=3)) == Code.BAD_REQUEST
    other = MessageQueue(topic=Resource(name=topic), id=0)
    other.broker.name = "broker-b"  # a queue of another broker: ask its endpoint
    assert update(0, other) == Code.BAD_REQUEST
    assert (
        update(0, MessageQueue(topic=Resource(name="no-such-topic"), id=0)) == Code.TOPIC_NOT_FOUND
    )
    assert (
        stub.UpdateOffset(
            UpdateOffsetRequest(group=Resource(name=group), message_queue=mq, offset=0), metadata=[]
        ).status.code
        == Code.UNAUTHORIZED
    )
    assert get().offset == 2


def test_concurrent_sends_each_get_their_own_answer_and_a_bad_one_fails_alone(
    cluster: Any, config: Any, stub: MessagingServiceStub
) -> None:
    """Many calls in flight at once on the broker's event loop: each is stored once with
    its own answer (the offset it was told is where it is), and a bad one among them fails
    alone."""
    md = _signed(config)
    bad = 17

    def request(i: int) -> SendMessageRequest:
        req = SendMessageRequest()
        m = req.messages.add()
        m.topic.name = TOPIC
        m.body = f"burst-{i}".encode()
        m.system_properties.message_id = f"01BURST{i:04d}"
        if i == bad:  # passes the call's own checks; the encoder refuses the separator
            m.user_properties["note"] = "a\x01b"
        return req

    futures = [stub.SendMessage.future(request(i), metadata=md) for i in range(48)]
    answers = [f.result(timeout=30) for f in futures]
    assert answers[bad].status.code == Code.BAD_REQUEST
    assert "separators" in answers[bad].status.message
    ids = {f"01BURST{i:04d}": f"burst-{i}".encode() for i in range(48) if i != bad}
    for i, answer in enumerate(answers):
        if i != bad:
            assert answer.status.code == Code.OK, answer.status
            assert [e.message_id for e in answer.entries] == [f"01BURST{i:04d}"]
    stored = {k: m for k, m in _by_id(cluster, TOPIC).items() if k.startswith("01BURST")}
    assert {k: m.body for k, m in stored.items()} == ids
    for i, answer in enumerate(answers):
        if i != bad:  # the offset each call was told is where its message is
            assert stored[f"01BURST{i:04d}"].queue_offset == answer.entries[0].offset


def test_a_burst_past_grpcs_pending_call_limit_is_served_not_cancelled(
    config: Any, stub: MessagingServiceStub
) -> None:
    """2,000 sends at once on one broker: more than gRPC core lets wait for a server by
    default (past 1,000 it sheds arrivals at random as CANCELLED, which failed the
    4-producer peers benchmark): each is answered OK with its own offset."""
    md = _signed(config)
    n = 2000

    def request(i: int) -> SendMessageRequest:
        req = SendMessageRequest()
        m = req.messages.add()
        m.topic.name = BURST_TOPIC
        m.body = b"b"
        m.system_properties.message_id = f"01FLOOD{i:05d}"
        return req

    requests = [request(i) for i in range(n)]
    futures = [stub.SendMessage.future(r, metadata=md, timeout=60) for r in requests]
    codes: dict[Any, int] = {}
    offsets = set()
    for f in futures:
        try:
            answer = f.result()
        except grpc.RpcError as exc:
            codes[exc.code()] = codes.get(exc.code(), 0) + 1
            continue
        codes[answer.status.code] = codes.get(answer.status.code, 0) + 1
        offsets.add(answer.entries[0].offset)
    assert codes == {Code.OK: n}
    assert len(offsets) == n  # one queue here: every message its own offset


def test_telemetry_settings_and_assignments(
    config: Any, stub: MessagingServiceStub, endpoints: dict[str, Any]
) -> None:
    """A consumer's start waits for the server's settings on the Telemetry stream; a push
    consumer then asks which brokers to receive from."""
    md = _signed(config)
    producer = Settings(client_type=ClientType.PRODUCER)
    producer.publishing.topics.add(name=TOPIC)
    consumer = Settings(client_type=ClientType.PUSH_CONSUMER)
    consumer.subscription.group.name = "grpc-push"
    answers = list(
        stub.Telemetry(
            iter([TelemetryCommand(settings=producer), TelemetryCommand(settings=consumer)]),
            metadata=md,
        )
    )
    assert [a.status.code for a in answers] == [Code.OK, Code.OK]
    pub, sub = answers[0].settings, answers[1].settings
    assert pub.publishing.max_body_size == SMALL_STORE["max_message_size"]
    assert pub.backoff_policy.max_attempts >= 1
    assert sub.subscription.group.name == "grpc-push"
    assert sub.subscription.receive_batch_size > 0
    assert sub.backoff_policy.max_attempts == 16
    unsigned = list(stub.Telemetry(iter([TelemetryCommand(settings=producer)]), metadata=[]))
    assert [a.status.code for a in unsigned] == [Code.UNAUTHORIZED]
    assert not unsigned[0].HasField("settings")

    request = QueryAssignmentRequest(topic=Resource(name=TOPIC), group=Resource(name="grpc-push"))
    got = stub.QueryAssignment(request, metadata=md)
    assert got.status.code == Code.OK
    brokers = {a.message_queue.broker.name for a in got.assignments}
    addrs = {
        f"{a.message_queue.broker.endpoints.addresses[0].host}:"
        f"{a.message_queue.broker.endpoints.addresses[0].port}"
        for a in got.assignments
    }
    assert brokers == {"broker-a", "broker-b"}
    assert addrs == {e["addr"] for e in endpoints.values()}


def test_official_simple_consumer_receives_acks_and_gets_lapsed_messages_again(
    cluster: Any, config: Any, stub: MessagingServiceStub
) -> None:
    """Native producer → official SimpleConsumer (POP): every message once by body and id;
    one left unacked (its invisible time cut to 1 s) comes back with delivery attempt 2; one
    whose invisible time was extended does not; forged and other groups' receipt handles
    are refused."""
    native = cluster.producer("grpc-native")
    try:
        sent = {
            native.send(NativeMessage(POP_TOPIC, f"pop-{i}".encode())).msg_id: f"pop-{i}".encode()
            for i in range(6)
        }
    finally:
        native.close()
    consumer = SimpleConsumer(
        config, "grpc-simple", {POP_TOPIC: FilterExpression()}, await_duration=1
    )
    consumer.startup()
    try:
        first: dict[str, Any] = {}

        def receive_all() -> bool:
            for m in consumer.receive(16, 20):  # invisible for 20 s
                assert m.message_id not in first, "delivered twice while invisible"
                first[m.message_id] = m
            return set(first) >= set(sent)

        wait_until(receive_all, interval_s=0, what="every message received once")
        assert set(first) == set(sent)
        assert {i: m.body for i, m in first.items()} == sent
        assert all(m.delivery_attempt == 1 for m in first.values())
        lapsed, extended, *done = sorted(first)
        # a handle forged, or of another group, is refused and changes nothing
        md = _signed(config)
        for group, handle in (
            ("grpc-simple", "forged"),
            ("other-group", first[done[0]].receipt_handle),
        ):
            req = AckMessageRequest(
                group=Resource(name=group),
                topic=Resource(name=POP_TOPIC),
                entries=[AckMessageEntry(message_id=done[0], receipt_handle=handle)],
            )
            answer = stub.AckMessage(req, metadata=md)
            assert answer.status.code == Code.INVALID_RECEIPT_HANDLE
            assert answer.entries[0].status.code == Code.INVALID_RECEIPT_HANDLE
        for msg_id in done:
            consumer.ack(first[msg_id])
        consumer.change_invisible_duration(first[extended], 30)
        consumer.change_invisible_duration(first[lapsed], 1)  # and then let it lapse
        again: dict[str, Any] = {}

        def lapsed_back() -> bool:
            for m in consumer.receive(16, 30):
                again[m.message_id] = m
            return lapsed in again

        wait_until(lapsed_back, interval_s=0, what="the unacked message after its 1 s")
        assert set(again) == {lapsed}  # acked ones done, the extended one still invisible
        assert again[lapsed].delivery_attempt == 2
        assert again[lapsed].body == sent[lapsed]
        consumer.ack(again[lapsed])
        consumer.ack(first[extended])  # under the handle its change gave
    finally:
        consumer.shutdown()


def _send_native(cluster: Any, topic: str, prefix: str, n: int) -> dict[str, bytes]:
    native = cluster.producer(f"grpc-native-{prefix}")
    try:
        bodies = [f"{prefix}-{i}".encode() for i in range(n)]
        return {native.send(NativeMessage(topic, b)).msg_id: b for b in bodies}
    finally:
        native.close()


def _receive_ids(consumer: SimpleConsumer, want: set[str], invisible_s: int) -> dict[str, Any]:
    got: dict[str, Any] = {}

    def more() -> bool:
        for m in consumer.receive(16, invisible_s):
            assert m.message_id not in got, "delivered twice while invisible"
            got[m.message_id] = m
        return set(got) >= want

    wait_until(more, interval_s=0, what=f"{len(want)} message(s) received")
    return got


def test_forward_to_dead_letter_queue_with_a_raw_stub(
    cluster: Any, config: Any, endpoints: dict[str, Any]
) -> None:
    """ForwardMessageToDeadLetterQueue (what a push consumer calls when it gives up): the
    message goes to ``%DLQ%<group>`` at once and is not delivered again; a forged handle is
    refused and forwards nothing."""
    group = "grpc-dlq-group"
    sent = _send_native(cluster, DLQ_TOPIC, "dlq", 2)
    consumer = SimpleConsumer(config, group, {DLQ_TOPIC: FilterExpression()}, await_duration=1)
    consumer.startup()
    try:
        # invisible for 8 s: long enough for both to be received, one forwarded and the
        # other acked on a machine slowed by other work (at 3 s, the first one received
        # once came back before the second did)
        got = _receive_ids(consumer, set(sent), invisible_s=8)
        lapsed_by = time.monotonic() + 8.5  # both handed out before now, for 8 s
        given_up, kept = sorted(got)
        handle = got[given_up].receipt_handle
        broker = handle.split(" ")[6]  # the broker that handed it out answers for it
        channel = grpc.insecure_channel(endpoints[f"{broker}-0"]["addr"])
        try:
            raw = MessagingServiceStub(channel)
            request = ForwardMessageToDeadLetterQueueRequest(
                group=Resource(name=group),
                topic=Resource(name=DLQ_TOPIC),
                receipt_handle="forged",
                message_id=given_up,
                delivery_attempt=1,
                max_delivery_attempts=16,
            )
            refused = raw.ForwardMessageToDeadLetterQueue(request, metadata=_signed(config))
            assert refused.status.code == Code.INVALID_RECEIPT_HANDLE
            request.receipt_handle = handle
            answer = raw.ForwardMessageToDeadLetterQueue(request, metadata=_signed(config))
            assert answer.status.code == Code.OK
        finally:
            channel.close()
        consumer.ack(got[kept])
        dlq = wait_until(lambda: cluster.admin.dlq_messages(group), what="the dead letter")
        assert [(m.msg_id, m.body) for m in dlq] == [(given_up, sent[given_up])]
        assert dlq[0].properties["RETRY_TOPIC"] == DLQ_TOPIC
        # its invisible time passes: it does not come back (nor the acked one)
        while time.monotonic() < lapsed_by:
            assert consumer.receive(16, 3) == []
    finally:
        consumer.shutdown()
    assert [m.msg_id for m in cluster.admin.dlq_messages(group)] == [given_up]


def _telemetry_fifo(stub: MessagingServiceStub, config: Any, group: str) -> bool:
    settings = Settings(client_type=ClientType.SIMPLE_CONSUMER)
    settings.subscription.group.name = group
    (answer,) = stub.Telemetry(
        iter([TelemetryCommand(settings=settings)]), metadata=_signed(config)
    )
    assert answer.status.code == Code.OK
    return bool(answer.settings.subscription.fifo)


def test_a_fifo_group_receives_a_message_group_in_order_one_in_flight(
    cluster: Any, config: Any, stub: MessagingServiceStub
) -> None:
    """A group made FIFO on the broker (``Admin.set_group_fifo``, RocketMQ's
    ``consumeMessageOrderly``) is told so in its settings, and the official SimpleConsumer
    gets a message group in send order, the next only once the one before is acked."""
    group = "grpc-fifo-group"
    cluster.admin.create_topic(FIFO_TOPIC, 1, 1, brokers=["broker-a"])  # one queue: no wait
    assert _telemetry_fifo(stub, config, group) is False
    cluster.admin.set_group_fifo(group)
    assert _telemetry_fifo(stub, config, group) is True
    assert _telemetry_fifo(stub, config, "grpc-simple") is False
    p = Producer(config, (FIFO_TOPIC,))
    p.startup()
    try:
        ids = [
            p.send(_message(FIFO_TOPIC, f"fifo-{i}".encode(), message_group="order-7")).message_id
            for i in range(4)
        ]
    finally:
        p.shutdown()
    consumer = SimpleConsumer(config, group, {FIFO_TOPIC: FilterExpression()}, await_duration=1)
    consumer.startup()
    try:
        seen = []
        for i in range(4):
            (m,) = wait_until(lambda: consumer.receive(1, 20), interval_s=0, what=f"message {i}")
            seen.append((m.message_id, m.body, m.delivery_attempt))
            if i < 2:  # the group's queue gives nothing more while this one is in flight
                assert consumer.receive(4, 20) == []
            consumer.ack(m)
        assert seen == [(ids[i], f"fifo-{i}".encode(), 1) for i in range(4)]
    finally:
        consumer.shutdown()
    cluster.admin.set_group_fifo(group, False)
    assert _telemetry_fifo(stub, config, group) is False


class _Listener(MessageListener):
    """Fails each message's first delivery, takes the second."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, bytes]] = []

    def consume(self, message: Message) -> ConsumeResult:
        self.seen.append((message.message_id, message.delivery_attempt, message.body))
        return ConsumeResult.FAILURE if message.delivery_attempt == 1 else ConsumeResult.SUCCESS


def test_official_push_consumer_retries_a_failed_message(cluster: Any, config: Any) -> None:
    """The 5.x PushConsumer: its start waits for the server's settings, it asks for its
    assignments, receives with auto-renew, and a message its listener fails comes again
    (delivery attempt 2) after RocketMQ's first retry delay."""
    native = cluster.producer("grpc-native-push")
    try:
        sent = {
            native.send(NativeMessage(PUSH_TOPIC, f"push-{i}".encode())).msg_id: f"push-{i}"
            for i in range(3)
        }
    finally:
        native.close()
    listener = _Listener()
    consumer = PushConsumer(config, "grpc-push-group", listener, {PUSH_TOPIC: FilterExpression()})
    consumer.startup()
    try:
        wait_until(
            lambda: {(i, a) for i, a, _ in listener.seen} >= {(i, 2) for i in sent},
            what="every message delivered twice",
        )
    finally:
        consumer.shutdown()
    assert {(i, a, b) for i, a, b in listener.seen} == {
        (i, a, body.encode()) for i, body in sent.items() for a in (1, 2)
    }


class _SlowListener(MessageListener):
    """Holds each message until told to let go, then takes it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, bytes]] = []
        self.release = threading.Event()

    def consume(self, message: Message) -> ConsumeResult:
        self.seen.append((message.message_id, message.delivery_attempt, message.body))
        self.release.wait(30)
        return ConsumeResult.SUCCESS


def _renew_stats(cluster: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in cluster.grpc_endpoints().values():
        for k, v in e["stats"].items():
            if k.startswith("auto_renew_"):
                out[k] = out.get(k, 0) + v
    return out


def test_a_push_consumers_long_listener_keeps_its_message_invisible(
    cluster: Any, config: Any
) -> None:
    """The 5.x PushConsumer receives with ``auto_renew`` and never renews anything itself:
    the broker does, while the client is alive. A listener holding its message through
    several invisible times (1 s each here) is not given it again, and its ack, made with
    the receipt handle it first got, is taken: the group has nothing left."""
    group = "grpc-renew-group"
    ((msg_id, body),) = _send_native(cluster, RENEW_TOPIC, "renew", 1).items()
    before = _renew_stats(cluster)
    listener = _SlowListener()
    consumer = PushConsumer(config, group, listener, {RENEW_TOPIC: FilterExpression()})
    consumer.startup()
    try:
        wait_until(lambda: listener.seen, what="the message in the listener")
        wait_until(  # its 1 s lapsed three times over: renewed each time
            lambda: _renew_stats(cluster)["auto_renew_renewed"] >= before["auto_renew_renewed"] + 3,
            what="three renewals",
        )
        listener.release.set()
        wait_until(
            lambda: sum(r["lag"] for r in cluster.admin.consumer_lag(group, RENEW_TOPIC)) == 0,
            what="the ack under the first handle",
        )
    finally:
        listener.release.set()
        consumer.shutdown()
    assert listener.seen == [(msg_id, 1, body)]  # never delivered again
    after = _renew_stats(cluster)
    assert after["auto_renew_renew_failed"] == before["auto_renew_renew_failed"]
    assert after["auto_renew_held"] == 0


def test_tls_with_the_data_paths_certificate(make_cluster: Any, tmp_path: Path) -> None:
    """Given a certificate, the endpoint speaks TLS only: a client that trusts it sends;
    a plain-text client gets nothing."""
    cert, key = tmp_path / "broker.pem", tmp_path / "broker.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=raymq-test", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    c = make_cluster(
        nameservers=1,
        brokers=1,
        topics=["grpc-sealed", "grpc-sealed-official"],
        broker_options={
            "grpc_enable": True,
            "grpc_bind": "127.0.0.1",
            "data_tls_cert": str(cert),
            "data_tls_key": str(key),
        },
    )
    (info,) = c.grpc_endpoints().values()
    assert info["tls"] is True
    config = ClientConfiguration(info["addr"], Credentials(*c.grpc_credentials()))
    req = SendMessageRequest()
    m = req.messages.add()
    m.topic.name = "grpc-sealed"
    m.body = b"sealed"
    m.system_properties.message_id = "01SEALED"
    trusted = grpc.secure_channel(
        info["addr"], grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    )
    plain = grpc.insecure_channel(info["addr"])
    try:
        answer = MessagingServiceStub(trusted).SendMessage(req, metadata=_signed(config))
        assert answer.status.code == Code.OK
        assert answer.entries[0].message_id == "01SEALED"
        with pytest.raises(grpc.RpcError) as refused:
            MessagingServiceStub(plain).SendMessage(req, metadata=_signed(config), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        trusted.close()
        plain.close()
    # the official client with tls_enable, trusting the certificate as a system root
    ak, sk = c.grpc_credentials()
    args = {"addr": info["addr"], "ak": ak, "sk": sk, "topic": "grpc-sealed-official", "group": "g"}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "official_tls_client.py"), json.dumps(args)],
        env={**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(cert)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["got"] == [[out["sent"], "sealed by the official client"]]


# ------------------------------------------------------------ the official Node.js client
def test_the_official_nodejs_client_produces_and_consumes(
    cluster: Any, endpoints: dict[str, Any]
) -> None:
    ak, sk = cluster.grpc_credentials()
    common = {"endpoints": endpoints["broker-a-0"]["addr"], "accessKey": ak, "secretKey": sk}
    # Node.js in, RayMQ's own consumer out: same bodies, same ids
    sent = node_client(
        {**common, "mode": "produce", "topic": NODE_TOPIC, "count": 20, "prefix": "js", "tag": "n"}
    )["sent"]
    assert len(sent) == 20 and len({s["id"] for s in sent}) == 20
    stored = _by_id(cluster, NODE_TOPIC)
    assert {i: m.body.decode() for i, m in stored.items()} == {s["id"]: s["body"] for s in sent}
    assert {m.tags for m in stored.values()} == {"n"}
    # RayMQ's own producer in, the Node.js SimpleConsumer out (POP through gRPC)
    native = cluster.producer("grpc-node-native")
    try:
        results = [
            native.send(NativeMessage(NODE_IN_TOPIC, f"py-{i}".encode(), tags="p"))
            for i in range(20)
        ]
    finally:
        native.close()
    got = node_client(
        {
            **common,
            "mode": "consume",
            "topic": NODE_IN_TOPIC,
            "group": "node-group",
            "count": 20,
            "tag": "p",
            "timeoutMs": 60000,
        }
    )["got"]
    assert sorted((g["id"], g["body"]) for g in got) == sorted(
        (r.msg_id, f"py-{i}") for i, r in enumerate(results)
    )
    assert {g["tag"] for g in got} == {"p"}


# ------------------------------------------------------------ a broker restart (its own cluster)
def _free_port() -> int:
    """A free port below the kernel's ephemeral range: while the broker restarts, no
    connection of this machine can take it as its local port (a port from ``bind(0)``
    can, and the restarted broker then has no gRPC door)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10_000, max(low, 10_001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in 10000..{low}")


def test_a_broker_whose_grpc_port_is_held_binds_it_once_it_is_free(make_cluster: Any) -> None:
    """A configured ``grpc_port`` held by another socket when the broker starts: the
    broker serves without its door meanwhile and binds the port once it is free."""
    port = _free_port()
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    try:
        c = make_cluster(
            nameservers=1,
            brokers=1,
            topics=["HeldPort"],
            broker_options={"grpc_enable": True, "grpc_bind": "127.0.0.1", "grpc_port": port},
        )
        assert c.grpc_endpoints() == {}
        producer = c.producer("p-held-port")
        sent = producer.send(NativeMessage("HeldPort", b"meanwhile"))
        assert sent.status is SendStatus.SEND_OK
        producer.close()
    finally:
        holder.close()
    (info,) = wait_until(lambda: list(c.grpc_endpoints().values()), what="the door bound")
    assert info["addr"] == f"127.0.0.1:{port}"
    with grpc.insecure_channel(info["addr"]) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)


def test_a_broker_restart_during_grpc_consumption_loses_nothing(make_cluster: Any) -> None:
    """The official SimpleConsumer receives and acks half; the broker is killed (SIGKILL)
    and Ray restarts it on the same gRPC port: every unacked message comes back after its
    invisible time, with delivery attempt 2, none acked comes again, none is lost; the
    group's FIFO flag survives too."""
    topic = "grpc-restart"
    c = make_cluster(
        nameservers=1,
        brokers=1,
        topics=[TopicConfig(topic, read_queue_nums=2, write_queue_nums=2)],
        broker_options={
            "grpc_enable": True,
            "grpc_bind": "127.0.0.1",
            "grpc_port": _free_port(),  # the clients' endpoint stays where it was
            "pop_revive_interval_s": 0.05,
        },
    )
    c.admin.set_group_fifo("grpc-fifo-kept")
    (info,) = c.grpc_endpoints().values()
    config = ClientConfiguration(info["addr"], Credentials(*c.grpc_credentials()))
    sent = _send_native(c, topic, "restart", 10)
    invisible_s = 4
    consumer = SimpleConsumer(config, "grpc-restart", {topic: FilterExpression()}, await_duration=1)
    consumer.startup()
    try:
        started = time.monotonic()
        got = _receive_ids(consumer, set(sent), invisible_s)
        assert {i: m.body for i, m in got.items()} == sent
        ids = sorted(got)
        acked, unacked = set(ids[::2]), set(ids[1::2])
        for msg_id in acked:
            consumer.ack(got[msg_id])

        broker = c.broker("broker-a")
        before = ray.get(broker.ping.remote())
        ray.kill(broker, no_restart=False)  # SIGKILL; Ray restarts it and it recovers

        def restarted() -> bool:
            try:
                return ray.get(c.broker("broker-a").ping.remote(), timeout=5) != before
            except Exception:  # noqa: BLE001 - still restarting
                return False

        wait_until(restarted, timeout_s=60, what="the broker restarted")
        back: dict[str, Any] = {}

        def all_back() -> bool:
            try:
                batch = consumer.receive(16, 30)
            except Exception:  # noqa: BLE001 - the client's channel is reconnecting
                return False
            for m in batch:
                assert m.message_id not in acked, "an acked message came again"
                back[m.message_id] = m
                consumer.ack(m)
            return set(back) >= unacked

        wait_until(all_back, timeout_s=40, interval_s=0, what="every unacked message")
        assert time.monotonic() - started >= invisible_s
        assert set(back) == unacked
        assert {i: m.body for i, m in back.items()} == {i: sent[i] for i in unacked}
        assert {m.delivery_attempt for m in back.values()} == {2}
    finally:
        consumer.shutdown()
    (info,) = c.grpc_endpoints().values()
    channel = grpc.insecure_channel(info["addr"])
    try:
        assert _telemetry_fifo(MessagingServiceStub(channel), config, "grpc-fifo-kept") is True
    finally:
        channel.close()
