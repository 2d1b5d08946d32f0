"""AsyncSimpleConsumer: POP consumption (RocketMQ 5's SimpleConsumer) awaited on the
caller's event loop.

``await receive()`` pops from every broker holding the topic at once, over each
broker's socket on the loop (``actors.aio.connection``), and returns what the first
answers bring; a pop still out when it returns goes on, and what it brings waits for
the next ``receive`` (a cancelled ``receive`` leaves its pops the same way: what
they bring is handed out later, or comes back after its invisible time). ``await
ack(message)`` and ``await change_invisible_duration(message, seconds)`` go to the
broker that handed the message out, named by its receipt handle. Errors are the
synchronous :class:`~actors.client.simple_consumer.SimpleConsumer`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from actors.aio.connection import AsyncBrokers, master, within
from actors.client import instance as _instance
from actors.client.simple_consumer import PopClient
from actors.protocol.checks import check_number
from actors.protocol.names import DEFAULT_NAMESPACE
from actors.protocol.pop import PoppedMessage
from storage.errors import BrokerUnavailableError
from storage.pop import ReceiptHandle

log = logging.getLogger("raymq.actors.aio.simple_consumer")


class AsyncSimpleConsumer(PopClient):
    """See the module doc. ``async with AsyncSimpleConsumer(group, topic, ...) as c:``."""

    def __init__(
        self,
        group: str,
        topic: str,
        tag_expr: str = "*",
        *,
        fifo: bool = False,
        wait_s: float = 5.0,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        call_timeout_s: float = 10.0,
        data_tls_ca: str | None = None,
    ) -> None:
        connection = _instance.Connection(data_tls_ca=data_tls_ca)
        self._join_pop(
            group, topic, tag_expr, fifo, wait_s, call_timeout_s, namespace, nameservers, connection
        )
        self._brokers = AsyncBrokers(data_tls_ca)
        self._pops: dict[str, asyncio.Task[list[PoppedMessage]]] = {}  # by broker name
        self._buffer: list[PoppedMessage] = []

    async def receive(
        self, max_msgs: int = 16, invisible_s: float = 30.0, wait_s: float | None = None
    ) -> list[PoppedMessage]:
        """Up to ``max_msgs`` messages, each invisible to the group for ``invisible_s``
        unless acked; waits up to ``wait_s`` (the consumer's default) for one."""
        max_msgs, invisible_ms, wait = self._receive_args(max_msgs, invisible_s, wait_s)
        self._take_answered()
        if not self._buffer:
            names = await asyncio.to_thread(self._readable_brokers)
            free = [n for n in names if n not in self._pops]
            for name, share in self._shares(max_msgs, free):
                self._pops[name] = asyncio.ensure_future(
                    self._pop(name, share, invisible_ms, int(wait * 1000))
                )
            if self._pops:
                await asyncio.wait(
                    list(self._pops.values()),
                    timeout=wait + self.call_timeout_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            self._take_answered()
        got, self._buffer = self._buffer[:max_msgs], self._buffer[max_msgs:]
        return got

    def _take_answered(self) -> None:
        for name, task in list(self._pops.items()):
            if not task.done():
                continue
            del self._pops[name]
            if task.cancelled():
                continue
            exc = task.exception()
            if exc is None:
                self._buffer.extend(task.result())
            elif isinstance(exc, BrokerUnavailableError):
                log.warning("receive: broker %s failed (%s): trying it again", name, exc)
                self.ns.forget_topic_broker(self.topic, name)
            else:
                raise exc

    async def _pop(self, name: str, share: int, invisible_ms: int, wait_ms: int) -> Any:
        actor, handle = await self._master(name)
        answer = await self._brokers.request(
            actor, handle, "pop", self.group, self.topic, share, invisible_ms, wait_ms,
            self.fifo, self.tag_expr, self.client_id,
        )  # fmt: skip
        return await within(answer, wait_ms / 1000 + self.call_timeout_s)

    async def ack(self, message: PoppedMessage) -> None:
        """Done with ``message``: it is not delivered again."""
        handle = self._handle_of(message)
        await self._on_broker(handle, "ack_message", handle)

    async def change_invisible_duration(
        self, message: PoppedMessage, invisible_s: float
    ) -> PoppedMessage:
        """Make ``message`` invisible for ``invisible_s`` from now; it gets its new
        receipt handle (the old one is refused from now on)."""
        invisible_ms = int(check_number("invisible_s", invisible_s) * 1000)
        handle = self._handle_of(message)

        def take(answer: asyncio.Future[Any]) -> None:
            # the broker's new handle, also when the caller stopped waiting for it
            # (cancelled, timed out) after the request was written: the old one is
            # refused from then on, and the message would be left with it
            written = not answer.cancelled() and answer.exception() is None
            if written and message.receipt_handle == handle:
                message.receipt_handle = answer.result()

        await self._on_broker(
            handle, "change_invisible_duration", handle, invisible_ms, settled=take
        )
        return message

    async def _on_broker(
        self,
        receipt: str,
        method: str,
        *args: Any,
        settled: Callable[[asyncio.Future[Any]], None] | None = None,
    ) -> Any:
        self._check_open()
        name = ReceiptHandle.parse(receipt).broker
        actor, handle = await self._master(name)
        answer = await self._brokers.request(actor, handle, method, self.group, self.topic, *args)
        if settled is None:
            return await within(answer, self.call_timeout_s)
        # written: the answer is taken when it comes, whether or not the caller waits
        answer.add_done_callback(settled)
        return await within(asyncio.shield(answer), self.call_timeout_s)

    async def _master(self, name: str) -> tuple[str, Any]:
        return await master(self.ns, self.topic, name)

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Stop receiving; messages received and not acked come back after their
        invisible time (and those of pops still out, which are dropped)."""
        if self._closed:
            return
        self._closed = True
        for task in self._pops.values():
            task.cancel()
        await asyncio.gather(*self._pops.values(), return_exceptions=True)
        self._pops.clear()
        self._buffer.clear()
        self._brokers.close()
        self._leave()

    async def __aenter__(self) -> AsyncSimpleConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
