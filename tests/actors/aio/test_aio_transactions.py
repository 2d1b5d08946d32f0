"""AsyncTransactionalProducer against real brokers over real sockets: a half message
shows once committed and never once rolled back; one whose producer went away before
ending it is checked back by a live producer of the group, whose checker answers on
its event loop; a transaction over both brokers shows whole on commit (with its
offsets) and not at all on abort; one a single broker holds is committed there alone."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import ray

import actors
from actors.aio import AsyncTransactionalProducer
from actors.client.transaction import LocalTransactionState
from storage import Message
from storage.errors import InvalidMessageError, ProducerFencedError

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE


async def until(check: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    """Until ``check()`` (run on a worker thread: it makes blocking calls) is true."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await asyncio.to_thread(check):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no {what} in {timeout_s} s")
        await asyncio.sleep(0.1)


def test_half_messages_commit_and_roll_back(
    aio_cluster: actors.Cluster, stored: Callable[[str], list[bytes]]
) -> None:
    cluster, topic = aio_cluster, "AioTxHalf"
    cluster.admin.create_topic(topic, 2, 2)
    executed: list[bytes] = []

    async def execute(message: Message) -> LocalTransactionState:
        executed.append(message.body)
        await asyncio.sleep(0)  # a local transaction awaits its database
        return COMMIT if message.body.startswith(b"yes") else ROLLBACK

    async def main() -> None:
        async with AsyncTransactionalProducer("aio-tx-half", namespace=cluster.namespace) as p:
            kept = await p.send_half(Message(topic, b"kept"))
            dropped = await p.send_half(Message(topic, b"dropped"))
            assert stored(topic) == []  # half messages: no consumer sees them
            assert await kept.commit() is True
            assert await dropped.rollback() is True
            assert await kept.rollback() is False  # ended before: nothing changes
            results = [
                await p.send_message_in_transaction(Message(topic, body), execute)
                for body in (b"yes-1", b"no-1", b"yes-2")
            ]
            assert [r.local_state for r in results] == [COMMIT, ROLLBACK, COMMIT]
            with pytest.raises(InvalidMessageError):
                await p.send_half(b"not a message")  # type: ignore[arg-type]

    asyncio.run(asyncio.wait_for(main(), 60))
    assert executed == [b"yes-1", b"no-1", b"yes-2"]
    assert Counter(stored(topic)) == Counter([b"kept", b"yes-1", b"yes-2"])


def test_a_vanished_producers_half_message_is_checked_back_on_the_loop(
    aio_cluster: actors.Cluster, stored: Callable[[str], list[bytes]]
) -> None:
    """The producer that sent two half messages goes away without ending them; the
    brokers ask the group's live producer, whose checker runs on its loop's thread."""
    cluster, topic, group = aio_cluster, "AioTxCheck", "aio-tx-check"
    cluster.admin.create_topic(topic, 2, 2)
    checked: list[tuple[bytes, int]] = []

    async def checker(message: Message) -> LocalTransactionState:
        checked.append((message.body, threading.get_ident()))
        return COMMIT if message.body == b"commit me" else ROLLBACK

    async def main() -> int:
        async with AsyncTransactionalProducer(group, namespace=cluster.namespace) as gone:
            await gone.send_half(Message(topic, b"commit me"))
            await gone.send_half(Message(topic, b"roll me back"))
        async with AsyncTransactionalProducer(
            group, checker, namespace=cluster.namespace, check_heartbeat_s=1.0
        ):
            await until(lambda: stored(topic) == [b"commit me"], "checked commit")
            await until(
                lambda: not cluster.admin.pending_transactions(group), "end of both half messages"
            )
        return threading.get_ident()

    loop_thread = asyncio.run(asyncio.wait_for(main(), 90))
    assert {t for _, t in checked} == {loop_thread}
    assert stored(topic) == [b"commit me"]
    assert {b for b, _ in checked} == {b"commit me", b"roll me back"}


