"""Stopping a group member's background tasks (``replication.stop_tasks``) ends every
one of them, also one that lost its cancellation: a promotion waits on it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from actors.broker.ha.replication import stop_tasks


async def _loop_forever(started: asyncio.Event, lose_cancels: int) -> None:
    """A background loop that goes on after its first ``lose_cancels`` cancellations,
    as a loop around ``asyncio.wait_for`` does when a cancellation is lost in it."""
    started.set()
    while True:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if lose_cancels == 0:
                raise
            lose_cancels -= 1


async def _failing(started: asyncio.Event) -> None:
    started.set()
    raise RuntimeError("ended badly before the stop")


def test_every_task_ends_even_one_that_loses_its_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> list[asyncio.Task[None]]:
        events = [asyncio.Event() for _ in range(3)]
        tasks = [
            asyncio.create_task(_loop_forever(events[0], 0), name="obedient"),
            asyncio.create_task(_loop_forever(events[1], 2), name="deaf-twice"),
            asyncio.create_task(_failing(events[2]), name="failed"),
        ]
        await asyncio.gather(*(e.wait() for e in events))
        await asyncio.wait_for(stop_tasks(tasks, "broker-x", again_s=0.2), 10)
        return tasks

    with caplog.at_level(logging.WARNING, logger="raymq.actors.ha"):
        tasks = asyncio.run(scenario())
    assert all(t.done() for t in tasks)
    assert tasks[0].cancelled() and tasks[1].cancelled()
    assert isinstance(tasks[2].exception(), RuntimeError)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and all("deaf-twice" in w and "again" in w for w in warned)


def test_nothing_to_stop_returns_at_once() -> None:
    asyncio.run(asyncio.wait_for(stop_tasks([], "broker-x"), 1))
