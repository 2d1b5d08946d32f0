"""Retries and dead letters: RECONSUME_LATER sends a message back to the broker, which
redelivers it through ``%RETRY%<group>`` after the level delay, and parks it in
``%DLQ%<group>`` after ``max_reconsume_times``; operators list and resend dead letters."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from raymq_testkit import PUSH_FAST, start_push_cluster, wait_until

import actors
from actors import ConsumeStatus, PullStatus, PushConsumer
from actors.tools.cli import main as cli
from rebalance import MessageQueue
from storage import Message, codec
from storage.errors import PermissionDeniedError

LEVELS_MS = [100, 200, 300, 400, 500, 600, 700, 800]
FAST = {
    **PUSH_FAST,
    "consume_from": "FIRST",
}


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = start_push_cluster(
        "retry",
        str(tmp_path_factory.mktemp("retry")),
        message_delay_level=" ".join(f"{ms}ms" for ms in LEVELS_MS),
    )
    yield c
    c.shutdown()


class Deliveries:
    """Per message id: (arrival time, reconsume times, the message) of each delivery."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_id: dict[str, list[tuple[float, int, Any]]] = defaultdict(list)

    def record(self, messages: list[Any]) -> None:
        now = time.time()
        with self.lock:
            for m in messages:
                self.by_id[m.msg_id].append((now, m.reconsume_times, m))

    def of(self, msg_id: str) -> list[tuple[float, int, Any]]:
        with self.lock:
            return list(self.by_id.get(msg_id, []))


def push(cluster: actors.Cluster, group: str, topic: str, listener: Any, **options: Any) -> Any:
    return PushConsumer(
        group, topic, listener=listener, namespace=cluster.namespace, **{**FAST, **options}
    ).start()


def total_lag(cluster: actors.Cluster, group: str) -> int:
    return sum(r["lag"] for r in cluster.admin.consumer_lag(group))


def test_the_broker_builds_retry_and_dead_letter_copies(cluster: actors.Cluster) -> None:
    cluster.admin.create_topic("Direct", 1, 1, brokers=["broker-a"])
    producer = cluster.producer("p-direct")
    sent = producer.send(Message("Direct", b"payload", tags="T1", keys=["k1", "k2"]))
    _, offset = codec.parse_offset_msg_id(sent.offset_msg_id)
    broker = cluster.broker("broker-a")
    outcome = ray.get(broker.consumer_send_msg_back.remote("g-direct", [offset, 1 << 40], 16))
    assert outcome == ["RETRY", "NOT_FOUND"]
    assert ray.get(broker.consumer_send_msg_back.remote("g-direct", [offset], 0)) == ["DLQ"]
    dlq = ray.get(broker.get_topic_config.remote("%DLQ%g-direct"))
    assert (dlq.perm, dlq.read_queue_nums, dlq.write_queue_nums) == (2, 1, 1)
    retry = ray.get(broker.get_topic_config.remote("%RETRY%g-direct"))
    assert (retry.perm, retry.read_queue_nums) == (6, 1)

    puller = cluster.pull_consumer("g-direct")
    mq = MessageQueue("%RETRY%g-direct", "broker-a", 0)
    result = wait_until(
        lambda: (r := puller.pull(mq, 0)).status is PullStatus.FOUND and r,
        what="the retry copy after its level's delay",
    )
    copy = result.messages[0]
    assert copy.msg_id == sent.msg_id  # the same id across retries
    assert (copy.body, copy.tags, copy.keys, copy.reconsume_times) == (
        b"payload",
        "T1",
        ("k1", "k2"),
        1,
    )
    assert copy.properties["RETRY_TOPIC"] == "Direct"
    assert copy.properties["ORIGIN_MESSAGE_ID"] == sent.msg_id
    assert copy.properties["RECONSUME_TIME"] == "1"
    assert copy.store_timestamp - copy.born_timestamp >= LEVELS_MS[2]  # level 3 + 0 retries
    with pytest.raises(PermissionDeniedError):
        puller.pull(MessageQueue("%DLQ%g-direct", "broker-a", 0), 0)
    producer.close()


def test_a_message_failed_twice_arrives_three_times_spaced_by_the_level_delays(
    cluster: actors.Cluster,
) -> None:
    topic, group = "RetryTwice", "g-twice"
    cluster.admin.create_topic(topic, 1, 1)
    seen = Deliveries()

    def listener(messages: list[Any]) -> ConsumeStatus:
        seen.record(messages)
        if any(m.keys == ("bad",) and m.reconsume_times < 2 for m in messages):
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.SUCCESS

    consumer = push(cluster, group, topic, listener)
    try:
        producer = cluster.producer("p-twice")
        bad = producer.send(Message(topic, b"bad", tags="X", keys="bad")).msg_id
        good = [r.msg_id for r in producer.send_batch([Message(topic, b"ok")] * 20)]
        producer.close()
        wait_until(lambda: len(seen.of(bad)) >= 3, what="three deliveries")
        wait_until(lambda: total_lag(cluster, group) == 0, what="everything consumed")
        got = seen.of(bad)
        assert [times for _, times, _ in got] == [0, 1, 2]
        (t0, _, first), (t1, _, second), (t2, _, third) = got
        assert t1 - t0 >= LEVELS_MS[2] / 1000 - 0.005  # level 3 + 0
        assert t2 - t1 >= LEVELS_MS[3] / 1000 - 0.005  # level 3 + 1
        for m in (first, second, third):
            assert (m.topic, m.body, m.tags, m.keys) == (topic, b"bad", "X", ("bad",))
        assert second.properties["ORIGIN_MESSAGE_ID"] == bad
        assert third.properties["RETRY_TOPIC"] == topic
        assert all(len(seen.of(g)) == 1 for g in good)
        assert consumer.status()["sent_back"] == 2
    finally:
        consumer.shutdown()


