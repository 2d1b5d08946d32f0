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
import time
from collections.abc import Iterable, Sequence
from typing import Any

from actors.aio.connection import AsyncBrokers, master
from actors.client import instance as _instance
from actors.client.lite import LiteBatch, home_broker, send_item_topic
from actors.protocol.checks import check_number, validate_group
from actors.protocol.names import DEFAULT_NAMESPACE
from storage.codec import validate_topic
from storage.errors import InvalidMessageError
from storage.lite import validate_lite_name

log = logging.getLogger("raymq.actors.aio.lite")

__all__ = ["AsyncLiteConsumer", "AsyncLiteProducer"]


class _AsyncLiteClient:
    def __init__(
        self,
        parent: str,
        namespace: str,
        nameservers: Sequence[str] | None,
        call_timeout_s: float,
        data_tls_ca: str | None,
        kind: str,
    ) -> None:
        self.parent = validate_topic(parent)
        self.call_timeout_s = check_number("call_timeout_s", call_timeout_s)
        self._lease = _instance.share(self, namespace, nameservers, tls_ca=data_tls_ca, kind=kind)
        self.instance, self.ns = self._lease.instance, self._lease.view
        self._brokers = AsyncBrokers(data_tls_ca)
        self.closed = False

    async def _home(self, lite_topic: str) -> str:
        route = self.ns.names.cached_route(self.parent)
        if route is None:
            route = await asyncio.to_thread(self.ns.require_route, self.parent)
        return home_broker(route, self.parent, lite_topic)

    async def _call(self, broker_name: str, method: str, *args: Any, wait_s: float = 0.0) -> Any:
        """``method`` on a broker; a held call's timeout counts ``wait_s`` more."""
        if self.closed:
            raise InvalidMessageError(f"the {type(self).__name__} is closed")
        actor, handle = await master(self.ns, self.parent, broker_name)
        return await asyncio.wait_for(
            self._brokers.call(actor, handle, method, *args), self.call_timeout_s + wait_s
        )

    async def _close(self) -> None:
        if not self.closed:
            self.closed = True
            self._brokers.close()
            self._lease.release()


