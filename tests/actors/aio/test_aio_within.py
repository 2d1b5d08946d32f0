"""``actors.aio.connection.within``, the bound every asyncio client call is awaited
under: a caller cancelled in the loop turn its call answers stays cancelled (Python
3.11's ``asyncio.wait_for`` returns the answer and drops the cancellation), and a call
past its bound raises TimeoutError, cancelled."""

from __future__ import annotations

import asyncio

import pytest

from actors.aio.connection import within


def test_a_cancel_arriving_as_the_call_answers_is_kept() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[int] = loop.create_future()
        caller = asyncio.ensure_future(within(answer, 10.0))
        await asyncio.sleep(0)  # the caller waits for the answer
        answer.set_result(1)
        caller.cancel()  # in the same turn
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert caller.cancelled()

    asyncio.run(main())


def test_a_call_past_its_bound_is_cancelled_and_raises_timeout() -> None:
    async def main() -> None:
        never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        with pytest.raises(asyncio.TimeoutError):
            await within(never, 0.01)
        assert never.cancelled()
        assert await within(asyncio.sleep(0, "done"), None) == "done"
        assert await within(asyncio.sleep(0, "in time"), 5.0) == "in time"

    asyncio.run(main())