def test_a_transaction_over_both_brokers_commits_whole_or_aborts(
    aio_cluster: actors.Cluster, stored: Callable[[str], list[bytes]]
) -> None:
    cluster, topic, group = aio_cluster, "AioTxMulti", "aio-tx-in"
    cluster.admin.create_topic(topic, 2, 2)
    consumer = cluster.pull_consumer(group)
    queues = consumer.fetch_subscribe_queues(topic)
    assert len({mq.broker_name for mq in queues}) == 2
    assert {consumer.fetch_offset(mq) for mq in queues} == {-1}  # none committed yet

    async def main() -> tuple[set[str], list[bytes]]:
        async with AsyncTransactionalProducer(
            "aio-tx-multi",
            transactional_id="aio-tx-1",
            namespace=cluster.namespace,
            flush_messages=5,
        ) as producer:
            async with producer.begin() as txn:
                for i in range(20):  # four flushes of five, to the queues in turn
                    await txn.send(Message(topic, b"t%d" % i))
                txn.send_offsets(group, {mq: 0 for mq in queues})
                brokers = set(txn._halves)
                before = await asyncio.to_thread(stored, topic)
            with pytest.raises(RuntimeError):
                async with producer.begin() as txn:
                    await txn.send(Message(topic, b"aborted"))
                    await txn.flush()
                    txn.send_offsets(group, {mq: 9 for mq in queues})
                    raise RuntimeError("the body failed: abort")
            assert txn.state.value == "aborted"
        return brokers, before

    brokers, before = asyncio.run(asyncio.wait_for(main(), 90))
    assert brokers == {mq.broker_name for mq in queues}  # the commit spans both brokers
    assert before == []  # nothing showed before the commit
    assert Counter(stored(topic)) == Counter(b"t%d" % i for i in range(20))
    try:
        assert {mq: consumer.fetch_offset(mq) for mq in queues} == {mq: 0 for mq in queues}
    finally:
        consumer.close()


def test_other_processes_send_into_a_transaction_through_its_context(
    aio_cluster: actors.Cluster, stored: Callable[[str], list[bytes]]
) -> None:
    """A transaction's context lets another sender (a plain producer, as a Spark task
    is) send half messages into it; the commit takes the ones handed back with
    ``add_halves`` and no others."""
    cluster, topic = aio_cluster, "AioTxContext"
    cluster.admin.create_topic(topic, 2, 2)
    sender = cluster.producer("aio-tx-context-sender")

    async def main() -> None:
        async with (
            AsyncTransactionalProducer(
                "aio-tx-context", transactional_id="aio-tx-ctx", namespace=cluster.namespace
            ) as producer,
            producer.begin() as txn,
        ):
            await txn.send(Message(topic, b"own"))
            marks = txn.context().properties()

            def send(prefix: bytes) -> Any:
                msgs = [Message(topic, prefix + b"%d" % i, properties=marks) for i in range(3)]
                return sender.send_batch(msgs)

            await asyncio.to_thread(send, b"lost-")  # never handed back
            counted = await asyncio.to_thread(send, b"joined-")
            with pytest.raises(InvalidMessageError, match="half message id"):
                txn.add_halves({"broker-x": [""]}, 1)
            txn.add_halves(counted.halves_by_broker(), 3)
            assert await asyncio.to_thread(stored, topic) == []  # nothing before the commit

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        sender.close()
    assert Counter(stored(topic)) == Counter([b"own", b"joined-0", b"joined-1", b"joined-2"])


