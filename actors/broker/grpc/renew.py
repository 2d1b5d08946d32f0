"""Auto-renew of a push consumer's invisible times (RocketMQ 5 proxy's
``DefaultReceiptHandleManager``).

A RocketMQ 5 ``PushConsumer`` receives with ``auto_renew`` and no invisible time of its
own, hands each message to its listener, and then acks it (or changes its invisible
time, to retry it later) with the receipt handle it came with. It never renews anything
itself, however long its listener runs: the server does. Here the gRPC endpoint keeps
each such message it handed out, and every so often, for each one that would lapse
within ``grpc_renew_ahead_s``, changes its invisible time by ``grpc_renew_invisible_s``
more, as long as its client is alive (heard from within :data:`CLIENT_SILENT_S`) and for
at most ``grpc_renew_max_s`` after the receive. Each change gives the message a new
handle; the client still holds the first, so the client's ack, change or dead-letter
is mapped to the current one (:meth:`AutoRenewer.settle`), which also ends the renewal.

Plain Python (no generated protocol modules); the processor calls go through
``PopProcessor``'s checks like any other caller's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger("raymq.actors.broker.grpc.renew")

T = TypeVar("T")
CLIENT_SILENT_S = 40.0
"""A client not heard from (receive, heartbeat) for this long is taken for gone: its
messages are no longer renewed and lapse (the clients heartbeat every 10 s)."""


@dataclass
class _Held:
    group: str
    topic: str
    client: str
    handle: str  # the current one
    lapses_at: float  # monotonic: when the current invisible time ends (or a bit before)
    renew_until: float  # monotonic: no renewal after this
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    settled: bool = False


class AutoRenewer:
    """The messages handed out with ``auto_renew``, by the handle the client was given."""

    def __init__(
        self,
        pop: Any,  # actors.broker.processor.pop.PopProcessor
        invisible_s: float,
        ahead_s: float,
        max_s: float,
    ) -> None:
        self.pop = pop
        self.invisible_s = invisible_s
        self.ahead_s = ahead_s
        self.max_s = max_s
        self.interval_s = min(max(ahead_s / 4, 0.05), 5.0)
        self._held: dict[str, _Held] = {}  # first handle -> what it is now
        self._seen: dict[str, float] = {}  # client id -> last heard of (monotonic)
        self.stats = {"renewed": 0, "renew_failed": 0, "expired": 0}

    @property
    def invisible_ms(self) -> int:
        return int(self.invisible_s * 1000)

    def __len__(self) -> int:
        return len(self._held)

    # ------------------------------------------------------------ clients
    def seen(self, client: str) -> None:
        if client:
            self._seen[client] = time.monotonic()

    def forget_client(self, client: str) -> None:
        """The client said goodbye: its messages lapse as they are (not renewed)."""
        self._seen.pop(client, None)
        for first, held in list(self._held.items()):
            if held.client == client:
                del self._held[first]

    def _alive(self, client: str, now: float) -> bool:
        last = self._seen.get(client)
        return last is not None and now - last < CLIENT_SILENT_S

    # ------------------------------------------------------------ handles
    def track(
        self, group: str, topic: str, client: str, handles: Iterable[str], started: float
    ) -> None:
        """Messages received at ``started`` (monotonic, before the receive was made) with
        :attr:`invisible_ms`: renew them until the client settles them."""
        if not client:
            return  # nobody to tell apart: let them lapse
        self.seen(client)
        lapses_at = started + self.invisible_s
        for handle in handles:
            self._held[handle] = _Held(
                group, topic, client, handle, lapses_at, started + self.max_s
            )

    def holds(self, group: str, topic: str, handle: str) -> bool:
        """Whether ``handle`` is a message renewed here for ``group`` on ``topic`` (its
        ack must go through :meth:`settle`, under its current handle)."""
        held = self._held.get(handle)
        return held is not None and held.group == group and held.topic == topic

    async def settle(
        self, group: str, topic: str, handle: str, op: Callable[[str], Awaitable[T]]
    ) -> T:
        """Run the client's ack / change / dead-letter ``op`` on the message's current
        handle (the one given, if it is not renewed here) and stop renewing it. A call
        naming another group or topic gets the handle as given (and the processor's
        refusal): it cannot end another group's renewal."""
        held = self._held.get(handle)
        if held is None or held.group != group or held.topic != topic:
            return await op(handle)
        del self._held[handle]
        async with held.lock:  # not while a renewal of it is under way
            held.settled = True
            return await op(held.handle)

    # ------------------------------------------------------------ renewal
    async def run(self, closing: Callable[[], bool]) -> None:
        while not closing():
            await asyncio.sleep(self.interval_s)
            try:
                await self.renew_due()
            except Exception:  # noqa: BLE001 - the next pass tries again
                log.exception("auto-renew pass failed")

    async def renew_due(self) -> int:
        """Renew what would lapse within ``ahead_s``; how many were renewed."""
        now = time.monotonic()
        renewed = 0
        for client, last in list(self._seen.items()):  # long gone: forget them
            if now - last > 2 * CLIENT_SILENT_S:
                del self._seen[client]
        for first, held in list(self._held.items()):
            if held.lapses_at - now > self.ahead_s:
                continue
            if now >= held.renew_until or not self._alive(held.client, now):
                self._held.pop(first, None)  # let it lapse: delivered again
                self.stats["expired"] += 1
                log.info(
                    "%s of %s: not renewed any more (%s)",
                    first,
                    held.group,
                    "renewed for too long" if now >= held.renew_until else "client gone",
                )
                continue
            async with held.lock:
                if held.settled:
                    continue
                started = time.monotonic()
                try:
                    held.handle = await self.pop.change_invisible_duration(
                        held.group, held.topic, held.handle, self.invisible_ms
                    )
                except Exception as exc:  # noqa: BLE001 - acked elsewhere, or lapsed
                    self._held.pop(first, None)
                    self.stats["renew_failed"] += 1
                    log.info("%s of %s: renewal refused: %s", first, held.group, exc)
                    continue
                held.lapses_at = started + self.invisible_s
                renewed += 1
                self.stats["renewed"] += 1
        return renewed
