"""``send_async`` holds at most ``async_send_max_messages`` / ``_bytes`` unanswered: a
caller sending faster than the broker answers waits for room, as RocketMQ's async
backpressure makes it, instead of piling every batch up in the producer's memory."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import actors
from actors import PullStatus
from actors.client.backpressure import AsyncSendBudget, ProducerBusyError
from storage import Message
from storage.errors import InvalidConfigError


def _unanswered(futures: list[Any]) -> int:
    return sum(not f.done() for f in futures)


@pytest.mark.parametrize("single", [False, True], ids=["batches", "single-messages"])
def test_send_async_never_holds_more_than_its_budget_and_delivers_everything(
    one_broker: actors.Cluster, single: bool
) -> None:
    cluster, topic = one_broker, f"Budget-{int(single)}"
    cluster.admin.create_topic(topic, 2, 2)
    per_send = 1 if single else 5
    producer = cluster.producer(
        f"budget-{int(single)}", async_send_max_messages=20, max_in_flight_per_broker=1
    )
    futures: list[Any] = []
    most = 0
    for b in range(200 if single else 100):
        if single:
            futures.append(producer.send_async(Message(topic, b"%d" % b)))
        else:
            futures.append(
                producer.send_async([Message(topic, b"%d-%d" % (b, i)) for i in range(5)])
            )
        most = max(most, per_send * _unanswered(futures))
    assert most <= 20  # the send that found no room waited for an answer first
    results = [f.result(timeout=60) for f in futures]
    assert producer._budget.in_flight == (0, 0)  # every answer gave its room back

    consumer = cluster.pull_consumer(f"budget-check-{int(single)}")
    stored = set()
    for mq in consumer.fetch_subscribe_queues(topic):
        r = consumer.pull(mq, 0, 10_000)
        if r.status is PullStatus.FOUND:
            stored.update(m.body for m in r.messages)
    sent = (
        {b"%d" % b for b in range(200)}
        if single
        else {b"%d-%d" % (b, i) for b in range(100) for i in range(5)}
    )
    assert stored == sent
    assert len(results) == len(futures)
    producer.close()


def test_close_waits_for_the_async_sends_still_out(one_broker: actors.Cluster) -> None:
    cluster = one_broker
    cluster.admin.create_topic("BudgetClose", 1, 1)
    producer = cluster.producer("budget-close", max_in_flight_per_broker=1)
    futures = [
        producer.send_async([Message("BudgetClose", b"%d-%d" % (b, i)) for i in range(20)])
        for b in range(50)
    ]
    producer.close()
    assert all(f.done() for f in futures)  # answered before close returned, none lost
    assert sum(len(f.result()) for f in futures) == 1000


def test_the_budget_is_a_config_error_when_not_positive(one_broker: actors.Cluster) -> None:
    cluster = one_broker
    with pytest.raises(InvalidConfigError, match="async_send_max_messages"):
        cluster.producer("budget-bad", async_send_max_messages=0)
    with pytest.raises(InvalidConfigError, match="async_send_max_bytes"):
        cluster.producer("budget-bad", async_send_max_bytes=-1)


# ------------------------------------------------------------ the budget itself
def test_a_send_waits_for_room_and_goes_once_an_answer_frees_it() -> None:
    budget = AsyncSendBudget(max_messages=10, max_bytes=1 << 20)
    budget.acquire(8, 800, timeout_s=1.0)
    waiting = threading.Event()
    went = threading.Event()

    def sender() -> None:
        waiting.set()
        budget.acquire(5, 500, timeout_s=30.0)
        went.set()

    t = threading.Thread(target=sender)
    t.start()
    waiting.wait(5)
    assert not went.wait(0.2)  # 8 + 5 > 10: it waits
    budget.release(8, 800)
    assert went.wait(5)
    t.join()
    assert budget.in_flight == (5, 500)


def test_no_room_within_the_timeout_raises_and_takes_nothing() -> None:
    budget = AsyncSendBudget(max_messages=10, max_bytes=1000)
    budget.acquire(4, 900, timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(ProducerBusyError, match="async_send_max_bytes"):
        budget.acquire(1, 200, timeout_s=0.1)  # messages fit, bytes do not
    assert time.monotonic() - started >= 0.1
    assert budget.in_flight == (4, 900)


def test_a_send_bigger_than_the_budget_goes_alone() -> None:
    budget = AsyncSendBudget(max_messages=10, max_bytes=1000)
    budget.acquire(50, 5000, timeout_s=0.1)  # nothing else unanswered: let through
    with pytest.raises(ProducerBusyError):
        budget.acquire(1, 1, timeout_s=0.05)  # and nothing else while it is out
    budget.release(50, 5000)
    budget.acquire(1, 1, timeout_s=0.05)


def test_wait_empty_returns_once_everything_is_given_back() -> None:
    budget = AsyncSendBudget(max_messages=10, max_bytes=100)
    assert budget.wait_empty(0.0)
    budget.acquire(3, 30, timeout_s=0.1)
    assert not budget.wait_empty(0.05)
    threading.Timer(0.05, budget.release, (3, 30)).start()
    assert budget.wait_empty(10.0)


def test_a_send_from_a_completion_callback_does_not_wait_on_its_own_thread() -> None:
    budget = AsyncSendBudget(max_messages=1, max_bytes=100)
    budget.acquire(1, 10, timeout_s=0.1)
    started = time.monotonic()
    with budget.delivering():
        budget.acquire(1, 10, timeout_s=30.0)  # would wait 30 s outside delivering()
    assert time.monotonic() - started < 5
    assert budget.in_flight == (2, 20)
    with pytest.raises(ProducerBusyError):  # outside it, the budget holds again
        budget.acquire(1, 10, timeout_s=0.05)