def test_an_always_failing_message_goes_to_the_dlq_and_resend_brings_it_back(
    cluster: actors.Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    topic, group = "RetryPoison", "g-poison"
    cluster.admin.create_topic(topic, 1, 1)
    seen = Deliveries()
    failing = {"on": True}

    def listener(messages: list[Any]) -> ConsumeStatus:
        seen.record(messages)
        if failing["on"] and any(m.tags == "poison" for m in messages):
            raise ValueError("cannot handle this one")
        return ConsumeStatus.SUCCESS

    consumer = push(cluster, group, topic, listener, max_reconsume_times=2)
    try:
        producer = cluster.producer("p-poison")
        poison = producer.send(Message(topic, b"bad", tags="poison", keys="p1")).msg_id
        producer.send_batch([Message(topic, b"fine")] * 10)
        letters = wait_until(lambda: cluster.admin.dlq_messages(group), what="a dead letter")
        wait_until(lambda: total_lag(cluster, group) == 0, what="nothing left to redeliver")
        assert [m.msg_id for m in letters] == [poison]
        assert letters[0].reconsume_times == 3 and letters[0].properties["RETRY_TOPIC"] == topic
        assert [times for _, times, _ in seen.of(poison)] == [0, 1, 2]  # not delivered again
        assert consumer.status()["sent_to_dlq"] == 1
        dlq = f"%DLQ%{group}"
        route = cluster.admin.topic_route(dlq)
        assert [q.perm for q in route.queue_datas] == [2]  # consumers cannot read it

        assert (
            cli(["dlq", "list", "--group", group, "--namespace", cluster.namespace, "--json"]) == 0
        )
        listed = json.loads(capsys.readouterr().out)
        assert [(r["msg_id"], r["origin_topic"]) for r in listed] == [(poison, topic)]

        failing["on"] = False
        resent = cluster.admin.resend_dlq(group)
        assert [r.msg_id for r in resent] == [poison]
        assert resent[0].message_queue.topic == topic
        wait_until(lambda: len(seen.of(poison)) >= 4, what="the resent message")
        _, times, m = seen.of(poison)[3]
        assert (times, m.topic, m.keys) == (0, topic, ("p1",))

        cluster.admin.set_topic_perm(dlq, 6)
        reader = cluster.pull_consumer("operator")
        got = reader.pull(MessageQueue(dlq, route.queue_datas[0].broker_name, 0), 0)
        assert [x.msg_id for x in got.messages] == [poison]
    finally:
        consumer.shutdown()


def test_send_backs_are_batched_and_a_failed_send_back_is_retried_locally(
    cluster: actors.Cluster,
) -> None:
    topic, group, n = "RetryBatch", "g-batch", 300
    cluster.admin.create_topic(topic, 1, 1, brokers=["broker-a"])
    seen = Deliveries()

    def listener(messages: list[Any]) -> ConsumeStatus:
        seen.record(messages)
        return (
            ConsumeStatus.SUCCESS if messages[0].reconsume_times else ConsumeStatus.RECONSUME_LATER
        )

    broker = cluster.broker("broker-a")
    before = ray.get(broker.status.remote())
    consumer = push(cluster, group, topic, listener)
    try:
        retry = f"%RETRY%{group}"
        cluster.admin.set_topic_perm(retry, 4)  # the broker now refuses the send-backs
        ids = [r.msg_id for r in cluster.producer("p-batch").send_batch([Message(topic, b"m")] * n)]
        wait_until(
            lambda: consumer.status().get("send_back_failures", 0) >= 2 * n,
            what="failed send-backs retried locally",
        )
        assert all(times == 0 for i in ids for _, times, _ in seen.of(i))
        cluster.admin.set_topic_perm(retry, 6)
        wait_until(
            lambda: all(any(t == 1 for _, t, _ in seen.of(i)) for i in ids),
            timeout_s=30,
            what="every message redelivered through the retry topic",
        )
        after = ray.get(broker.status.remote())
        msgs = after.get("send_back_msgs", 0) - before.get("send_back_msgs", 0)
        calls = after.get("send_back_calls", 0) - before.get("send_back_calls", 0)
        assert msgs >= n
        assert calls <= n // 5, f"{calls} broker calls for {msgs} messages"
        wait_until(lambda: total_lag(cluster, group) == 0, what="offsets committed")
    finally:
        consumer.shutdown()


def test_an_exception_or_a_timeout_counts_as_reconsume_later(cluster: actors.Cluster) -> None:
    topic, group = "RetryTimeout", "g-timeout"
    cluster.admin.create_topic(topic, 2, 2, brokers=["broker-b"])
    seen = Deliveries()

    def listener(messages: list[Any]) -> ConsumeStatus:
        seen.record(messages)
        m = messages[0]
        if m.reconsume_times == 0 and m.body == b"raise":
            raise RuntimeError("boom")
        if m.reconsume_times == 0 and m.body == b"slow":
            time.sleep(1.5)
        return ConsumeStatus.SUCCESS

    consumer = push(cluster, group, topic, listener, consume_timeout_s=0.5)
    try:
        producer = cluster.producer("p-timeout", max_batch_messages=1)
        ids = {
            r.msg_id: b
            for b, r in ((b, producer.send(Message(topic, b))) for b in (b"raise", b"slow"))
        }
        wait_until(lambda: all(len(seen.of(i)) >= 2 for i in ids), what="both delivered again")
        for i in ids:
            assert [t for _, t, _ in seen.of(i)][:2] == [0, 1]
        status = consumer.status()
        assert status["listener_errors"] >= 1 and status["consume_timeouts"] >= 1
    finally:
        consumer.shutdown()