class AsyncLiteProducer(_AsyncLiteClient):
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
        super().__init__(
            parent, namespace, nameservers, call_timeout_s, data_tls_ca, _instance.SEND
        )

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
        opts: dict[str, Any] = {"tags": tags, "keys": keys, "properties": properties}
        return (await self.send_batch([(lite_topic, body, opts)]))[0]

    async def send_batch(
        self, items: Iterable[tuple[str, bytes] | tuple[str, bytes, dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """:meth:`LiteProducer.send_batch <actors.client.lite.LiteProducer.send_batch>`:
        one request per broker, all at once; the results in the items' order."""
        items = list(items)
        per_broker: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            per_broker.setdefault(await self._home(send_item_topic(item)), []).append(i)
        answers = await asyncio.gather(
            *(
                self._call(name, "lite_send", self.parent, [items[i] for i in picks])
                for name, picks in per_broker.items()
            )
        )
        out: list[dict[str, Any]] = [{} for _ in items]
        for picks, results in zip(per_broker.values(), answers):
            for i, r in zip(picks, results):
                out[i] = r
        return out

    async def close(self) -> None:
        await self._close()

    async def __aenter__(self) -> AsyncLiteProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncLiteConsumer(_AsyncLiteClient):
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
        super().__init__(
            parent, namespace, nameservers, call_timeout_s, data_tls_ca, _instance.READ
        )
        self.group = validate_group(group)
        self.resync_s = check_number("resync_s", resync_s)
        self.client_id = self.instance.new_client_id(group)
        self._subscribed: set[str] = set()
        self._synced = 0.0

    async def subscribe(self, *lite_topics: str) -> list[str]:
        """Subscribe these lite topics (created if new); the lite topics this consumer
        owns among all it subscribes."""
        return await self._change(lite_topics, "add")

    async def unsubscribe(self, *lite_topics: str) -> list[str]:
        return await self._change(lite_topics, "remove")

    async def _change(self, lite_topics: Iterable[str], action: str) -> list[str]:
        names = [validate_lite_name(t) for t in lite_topics]
        per_broker: dict[str, list[str]] = {}
        for name in names:
            per_broker.setdefault(await self._home(name), []).append(name)
        await asyncio.gather(
            *(
                self._call(
                    broker, "lite_subscribe", self.group, self.parent, self.client_id, ns, action
                )
                for broker, ns in per_broker.items()
            )
        )
        self._synced = time.monotonic()
        if action == "add":
            self._subscribed.update(names)
        else:
            self._subscribed.difference_update(names)
        return await self.owned()

    async def _brokers_of_subscription(self) -> list[str]:
        return sorted({await self._home(n) for n in self._subscribed})

    async def owned(self) -> list[str]:
        """The subscribed lite topics this consumer consumes now (renews its claim)."""
        views = await asyncio.gather(
            *(
                self._call(
                    broker, "lite_subscribe", self.group, self.parent, self.client_id, [], "add"
                )
                for broker in await self._brokers_of_subscription()
            )
        )
        return sorted(name for view in views for name in view["owned"])

    async def receive(self, max_count: int = 32, wait_s: float = 0.0) -> list[LiteBatch]:
        """Messages of the owned lite topics from where the group stands, per topic;
        with none, held up to ``wait_s`` for a send: on one broker, by that broker; on
        several, each is asked at once whether it has any (held there) and the first
        that has is received from. Every ``resync_s`` the whole subscription is sent
        again first."""
        wait_ms = int(check_number("wait_s", wait_s) * 1000)
        if time.monotonic() - self._synced >= self.resync_s and self._subscribed:
            await self._change(sorted(self._subscribed), "add")
        brokers = await self._brokers_of_subscription()
        if len(brokers) > 1 and wait_ms:
            got = await self._receive_from(brokers, max_count, 0)
            if got:
                return got
            ready = await self._first_with_messages(brokers, wait_ms)
            return await self._receive_from(ready, max_count, 0) if ready else []
        return await self._receive_from(brokers, max_count, wait_ms)

    async def _receive_from(
        self, brokers: Sequence[str], max_count: int, wait_ms: int
    ) -> list[LiteBatch]:
        answers = await asyncio.gather(
            *(
                self._call(
                    broker,
                    "lite_receive",
                    self.group,
                    self.parent,
                    self.client_id,
                    max_count,
                    wait_ms,
                    wait_s=wait_ms / 1000,
                )
                for broker in brokers
            )
        )
        return [
            LiteBatch(b["lite_topic"], b["offset"], b["messages"], b["next_offset"])
            for got in answers
            for b in got
        ]

    async def _first_with_messages(self, brokers: Sequence[str], wait_ms: int) -> list[str]:
        """The brokers that have messages for this consumer, as soon as one has: a held
        peek to each at once (nothing handed out; those still held when one answers
        time out at their brokers). None within ``wait_ms``: []."""
        wait_s = wait_ms / 1000
        peeks: dict[asyncio.Future[Any], str] = {
            asyncio.ensure_future(
                self._call(
                    b,
                    "lite_receive",
                    self.group,
                    self.parent,
                    self.client_id,
                    32,
                    wait_ms,
                    True,
                    wait_s=wait_s,
                )
            ): b
            for b in brokers
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
        offset: int | None
        if isinstance(batch_or_topic, LiteBatch):
            topic, offset = batch_or_topic.lite_topic, batch_or_topic.next_offset
        else:
            topic, offset = batch_or_topic, next_offset
        if not isinstance(offset, int):
            raise InvalidMessageError(f"next_offset={offset!r}: an int is needed to ack {topic!r}")
        await self._call(
            await self._home(topic),
            "lite_ack",
            self.group,
            self.parent,
            self.client_id,
            topic,
            offset,
        )

    async def pull(
        self, lite_topic: str, offset: int, max_count: int = 32, wait_s: float = 0.0
    ) -> LiteBatch:
        """``lite_topic`` from ``offset`` (a resume from where the caller stood); with
        nothing there yet the broker holds the call up to ``wait_s`` for a send to it."""
        validate_lite_name(lite_topic)
        wait_ms = int(check_number("wait_s", wait_s) * 1000)
        home = await self._home(lite_topic)
        args = (self.parent, lite_topic, offset, max_count, wait_ms)
        got = await self._call(home, "lite_pull", *args, wait_s=wait_s)
        return LiteBatch(lite_topic, offset, got["messages"], got["next_offset"])

    async def committed_offset(self, lite_topic: str) -> int:
        return int(
            await self._call(
                await self._home(lite_topic),
                "lite_committed_offset",
                self.group,
                self.parent,
                lite_topic,
            )
        )

    async def close(self) -> None:
        """Unsubscribe (the lite topics pass to the group's other consumers at once)."""
        if not self.closed and self._subscribed:
            try:
                await self._change(sorted(self._subscribed), "remove")
            except Exception:  # noqa: BLE001 - they pass on anyway when its claim lapses
                log.warning("lite consumer %s: unsubscribe at close failed", self.client_id)
        await self._close()

    async def __aenter__(self) -> AsyncLiteConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _retrieved(fut: asyncio.Future[Any]) -> None:
    """Take a left peek's outcome, so that a failed one is not reported unretrieved."""
    if not fut.cancelled():
        fut.exception()
