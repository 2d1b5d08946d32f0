"""Concurrent consumption (RocketMQ's ``ConsumeMessageConcurrentlyService``) against a
real broker: every batch of a queue goes to the pool, so one hot queue is consumed by
every consume thread; the committed offset still never passes a message that is not
done; a stuck message bounds how far the queue is pulled ahead; orderly consumption
stays one batch at a time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from raymq_testkit import PUSH_FAST, SMALL_STORE, unique_namespace, wait_until

import actors
from actors import ConsumeStatus, PushConsumer
from actors.client.push.process_queue import CONSUME_CONCURRENTLY_MAX_SPAN, PullState
from storage import Message

FAST = {**PUSH_FAST, "consume_from": "FIRST"}


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = actors.start_cluster(
        namespace=unique_namespace("concurrent"),
        nameservers=1,
        brokers=1,
        store_root=str(tmp_path_factory.mktemp("concurrent")),
        broker_options={
            # retries come back after 100 ms rather than RocketMQ's 10 s
            "store": {**SMALL_STORE, "message_delay_level": "100ms 200ms 300ms 400ms"},
            "heartbeat_interval_s": 2.0,
        },
    )
    yield c
    c.shutdown()


def push(cluster: actors.Cluster, group: str, topic: str, listener: Any, **options: Any) -> Any:
    return PushConsumer(
        group, topic, listener=listener, namespace=cluster.namespace, **{**FAST, **options}
    ).start()


def one_queue_topic(cluster: actors.Cluster, topic: str, bodies: list[bytes]) -> list[str]:
    """A topic of one queue holding ``bodies`` at offsets 0, 1, ...; their message ids."""
    cluster.admin.create_topic(topic, 1, 1, brokers=["broker-a"])
    producer = cluster.producer(f"p-{topic}", max_batch_messages=1000)
    try:
        return [r.msg_id for r in producer.send_batch([Message(topic, b) for b in bodies])]
    finally:
        producer.close()


def committed(cluster: actors.Cluster, group: str, topic: str) -> int:
    return int(ray.get(cluster.broker("broker-a").query_offset.remote(group, topic, 0)))


class Worker:
    """A listener that works ``work_s`` per call and records what ran when, and how
    many calls ran at once."""

    def __init__(self, work_s: float) -> None:
        self.work_s = work_s
        self.lock = threading.Lock()
        self.active = self.peak = 0
        self.calls: list[tuple[float, float, list[int]]] = []  # start, end, offsets

    def __call__(self, messages: list[Any]) -> ConsumeStatus:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        started = time.monotonic()
        time.sleep(self.work_s)
        with self.lock:
            self.active -= 1
            self.calls.append((started, time.monotonic(), [m.queue_offset for m in messages]))
        return ConsumeStatus.SUCCESS

    def offsets(self) -> list[int]:
        with self.lock:
            return [o for _, _, offsets in self.calls for o in offsets]

    def rate(self) -> float:
        """Messages per second, from the first call's start to the last call's end."""
        with self.lock:
            first = min(start for start, _, _ in self.calls)
            last = max(end for _, end, _ in self.calls)
            return sum(len(o) for _, _, o in self.calls) / (last - first)


def consume_hot_queue(cluster: actors.Cluster, threads: int, n: int) -> Worker:
    """``n`` messages in one queue through a consumer of ``threads`` consume threads and a
    listener working 50 ms per call; checks each arrived once and all were committed."""
    topic, group = f"ConcHot{threads}", f"g-conc-hot-{threads}"
    one_queue_topic(cluster, topic, [b"m%04d" % i for i in range(n)])
    worker = Worker(work_s=0.05)
    consumer = push(cluster, group, topic, worker, consume_threads=threads)
    try:
        wait_until(lambda: len(worker.offsets()) >= n, timeout_s=60, what="every message")
        wait_until(lambda: committed(cluster, group, topic) == n, what="all committed")
    finally:
        consumer.shutdown()
    assert sorted(worker.offsets()) == list(range(n))  # each message once, none lost
    return worker


def test_one_hot_queue_is_consumed_by_every_consume_thread(cluster: actors.Cluster) -> None:
    one = consume_hot_queue(cluster, threads=1, n=30)  # about 1.5 s of listener work each
    eight = consume_hot_queue(cluster, threads=8, n=240)
    ratio = eight.rate() / one.rate()
    print(f"1 queue, 50 ms per call: {one.rate():.0f} vs {eight.rate():.0f} msg/s, {ratio:.1f}x")
    assert (one.peak, eight.peak) == (1, 8)
    # 8x when the machine is idle; one call at a time would be 1x. A loaded 2-core CI
    # machine was seen at 5.4x: the bound says "in parallel", not how fast
    assert ratio >= 3


def test_the_committed_offset_never_passes_a_message_still_being_consumed(
    cluster: actors.Cluster,
) -> None:
    topic, group, n = "ConcHold", "g-conc-hold", 200
    bodies = [b"m%04d" % i for i in range(n)]
    bodies[10], bodies[20] = b"slow", b"fail"
    ids = one_queue_topic(cluster, topic, bodies)
    entered, release = threading.Event(), threading.Event()
    lock = threading.Lock()
    done: list[tuple[str, int, str]] = []  # msg id, reconsume times, topic the listener saw

    def listener(messages: list[Any]) -> ConsumeStatus:
        for m in messages:
            if m.body == b"slow":
                entered.set()
                release.wait(30)
            if m.body == b"fail" and m.reconsume_times == 0:
                return ConsumeStatus.RECONSUME_LATER
        with lock:
            done.extend((m.msg_id, m.reconsume_times, m.topic) for m in messages)
        return ConsumeStatus.SUCCESS

    consumer = push(cluster, group, topic, listener, consume_threads=8)
    try:
        assert entered.wait(20)
        # the queue goes on around the slow message, the failed one through the retry topic
        wait_until(lambda: len(done) == n - 1, what="every message but the slow one")
        [pq] = [pq for pq in consumer.process_queues() if pq.mq.topic == topic]
        assert pq.commit_offset() == 10
        wait_until(lambda: committed(cluster, group, topic) == 10, what="offset 10 committed")
        assert {mq.topic: off for mq, off in consumer.persist_offsets().items()}[topic] == 10
        assert committed(cluster, group, topic) == 10  # never past the slow message
        release.set()
        wait_until(lambda: committed(cluster, group, topic) == n, what="the rest committed")
    finally:
        release.set()
        consumer.shutdown()
    assert sorted(i for i, _, _ in done) == sorted(ids)  # each once, none lost
    assert {t for _, _, t in done} == {topic}  # a retry is seen under its original topic
    assert [r for i, r, _ in done if i == ids[20]] == [1]
    status = consumer.status()
    assert (status["reconsume_later"], status["sent_back"], status["consumed"]) == (1, 1, n)


def test_a_stuck_message_bounds_how_far_its_queue_is_pulled_ahead(
    cluster: actors.Cluster,
) -> None:
    topic, group, n = "ConcSpan", "g-conc-span", CONSUME_CONCURRENTLY_MAX_SPAN + 600
    one_queue_topic(cluster, topic, [b"stuck"] + [b"m%05d" % i for i in range(1, n)])
    entered, release = threading.Event(), threading.Event()
    count = [0]
    lock = threading.Lock()

    def listener(messages: list[Any]) -> ConsumeStatus:
        if messages[0].body == b"stuck":
            entered.set()
            release.wait(30)
        with lock:
            count[0] += len(messages)
        return ConsumeStatus.SUCCESS

    # held pulls: one pull past the span at most (a subscription stops within its credit
    # window, tests/actors/push/test_push_stream.py)
    consumer = push(
        cluster, group, topic, listener, consume_threads=4, pull_batch_size=64, delivery="pull"
    )
    try:
        assert entered.wait(20)
        wait_until(lambda: consumer.status().get("flow_control_pauses", 0) >= 1, what="a pause")
        [pq] = [pq for pq in consumer.process_queues() if pq.mq.topic == topic]
        wait_until(lambda: count[0] >= pq.next_offset - 1, what="what was pulled consumed")
        # pulling stopped within one pull past the span and stays stopped, though all the
        # buffer holds now is the stuck message
        assert pq.state is PullState.PAUSED and pq.buffered == 1
        assert CONSUME_CONCURRENTLY_MAX_SPAN < pq.next_offset <= CONSUME_CONCURRENTLY_MAX_SPAN + 64
        assert committed(cluster, group, topic) == 0
        release.set()
        wait_until(lambda: committed(cluster, group, topic) == n, what="the rest after the stuck")
        assert count[0] == n
    finally:
        release.set()
        consumer.shutdown()


def test_an_orderly_consumer_still_runs_one_batch_of_a_queue_at_a_time(
    cluster: actors.Cluster,
) -> None:
    topic, group, n = "ConcOrderly", "g-conc-orderly", 40
    one_queue_topic(cluster, topic, [b"m%04d" % i for i in range(n)])
    worker = Worker(work_s=0.01)
    consumer = push(cluster, group, topic, worker, orderly=True, consume_threads=8)
    try:
        wait_until(lambda: len(worker.offsets()) >= n, what="every message")
    finally:
        consumer.shutdown()
    assert worker.peak == 1 and worker.offsets() == list(range(n))


def test_consume_on_io_thread_consumes_an_arrival_there_and_hands_a_burst_on(
    cluster: actors.Cluster,
) -> None:
    """``consume_on_io_thread``: a message that arrives alone is consumed on the client's
    I/O thread, with no consume thread woken; records that arrive together are all
    consumed once, the first batch there and the others on consume threads; a batch the
    listener fails there goes to the retry topic and comes back, as from a consume
    thread; the offset is committed past all of them."""
    topic, group = "ConcOnIoThread", "g-conc-on-io-thread"
    cluster.admin.create_topic(topic, 1, 1, brokers=["broker-a"])
    lock = threading.Lock()
    seen: list[tuple[bytes, str, int]] = []  # body, thread, reconsume_times

    def listener(messages: list[Any]) -> ConsumeStatus:
        with lock:
            seen.extend(
                (m.body, threading.current_thread().name, m.reconsume_times) for m in messages
            )
        if any(m.body == b"fail-once" and m.reconsume_times == 0 for m in messages):
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.SUCCESS

    def bodies_seen() -> list[bytes]:
        with lock:
            return [body for body, _, _ in seen]

    consumer = push(cluster, group, topic, listener, consume_on_io_thread=True)
    producer = cluster.producer(f"p-{topic}", max_batch_messages=1000)
    try:
        alone = [b"alone-%02d" % i for i in range(10)]
        for body in alone:  # each sent once the one before was consumed: it arrives alone
            producer.send(Message(topic, body))
            wait_until(lambda b=body: b in bodies_seen(), what=f"{body!r} consumed")
        burst = [b"burst-%03d" % i for i in range(200)]
        producer.send_batch([Message(topic, b) for b in burst])  # stored, and read, together
        wait_until(lambda: set(burst) <= set(bodies_seen()), timeout_s=60, what="the burst")
        producer.send(Message(topic, b"fail-once"))
        wait_until(lambda: bodies_seen().count(b"fail-once") == 2, what="the retried message")
        wait_until(lambda: committed(cluster, group, topic) == 211, what="all committed")
    finally:
        producer.close()
        consumer.shutdown()
    with lock:
        threads = {body: name for body, name, times in seen if times == 0}
        counts = {body: [b for b, _, t in seen if t == 0].count(body) for body in threads}
    assert all(n == 1 for n in counts.values())  # each message once (before its retry)
    assert all(threads[b] == "raymq-client-io" for b in alone)
    on_io = [b for b in burst if threads[b] == "raymq-client-io"]
    # one batch (a message) per arrival there: the burst came in a few answers
    assert 1 <= len(on_io) < len(burst) // 4, len(on_io)
    assert any(threads[b].startswith("raymq-consume") for b in burst)
    assert threads[b"fail-once"] == "raymq-client-io"
    with lock:
        assert [t for b, _, t in seen if b == b"fail-once"] == [0, 1]


def test_a_synchronous_send_on_the_io_thread_raises_at_once_and_send_async_works_there(
    cluster: actors.Cluster,
) -> None:
    """A listener on the I/O thread cannot wait for an answer that thread reads: its
    ``Producer.send`` raises at once (it used to wait out the send's timeout, and then
    an idempotent run's ``delivery_timeout_s``, with every connection stalled), and its
    ``send_async`` is sent and answered."""
    topic, out = "ConcOnIoThreadSend", "ConcOnIoThreadSendOut"
    cluster.admin.create_topic(topic, 1, 1, brokers=["broker-a"])
    cluster.admin.create_topic(out, 1, 1, brokers=["broker-a"])
    producer = cluster.producer(f"p-{topic}")
    tried: list[tuple[BaseException | None, float]] = []
    forwarded: list[Any] = []

    def listener(messages: list[Any]) -> ConsumeStatus:
        started = time.monotonic()
        try:
            producer.send(Message(out, b"sync"))
            error: BaseException | None = None
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            error = exc
        tried.append((error, time.monotonic() - started))
        forwarded.append(producer.send_async(Message(out, b"async")))
        return ConsumeStatus.SUCCESS

    consumer = push(cluster, "g-conc-on-io-send", topic, listener, consume_on_io_thread=True)
    try:
        producer.send(Message(topic, b"in"))
        wait_until(lambda: len(forwarded) == 1, what="the listener's call")
        result = forwarded[0].result(timeout=10)
    finally:
        consumer.shutdown()
        producer.close()
    ((error, took),) = tried
    assert isinstance(error, RuntimeError) and "I/O thread" in str(error), error
    assert took < 1.0  # refused before anything was sent, not timed out
    assert result.queue_offset == 0  # the send_async was stored: the first in its queue
