"""Single asynchronous sends are coalesced into batches, none lost, order kept per topic."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest

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
