"""AsyncSimpleConsumer's ack and change_invisible_duration cancelled at each of their
await points (0, 1, 2... turns of the loop after they start): a call cancelled before
its request left changes nothing, one cancelled after it takes effect at the broker.
Either way no message is lost (an unacked one comes back after its invisible time,
and once acked never again) and none is acked twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import ray

import actors
from actors.aio import AsyncProducer, AsyncSimpleConsumer
from actors.protocol.pop import PoppedMessage
from storage import Message


def acked_by_brokers(cluster: actors.Cluster) -> int:
    """Messages the brokers' POP stores acked so far (an ack of one acked before,
    which changes nothing, is not counted)."""
    names = ("broker-a", "broker-b")
    return sum(
        int(s["pop_acked"]) for s in ray.get([cluster.broker(n).status.remote() for n in names])
    )


def turns_of(i: int) -> int | None:
    """Every turn count up to 24, then half again more each time up to 32; the calls
    after that are not cancelled (so that some finish, however slow the broker)."""
    return i if i <= 24 else int(24 * 1.5 ** (i - 24)) if i < 32 else None


async def cancelled_after(turns: int | None, call: Awaitable[Any]) -> bool:
    """Start ``call``, let the loop turn ``turns`` times (None: until it finishes),
    cancel it: whether the cancellation caught it (False: it had finished)."""
    task = asyncio.ensure_future(call)
    if turns is None:
        await task
        return False
    for _ in range(turns):
        if task.done():
            break
        await asyncio.sleep(0)
    task.cancel()
    result: Any = (await asyncio.gather(task, return_exceptions=True))[0]
    if isinstance(result, asyncio.CancelledError):
        return True
    if isinstance(result, BaseException):
        raise result
    return False


async def receive_all(
    consumer: AsyncSimpleConsumer, invisible_s: float, quiet_after: float
) -> list[PoppedMessage]:
    """What the group receives until a receive, later than ``quiet_after`` (loop
    time), brings nothing."""
    loop = asyncio.get_running_loop()
    got: list[PoppedMessage] = []
    while True:
        more = await consumer.receive(32, invisible_s=invisible_s, wait_s=1.0)
        got.extend(more)
        if not more and loop.time() > quiet_after:
            return got


def run_cancelled(
    cluster: actors.Cluster,
    topic: str,
    count: int,
    first_invisible_s: float,
    call: Callable[[AsyncSimpleConsumer, PoppedMessage], Awaitable[Any]],
    ack_rest: bool,
) -> tuple[dict[bytes, bool], list[PoppedMessage], list[PoppedMessage], int]:
    """Receive ``count`` messages invisible for ``first_invisible_s``, cancel
    ``call(consumer, message)`` of the i-th one after ``turns_of(i)`` turns, then
    receive what comes back (invisible for a minute: once each) and ack it; finally
    (``ack_rest``) ack, through its handle as the consumer holds it now, each message
    that did not come back. Returns per body whether its call was cancelled, the messages, those
    that came back, and how many acks the brokers counted meanwhile."""
    cluster.admin.create_topic(topic, 2, 2)
    bodies = [b"%s-%d" % (topic.encode(), i) for i in range(count)]
    before = acked_by_brokers(cluster)

    async def main() -> tuple[dict[bytes, bool], list[PoppedMessage], list[PoppedMessage]]:
        async with AsyncProducer(f"{topic}-p", namespace=cluster.namespace) as producer:
            await producer.send_batch([Message(topic, b) for b in bodies])
        loop = asyncio.get_running_loop()
        async with AsyncSimpleConsumer(
            f"{topic}-g", topic, namespace=cluster.namespace, wait_s=1.0
        ) as consumer:
            got: list[PoppedMessage] = []
            while len(got) < count:
                got.extend(await consumer.receive(32, invisible_s=first_invisible_s))
            received_at = loop.time()
            assert sorted(m.body for m in got) == sorted(bodies)
            cancelled = {
                m.body: await cancelled_after(turns_of(i), call(consumer, m))
                for i, m in enumerate(got)
            }
            # before any message could come back of itself
            assert loop.time() - received_at < first_invisible_s, "calls too slow"
            back = await receive_all(consumer, 60.0, received_at + first_invisible_s + 1.5)
            for m in back:
                await consumer.ack(m)
            came_back = {m.body for m in back}
            for m in got:
                if m.body not in came_back and ack_rest:
                    await consumer.ack(m)  # refused if the consumer lost the message's handle
        return cancelled, got, back

    cancelled, got, back = asyncio.run(asyncio.wait_for(main(), 90))
    return cancelled, got, back, acked_by_brokers(cluster) - before


def test_a_cancelled_ack_acks_once_or_not_at_all(aio_cluster: actors.Cluster) -> None:
    """An ack cancelled before its request left leaves the message to come back after
    its invisible time; one cancelled after it, or not cancelled, acks it for good."""

    async def ack(consumer: AsyncSimpleConsumer, message: PoppedMessage) -> None:
        await consumer.ack(message)

    cancelled, got, back, acked = run_cancelled(aio_cluster, "AioPopAckCancel", 40, 4.0, ack, False)
    came_back = Counter(m.body for m in back)
    assert max(came_back.values(), default=1) == 1  # each came back once at most
    assert set(came_back) <= {b for b, c in cancelled.items() if c}  # acked ones: never
    assert got[0].body in came_back  # cancelled before it started: not acked
    assert any(c and b not in came_back for b, c in cancelled.items())  # cancelled, written
    assert not all(cancelled.values())  # and some finished
    assert acked == len(got)  # every message acked, none twice


def test_a_cancelled_change_of_invisible_duration_keeps_the_message(
    aio_cluster: actors.Cluster,
) -> None:
    """Received invisible for 4 s, each message's invisible time is changed to a minute
    and the change cancelled: one whose change did not reach the broker comes back
    after its 4 s; one whose change did stays invisible, and the consumer holds its
    new handle (the old one is refused), with which it is acked."""
    old: dict[bytes, str] = {}

    async def change(consumer: AsyncSimpleConsumer, message: PoppedMessage) -> None:
        old[message.body] = message.receipt_handle
        await consumer.change_invisible_duration(message, 60.0)

    cancelled, got, back, acked = run_cancelled(
        aio_cluster, "AioPopChangeCancel", 40, 4.0, change, True
    )
    came_back = Counter(m.body for m in back)
    assert max(came_back.values(), default=1) == 1
    # (a call cancelled before it started did not note the handle: unchanged)
    changed = {m.body for m in got if m.receipt_handle != old.get(m.body, m.receipt_handle)}
    assert not changed & set(came_back)  # a changed one stayed invisible
    assert set(cancelled) == changed | set(came_back)  # and the others came back
    assert got[0].body in came_back  # cancelled before it started: unchanged
    assert any(c and b in changed for b, c in cancelled.items())  # cancelled, applied
    assert acked == len(got)  # each acked once, through the handle the consumer held
