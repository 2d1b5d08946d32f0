"""AsyncTransactionalProducer.send_message_in_transaction cancelled at each of its
await points (0, 1, 2... turns of the loop after it starts, and inside the local
transaction): its half message is not sent, or it ends committed or rolled back (by
the producer, or by the broker's check-back answered by the group's checker), never
left half forever and never visible twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import actors
from actors.aio import AsyncTransactionalProducer
from actors.client.transaction import LocalTransactionState
from storage import Message

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
SELF_CANCEL = b"-in-execute"


def decision(message: Message) -> LocalTransactionState:
    return COMMIT if message.body.startswith(b"c") else ROLLBACK


def turns_of(i: int) -> int:
    """Every turn count up to 300, then 10% more each time: the early await points
    one by one, the later ones (the answers over the socket) sparsely."""
    return i if i <= 300 else int(300 * 1.1 ** (i - 300))


def test_a_cancelled_transaction_ends_committed_or_rolled_back_once(
    aio_cluster: actors.Cluster, stored: Callable[[str], list[bytes]]
) -> None:
    cluster, topic, group = aio_cluster, "AioTxCancel", "aio-tx-cancel"
    cluster.admin.create_topic(topic, 2, 2)
    executed: list[bytes] = []
    checked: list[bytes] = []
    outcomes: dict[bytes, str] = {}

    async def checker(message: Message) -> LocalTransactionState:
        checked.append(message.body)
        return decision(message)

    async def execute(message: Message) -> LocalTransactionState:
        executed.append(message.body)
        if message.body.endswith(SELF_CANCEL):  # cancelled inside the local transaction
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
        await asyncio.sleep(0)  # a local transaction awaits its database
        await asyncio.sleep(0)
        return decision(message)

    async def main() -> None:
        async with AsyncTransactionalProducer(
            group, checker, namespace=cluster.namespace, check_heartbeat_s=1.0
        ) as producer:
            await producer.send_message_in_transaction(Message(topic, b"c-warm"), execute)
            finished_in_a_row, i = 0, 0
            while (finished_in_a_row < 3 or i < 60) and i < 600:
                body = b"%s%d" % (b"c" if i % 2 == 0 else b"r", i)
                inside = i % 25 == 7  # cancelled by the local transaction, not from here
                if inside:
                    body += SELF_CANCEL
                task = asyncio.ensure_future(
                    producer.send_message_in_transaction(Message(topic, body), execute)
                )
                for _ in range(turns_of(i)):
                    if task.done() or inside:
                        break
                    await asyncio.sleep(0)
                if not inside:
                    task.cancel()
                (result,) = await asyncio.gather(task, return_exceptions=True)
                if isinstance(result, asyncio.CancelledError):
                    outcomes[body] = "cancelled"
                    finished_in_a_row = finished_in_a_row if inside else 0
                else:
                    assert not isinstance(result, BaseException), result
                    assert result.local_state is decision(Message(topic, body))
                    outcomes[body] = "finished"
                    finished_in_a_row += 1
                i += 1
            assert finished_in_a_row == 3, "no send finished before its cancel"
            # sends whose caller was cancelled after their frame left, still going on
            await asyncio.gather(*producer._background, return_exceptions=True)
            deadline = asyncio.get_running_loop().time() + 60
            while await asyncio.to_thread(cluster.admin.pending_transactions, group):
                assert asyncio.get_running_loop().time() < deadline, "half messages left"
                await asyncio.sleep(0.2)  # the brokers check every 0.3 s

    asyncio.run(asyncio.wait_for(main(), 120))
    visible = Counter(stored(topic))
    assert max(visible.values()) == 1  # nothing visible twice
    assert not [b for b in visible if b.startswith(b"r")]  # nothing rolled back shows
    for body, outcome in outcomes.items():
        half_stored = outcome == "finished" or body in executed or body in checked
        if body.startswith(b"c") and half_stored:
            assert visible[body] == 1, body  # committed: by its producer or the check
    cancelled = [b for b, o in outcomes.items() if o == "cancelled"]
    assert any(b not in visible and b not in checked for b in cancelled)  # never sent
    assert any(b in executed and b not in visible for b in cancelled if b.startswith(b"r"))
    ended_by_check = [b for b in cancelled if b in checked]
    assert ended_by_check  # left without an end, ended by the check-back
    assert [b for b in outcomes if b.endswith(SELF_CANCEL)]
    assert all(outcomes[b] == "cancelled" for b in outcomes if b.endswith(SELF_CANCEL))