def test_an_abort_after_the_context_was_handed_out_rolls_back_halves_never_handed_back(
    aio_cluster: actors.Cluster, stored: Callable[[str], list[bytes]]
) -> None:
    """Half messages another sender put into the transaction through its context, on
    both brokers, and never handed back (a task that failed) are rolled back by the
    abort itself, not left to the check service: none is pending once it returns."""
    cluster, topic, group = aio_cluster, "AioTxCtxAbort", "aio-tx-ctx-abort"
    cluster.admin.create_topic(topic, 2, 2)
    sender = cluster.producer("aio-tx-ctx-abort-sender")

    async def main() -> tuple[set[str], list[dict[str, Any]]]:
        async with AsyncTransactionalProducer(
            group, transactional_id="aio-tx-ctx-abort", namespace=cluster.namespace
        ) as producer:
            txn = producer.begin()
            marks = txn.context().properties()
            brokers: set[str] = set()
            for i in range(4):  # a batch each: the queues in turn, on both brokers
                one = [Message(topic, b"lost-%d" % i, properties=marks)]
                sent = await asyncio.to_thread(sender.send_batch, one)
                brokers |= set(sent.halves_by_broker())
            pending = await asyncio.to_thread(cluster.admin.pending_transactions, group)
            assert len(pending) == 4
            await txn.abort()  # within the check service's 1 s: the abort ends them
            left = await asyncio.to_thread(cluster.admin.pending_transactions, group)
            return brokers, left

    try:
        brokers, left = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        sender.close()
    assert brokers == {"broker-a", "broker-b"}  # the lost halves are on both brokers
    assert left == []
    assert stored(topic) == []


def test_a_transaction_one_broker_holds_is_committed_there_alone(
    aio_cluster: actors.Cluster, stored: Callable[[str], list[bytes]]
) -> None:
    """A transaction still buffered at its commit, its offsets on one broker, goes to
    that broker in one call: no half copy, no coordinator. One with offsets on both
    brokers takes the two phases; an instance fenced by a newer one is refused."""
    cluster, topic, group = aio_cluster, "AioTxOnePhase", "aio-tx-1p-in"
    cluster.admin.create_topic(topic, 2, 2)
    consumer = cluster.pull_consumer(group)
    queues = consumer.fetch_subscribe_queues(topic)
    on_b = [mq for mq in queues if mq.broker_name == "broker-b"]
    assert on_b and len({mq.broker_name for mq in queues}) == 2

    def offsets() -> dict[Any, int]:
        return {mq: consumer.fetch_offset(mq) for mq in queues}

    def one_phase_count(broker: str) -> int:
        return int(ray.get(cluster.broker(broker).status.remote())["txn_one_phase"])

    async def main() -> tuple[int, int, int]:
        options: dict[str, Any] = {"transactional_id": "aio-tx-1p", "namespace": cluster.namespace}
        async with AsyncTransactionalProducer("aio-tx-1p", **options) as producer:
            decided = await producer._call("status")
            before = dict(decided["stats"])
            async with producer.begin() as txn:
                await txn.send([Message(topic, b"one-%d" % i) for i in range(6)])
                txn.send_offsets(group, {on_b[0]: 0})
            assert txn.state.value == "committed" and producer.one_phase_commits == 1
            assert await asyncio.to_thread(offsets) == {
                mq: 0 if mq in on_b[:1] else -1 for mq in queues
            }
            async with producer.begin() as txn:  # offsets on both brokers: two phases
                await txn.send(Message(topic, b"two"))
                txn.send_offsets(group, {mq: 0 for mq in queues})
            after = dict((await producer._call("status"))["stats"])
            assert producer.one_phase_commits == 1
            assert after.get("committed", 0) == before.get("committed", 0) + 1
            async with AsyncTransactionalProducer("aio-tx-1p", **options) as newer:
                old = producer.begin()
                await old.send(Message(topic, b"fenced"))
                with pytest.raises(ProducerFencedError):
                    await old.commit()
                assert old.state.value == "aborted"
                async with newer.begin() as txn:
                    await txn.send(Message(topic, b"newer"))
                return producer.one_phase_commits, newer.one_phase_commits, after["committed"]

    b_before = one_phase_count("broker-b")
    old_commits, newer_commits, _ = asyncio.run(asyncio.wait_for(main(), 60))
    assert (old_commits, newer_commits) == (1, 1)
    assert one_phase_count("broker-b") >= b_before + 1
    assert Counter(stored(topic)) == Counter([*(b"one-%d" % i for i in range(6)), b"two", b"newer"])
    try:
        assert offsets() == {mq: 0 for mq in queues}  # the two-phase commit's offsets too
    finally:
        consumer.close()
