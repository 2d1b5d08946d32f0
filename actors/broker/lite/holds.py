"""Receives and pulls of lite topics held until a send to one of them: the broker's
:class:`~actors.broker.longpolling.pull_hold_service.PullRequestHoldService`, keyed by
parent and lite topic."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from actors.broker.runtime import BrokerRuntime
from storage.errors import InvalidMessageError
from storage.message import GetStatus


class LiteHolds:
    """Reads of lite topics held up to ``wait_ms`` for a send, and the sends' wake-ups."""

    def __init__(self, runtime: BrokerRuntime, caught_up: Callable[[], Awaitable[None]]) -> None:
        self.rt = runtime
        self.caught_up = caught_up
        """Awaited before a read: a Raft leader serves what its group committed."""

    def wake(self, parent: str, lite_topics: set[str]) -> None:
        """Wake the receives and pulls held on these lite topics (on the loop's thread)."""
        for lite in lite_topics:
            self.rt.holds.on_dispatch(_hold_key(parent, lite), 0, 0)

    async def held(self, parent: str, lite_topics: Sequence[str], wait_ms: int, read: Any) -> Any:
        """``read()`` (a coroutine function); if it finds nothing and ``wait_ms`` > 0,
        once more after a send to one of ``lite_topics`` or after ``wait_ms``. The
        waiter is registered before the look, so a send between them is not missed."""
        if not isinstance(wait_ms, int) or wait_ms < 0:
            raise InvalidMessageError(f"wait_ms={wait_ms!r}: an int >= 0")
        await self.caught_up()
        if not wait_ms or not lite_topics or self.rt.closing:
            return await read()
        holds = self.rt.holds
        keys = [(_hold_key(parent, lite), 0) for lite in lite_topics]
        fut = holds.register_many(keys)
        try:
            got = await read()
        except BaseException:
            holds.discard_many(keys, fut)
            raise
        if _found(got):
            holds.discard_many(keys, fut)
            return got
        await holds.wait_many(keys, fut, wait_ms / 1000)
        return await read()


def _hold_key(parent: str, lite_topic: str) -> str:
    """The hold service's key of a lite topic (no topic name holds ``\\x01``)."""
    return f"{parent}\x01{lite_topic}"


_WAIT = (
    GetStatus.NO_MATCHED_LOGIC_QUEUE,  # not created yet: its first send creates it
    GetStatus.NO_MESSAGE_IN_QUEUE,
    GetStatus.OFFSET_OVERFLOW_ONE,
)


def _found(got: Any) -> bool:
    """A receive's or a pull's read has its answer: messages, or a pull's offset that
    no send makes good (too small, too far)."""
    if isinstance(got, list):
        return bool(got)
    return got.status not in _WAIT
