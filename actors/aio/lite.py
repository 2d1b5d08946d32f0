"""Lite topics awaited on the caller's event loop: :class:`AsyncLiteProducer` and
:class:`AsyncLiteConsumer`.

The API of :class:`~actors.client.lite.LiteProducer` and
:class:`~actors.client.lite.LiteConsumer`, each call a coroutine that goes over the
socket of the broker holding the lite topic (``actors.aio.connection``; the lite
requests of ``actors.protocol.requests.lite``), on the loop of the client's first use.
A lite topic lives on the same broker as for the synchronous clients
(:func:`~actors.client.lite.home_broker`); errors are theirs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from actors.aio.connection import AsyncBrokers, master
from actors.client import instance as _instance
from actors.client import lite_core as core
from actors.client.lite_core import LiteBatch
from actors.protocol.names import DEFAULT_NAMESPACE
from storage.errors import InvalidMessageError

log = logging.getLogger("raymq.actors.aio.lite")

__all__ = ["AsyncLiteConsumer", "AsyncLiteProducer"]

_C = TypeVar("_C", bound="_AsyncLiteCalls")


class _AsyncLiteCalls(core.LiteClientCore):
    """The calls of an awaited lite client: socket requests over ``AsyncBrokers``
    (``self._brokers``), awaited on the caller's loop."""

    _brokers: AsyncBrokers

    def _connect(self, data_tls_ca: str | None) -> _instance.Connection:
        """The client's sockets to brokers (``self._brokers``, none open yet) and its
        share's connection options, both with ``data_tls_ca``."""
        self._brokers = AsyncBrokers(data_tls_ca)
        return _instance.Connection(data_tls_ca=data_tls_ca)

    async def _route(self) -> Any:
        route = self.ns.names.cached_route(self.parent)
        if route is None:
            route = await asyncio.to_thread(self.ns.require_route, self.parent)
        return route

    async def _home(self, lite_topic: str) -> str:
        return self.home(await self._route(), lite_topic)

    async def _call(self, call: core.LiteCall) -> Any:
        if self.closed:
            raise InvalidMessageError(f"the {type(self).__name__} is closed")
        actor, handle = await master(self.ns, self.parent, call.broker)
        return await asyncio.wait_for(
            self._brokers.call(actor, handle, call.method, *call.args),
            self.call_timeout_s + call.wait_s,
        )

    async def _run(self, calls: Sequence[core.LiteCall]) -> list[Any]:
        """``calls`` all at once; their answers in order, once all came."""
        return list(await asyncio.gather(*(self._call(c) for c in calls)))

    async def close(self) -> None:
        if not self.closed:
            self._brokers.close()
        self._release()

    async def __aenter__(self: _C) -> _C:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncLiteProducer(_AsyncLiteCalls, core.LiteProducerCore):
    """Sends to lite topics of ``parent`` (a topic of type LITE) on the caller's loop.
    ``async with AsyncLiteProducer(parent, ...) as p: await p.send(lite, body)``."""

    def __init__(
        self,
        parent: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        call_timeout_s: float = 10.0,
        data_tls_ca: str | None = None,
    ) -> None:
        connection = self._connect(data_tls_ca)
        super().__init__(parent, namespace, nameservers, call_timeout_s, connection)

    async def send(
        self,
        lite_topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: Sequence[str] | str = (),
        properties: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Send one message; ``{"lite_topic", "offset", "msg_id", "status"}``."""
        return (await self.send_batch([core.send_item(lite_topic, body, tags, keys, properties)]))[
            0
        ]

    async def send_batch(
        self, items: Iterable[tuple[str, bytes] | tuple[str, bytes, dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """:meth:`LiteProducer.send_batch <actors.client.lite.LiteProducer.send_batch>`:
        one request per broker, all at once; the results in the items' order."""
        plan = core.LiteSendPlan(self.parent, await self._route(), items)
        return plan.results(await self._run(plan.calls))


class AsyncLiteConsumer(_AsyncLiteCalls, core.LiteConsumerCore):
    """Consumes lite topics of ``parent`` for ``group`` on the caller's loop: the API of
    :class:`~actors.client.lite.LiteConsumer`, each call awaited."""

    def __init__(
        self,
        group: str,
        parent: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        call_timeout_s: float = 10.0,
        resync_s: float = 10.0,
        data_tls_ca: str | None = None,
    ) -> None:
        connection = self._connect(data_tls_ca)
        super().__init__(
            group, parent, namespace, nameservers, call_timeout_s, resync_s, connection
        )

    async def subscribe(self, *lite_topics: str) -> list[str]:
        """Subscribe these lite topics (created if new); the lite topics this consumer
        owns among all it subscribes."""
        return await self._change(lite_topics, "add")

    async def unsubscribe(self, *lite_topics: str) -> list[str]:
        return await self._change(lite_topics, "remove")

    async def _change(self, lite_topics: Iterable[str], action: str) -> list[str]:
        names, calls = self.change_calls(await self._route(), lite_topics, action)
        self.changed(names, action, await self._run(calls))
        return await self.owned()

    async def owned(self) -> list[str]:
        """The subscribed lite topics this consumer consumes now (renews its claim)."""
        return self.owned_of(await self._run(self.renew_calls(await self._route())))

    async def receive(self, max_count: int = 32, wait_s: float = 0.0) -> list[LiteBatch]:
        """Messages of the owned lite topics from where the group stands, per topic;
        with none, held up to ``wait_s`` for a send: on one broker, by that broker; on
        several, each is asked at once whether it has any (held there) and the first
        that has is received from. Every ``resync_s`` the whole subscription is sent
        again first."""
        wait_ms = core.wait_ms_of(wait_s)
        if again := self.resync_due():
            await self._change(again, "keep")
        brokers = self.subscribed_brokers(await self._route())
        if len(brokers) > 1 and wait_ms:
            got = await self._receive(brokers, max_count, 0)
            if got:
                return got
            ready = await self._first_with_messages(brokers, wait_ms)
            return await self._receive(ready, max_count, 0) if ready else []
        return await self._receive(brokers, max_count, wait_ms)

    async def _receive(
        self, brokers: Sequence[str], max_count: int, wait_ms: int
    ) -> list[LiteBatch]:
        return self.batches(await self._run(self.receive_calls(brokers, max_count, wait_ms)))

    async def _first_with_messages(self, brokers: Sequence[str], wait_ms: int) -> list[str]:
        """The brokers that have messages for this consumer, as soon as one has: a held
        peek to each at once (nothing handed out; those still held when one answers
        time out at their brokers). None within ``wait_ms``: []."""
        peeks: dict[asyncio.Future[Any], str] = {
            asyncio.ensure_future(self._call(peek)): peek.broker
            for peek in self.receive_calls(brokers, 0, wait_ms, peek=True)
        }
        pending: set[asyncio.Future[Any]] = set(peeks)
        ready: list[str] = []
        while pending and not ready:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                if fut.exception() is not None:
                    log.debug("lite peek on %s failed: %s", peeks[fut], fut.exception())
                elif fut.result():
                    ready.append(peeks[fut])
        for fut in pending:  # answered empty at their brokers' timeout; nobody waits
            fut.add_done_callback(_retrieved)
        return sorted(ready)

    async def ack(self, batch_or_topic: LiteBatch | str, next_offset: int | None = None) -> None:
        """Commit a lite topic for the group up to ``next_offset`` (a batch: its
        ``next_offset``)."""
        await self._run([self.ack_call(await self._route(), batch_or_topic, next_offset)])

    async def pull(
        self, lite_topic: str, offset: int, max_count: int = 32, wait_s: float = 0.0
    ) -> LiteBatch:
        """``lite_topic`` from ``offset`` (a resume from where the caller stood); with
        nothing there yet the broker holds the call up to ``wait_s`` for a send to it."""
        call = self.pull_call(await self._route(), lite_topic, offset, max_count, wait_s)
        return self.pulled(lite_topic, offset, (await self._run([call]))[0])

    async def committed_offset(self, lite_topic: str) -> int:
        return int((await self._run([self.committed_call(await self._route(), lite_topic)]))[0])

    async def close(self) -> None:
        """Unsubscribe (the lite topics pass to the group's other consumers at once)."""
        if not self.closed and self._subscribed:
            try:
                await self._change(self.subscription(), "remove")
            except Exception:  # noqa: BLE001 - they pass on anyway when its claim lapses
                log.warning("lite consumer %s: unsubscribe at close failed", self.client_id)
        await super().close()


def _retrieved(fut: asyncio.Future[Any]) -> None:
    """Take a left peek's outcome, so that a failed one is not reported unretrieved."""
    if not fut.cancelled():
        fut.exception()
