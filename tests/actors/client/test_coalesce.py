"""Single asynchronous sends are coalesced into batches, none lost, order kept per topic."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
import ray
from raymq_testkit import drain

from actors.client.coalescer import SendCoalescer
from storage import Message
from storage.errors import InvalidMessageError


def test_waiting_messages_leave_together_when_the_wire_frees() -> None:
    calls: list[list[bytes]] = []
    answers: list[concurrent.futures.Future[Any]] = []

    def send(batch: list[Message]) -> concurrent.futures.Future[Any]:
        calls.append([m.body for m in batch])
        f: concurrent.futures.Future[Any] = concurrent.futures.Future()
        answers.append(f)
        return f

    coalescer = SendCoalescer(send, max_in_flight=1)
    futures = [coalescer.submit(Message("T", b"%d" % i)) for i in range(100)]
    assert calls == [[b"0"]], "the first message leaves at once"
    answers[0].set_result(["r0"])
    assert calls[1] == [b"%d" % i for i in range(1, 100)], "the rest leave as one batch"
    answers[1].set_result([f"r{i}" for i in range(1, 100)])
    assert [f.result(timeout=1) for f in futures] == [f"r{i}" for i in range(100)]


def test_a_failed_batch_fails_each_of_its_messages_only() -> None:
    answers: list[concurrent.futures.Future[Any]] = []

    def send(batch: list[Message]) -> concurrent.futures.Future[Any]:
        f: concurrent.futures.Future[Any] = concurrent.futures.Future()
        answers.append(f)
        return f

    coalescer = SendCoalescer(send, max_in_flight=1)
    first = coalescer.submit(Message("T", b"a"))
    second = coalescer.submit(Message("T", b"b"))
    answers[0].set_exception(RuntimeError("broker gone"))
    assert isinstance(first.exception(timeout=1), RuntimeError)
    answers[1].set_result(["ok"])
    assert second.result(timeout=1) == "ok"


def test_thousands_of_single_async_sends_arrive_once(make_cluster: Any) -> None:
    cluster = make_cluster(brokers=1)
    cluster.admin.create_topic("Coalesced", 4, 4)
    with cluster.producer("coalesce-producer") as producer:
        futures = [producer.send_async(Message("Coalesced", b"%d" % i)) for i in range(3000)]
        results = [f.result(timeout=60) for f in futures]
    assert len({r.msg_id for r in results}) == 3000
    consumer = cluster.pull_consumer("coalesce-consumer")
    seen: list[int] = []
    for mq in consumer.fetch_subscribe_queues("Coalesced"):
        pulled = consumer.pull(mq, 0, 4000)
        bodies = [int(b) for b in pulled.bodies]
        assert bodies == sorted(bodies), "order within a queue follows submission order"
        seen += bodies
    assert sorted(seen) == list(range(3000))


def test_a_refused_batch_is_resent_one_message_at_a_time() -> None:
    calls: list[list[bytes]] = []
    first: list[concurrent.futures.Future[Any]] = []

    def send(batch: list[Message]) -> concurrent.futures.Future[Any]:
        calls.append([m.body for m in batch])
        f: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if not first:  # the first call stays on the wire until the others queue up
            first.append(f)
            return f
        if any(m.body == b"bad" for m in batch):
            raise InvalidMessageError("body 'bad' refused")
        f.set_result([b"ok:" + m.body for m in batch])
        return f

    coalescer = SendCoalescer(send, max_in_flight=1)
    futures = [coalescer.submit(Message("T", body)) for body in (b"0", b"1", b"bad", b"3")]
    first[0].set_result([b"ok:0"])
    assert calls[1] == [b"1", b"bad", b"3"]  # tried together, refused as a whole
    assert calls[2:] == [[b"1"], [b"bad"], [b"3"]]  # then each alone
    assert futures[1].result(timeout=1) == b"ok:1" and futures[3].result(timeout=1) == b"ok:3"
    with pytest.raises(InvalidMessageError, match="'bad' refused"):
        futures[2].result(timeout=1)


def test_short_lists_wait_with_single_messages_and_each_gets_its_own_part() -> None:
    calls: list[list[bytes]] = []
    answers: list[concurrent.futures.Future[Any]] = []

    def send(batch: list[Message]) -> concurrent.futures.Future[Any]:
        calls.append([m.body for m in batch])
        f: concurrent.futures.Future[Any] = concurrent.futures.Future()
        answers.append(f)
        return f

    coalescer = SendCoalescer(send, max_in_flight=1, max_batch=6)
    first = coalescer.submit(Message("T", b"0"))
    pair = coalescer.submit_list([Message("T", b"1"), Message("T", b"2")])
    one = coalescer.submit(Message("T", b"3"))
    four = coalescer.submit_list([Message("T", b"%d" % i) for i in range(4, 8)])
    answers[0].set_result(["r0"])
    # the next batch takes whole entries only, up to max_batch messages: the list of
    # four would make seven, so it waits for the one after
    assert calls[1] == [b"1", b"2", b"3"]
    answers[1].set_result(["r1", "r2", "r3"])
    assert calls[2] == [b"4", b"5", b"6", b"7"]
    answers[2].set_result(["r4", "r5", "r6", "r7"])
    assert first.result(timeout=1) == "r0" and one.result(timeout=1) == "r3"
    assert pair.result(timeout=1) == ["r1", "r2"]
    assert four.result(timeout=1) == ["r4", "r5", "r6", "r7"]


def test_a_refused_batch_sends_a_list_again_whole_and_alone() -> None:
    calls: list[list[bytes]] = []
    first: list[concurrent.futures.Future[Any]] = []

    def send(batch: list[Message]) -> concurrent.futures.Future[Any]:
        calls.append([m.body for m in batch])
        f: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if not first:
            first.append(f)
            return f
        if any(m.body == b"bad" for m in batch):
            raise InvalidMessageError("body 'bad' refused")
        f.set_result([b"ok:" + m.body for m in batch])
        return f

    coalescer = SendCoalescer(send, max_in_flight=1)
    coalescer.submit(Message("T", b"0"))
    good = coalescer.submit_list([Message("T", b"a"), Message("T", b"b")])
    bad = coalescer.submit_list([Message("T", b"c"), Message("T", b"bad")])
    first[0].set_result([b"ok:0"])
    assert calls[1:] == [[b"a", b"b", b"c", b"bad"], [b"a", b"b"], [b"c", b"bad"]]
    assert good.result(timeout=1) == [b"ok:a", b"ok:b"]
    with pytest.raises(InvalidMessageError, match="'bad' refused"):
        bad.result(timeout=1)


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_idempotent_short_lists_stream_in_order_with_no_run_refused(
    make_cluster: Any, flush: str
) -> None:
    """Lists of a few messages merge into batches, each list whole on one queue and in
    the order sent; larger calls (through the shared ring, on this node) and smaller
    ones (the socket) reach the broker in the order they were numbered, and the broker
    writes them in that order (a SYNC_FLUSH broker too, whose puts wait for the disk
    together), so it refuses no run for a gap before it."""
    cluster = make_cluster(brokers=1, broker_options={"store": {"flush_disk_type": flush}})
    cluster.admin.create_topic("CoalescedLists", 1, 1)  # every run on one queue
    broker = cluster.broker("broker-a")
    pad = b"p" * 100
    with cluster.producer("coalesce-lists") as producer:  # idempotent: the default
        futures = []
        for b in range(400):
            # now and then a list over 256 KiB (through the shared ring), else a short one
            n = 2500 if b % 10 == 0 else 16
            futures.append(
                producer.send_async(
                    [Message("CoalescedLists", b"%d-%d-" % (b, i) + pad) for i in range(n)]
                )
            )
        results = [f.result(timeout=60) for f in futures]
    status = ray.get(broker.status.remote())
    assert status["put_out_of_order"] == 0
    assert status["put_batches"] < 200  # the short lists left merged
    assert status["shared_batches"] > 0
    consumer = cluster.pull_consumer("coalesce-lists-check")
    stored = {
        (mq.queue_id, m.queue_offset): m.body
        for mq, got in drain(consumer, "CoalescedLists", batch=4096).items()
        for m in got
    }
    assert len(stored) == sum(len(r) for r in results)  # every message once
    for b, result in enumerate(results):
        assert len({s.message_queue.queue_id for s in result}) == 1  # a list keeps its queue
        for i, sent in enumerate(result):
            key = (sent.message_queue.queue_id, sent.queue_offset)
            assert stored[key] == b"%d-%d-" % (b, i) + pad


def test_a_lone_message_goes_by_send_one_and_those_queued_behind_it_as_a_batch() -> None:
    ones: list[tuple[bytes, Any]] = []
    calls: list[list[bytes]] = []
    answers: list[concurrent.futures.Future[Any]] = []
    released: list[tuple[int, int]] = []

    def send(batch: list[Message]) -> concurrent.futures.Future[Any]:
        calls.append([m.body for m in batch])
        f: concurrent.futures.Future[Any] = concurrent.futures.Future()
        answers.append(f)
        return f

    def send_one(message: Message, on_done: Any) -> None:
        if message.body == b"bad":
            raise InvalidMessageError("refused before it is sent")
        ones.append((message.body, on_done))

    coalescer = SendCoalescer(
        send, max_in_flight=1, release=lambda n, b: released.append((n, b)), send_one=send_one
    )
    first = coalescer.submit(Message("T", b"0"), 1)
    rest = [coalescer.submit(Message("T", b"%d" % i), 1) for i in range(1, 4)]
    assert [body for body, _ in ones] == [b"0"] and calls == []
    ones[0][1]("result-0", None)  # answered: its result is its future's, as it came
    assert first.result(timeout=1) == "result-0"
    assert calls == [[b"1", b"2", b"3"]], "those that waited leave together"
    answers[0].set_result(["r1", "r2", "r3"])
    assert [f.result(timeout=1) for f in rest] == ["r1", "r2", "r3"]
    # a lone message's failure and its validation error reach its own future only
    failed = coalescer.submit(Message("T", b"4"), 1)
    ones[-1][1](None, RuntimeError("broker gone"))
    assert isinstance(failed.exception(timeout=1), RuntimeError)
    bad = coalescer.submit(Message("T", b"bad"), 1)
    assert isinstance(bad.exception(timeout=1), InvalidMessageError)
    assert sorted(released) == [(1, 1), (1, 1), (1, 1), (3, 3)]  # every message's budget


def test_a_lone_async_send_answers_where_its_message_was_stored(make_cluster: Any) -> None:
    cluster = make_cluster(brokers=1)
    cluster.admin.create_topic("Lone", 2, 2)
    with cluster.producer("lone-producer") as producer:
        results = [producer.send_async(Message("Lone", b"m%d" % i)).result(60) for i in range(6)]
    consumer = cluster.pull_consumer("lone-consumer")
    for r in results:
        (stored,) = consumer.pull(r.message_queue, r.queue_offset, 1).messages
        assert stored.msg_id == r.msg_id
        assert r.offset_msg_id.endswith(f"{stored.commitlog_offset:016X}")
        assert cluster.admin.query_by_id(r.offset_msg_id).body == stored.body
    assert len({r.msg_id for r in results}) == 6
    consumer.close()
