"""A broker's data path on the caller's event loop: the asyncio clients' connections.

:class:`AsyncConnection` speaks the framed protocol (``actors.protocol.frames``) on
the loop that opened it: the cluster's handshake, then ``frames.FrameReader``
parses answers in the loop's read callback and settles each request's
``asyncio.Future`` there. No thread stands between the caller and the socket: a
request's frame is written by the coroutine that makes it, and its answer wakes
that coroutine directly.

:class:`AsyncBrokers` keeps one connection per broker actor for one loop, found as
the synchronous data path finds it (``Broker.data_path`` through Ray, awaited, once
per broker incarnation) and framed by the same declarations
(``actors.protocol.requests``). A broker whose connection broke is connected again
at its next call.

Invariants: a request's future is settled exactly once, by its answer or by the
connection's end; :meth:`AsyncConnection.request` writes the whole frame before it
returns (or raises :class:`NotWritten`, nothing of it on the socket).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from actors.protocol import frames
from actors.protocol.connection import client_handshake
from actors.protocol.frames import Code
from actors.protocol.requests import BROKER, Request, by_method
from actors.protocol.route import TopicRouteData
from storage.errors import BrokerUnavailableError

log = logging.getLogger("raymq.actors.aio.connection")

CONNECT_TIMEOUT_S = 5.0
DATA_PATH_CALL_S = 5.0
Decode = Callable[[dict[str, Any], Any], Any]
_REQUESTS: Mapping[str, Request] = by_method(BROKER)
T = TypeVar("T")


async def within(aw: Awaitable[T], timeout: float | None) -> T:
    """``await aw`` for at most ``timeout`` seconds (None: no bound); asyncio.TimeoutError
    after it, ``aw`` cancelled. As ``asyncio.wait_for``, except that a cancellation of
    the caller is never lost: before Python 3.12, ``wait_for`` drops one that arrives in
    the loop turn ``aw`` finishes and returns ``aw``'s result, so a cancelled consume
    loop went on consuming. The asyncio clients await every bounded call through this."""
    task = asyncio.ensure_future(aw)
    if timeout is None:
        return await task
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(max(0.0, timeout), expire)
    try:
        return await task
    except asyncio.CancelledError:
        if expired and task.cancelled():
            current = asyncio.current_task()
            if current is None or not _cancelling(current):
                raise asyncio.TimeoutError() from None
        raise
    finally:
        timer.cancel()


def _cancelling(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` itself was asked to cancel (Python 3.11+ knows; before, no)."""
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling()) if cancelling is not None else False


class NotWritten(BrokerUnavailableError):
    """A request that never reached the socket (no connection, or it is closed)."""


class AsyncConnection:
    """One connection to a broker's socket, on the loop that opened it."""

    def __init__(self, name: str, max_frame_bytes: int = frames.DEFAULT_MAX_FRAME_BYTES) -> None:
        self.name = name
        self._max = max_frame_bytes
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[Any], Decode | None]] = {}
        self._transport: asyncio.WriteTransport | None = None
        self._proto: frames.FrameReader | None = None
        self._stream: asyncio.StreamWriter | None = None
        self.error: BaseException | None = None
        self.closed = False

    @classmethod
    async def open(
        cls, addr: str, secret: bytes, *, name: str = "", ssl: Any = None
    ) -> AsyncConnection:
        """Connect to ``addr`` and prove membership with ``secret``."""
        conn = cls(name or addr)
        host, _, port = addr.rpartition(":")
        try:
            reader, writer = await within(
                asyncio.open_connection(host, int(port), ssl=ssl, limit=1 << 20),
                CONNECT_TIMEOUT_S,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise NotWritten(f"cannot connect to {conn.name}: {exc}") from exc
        try:
            await within(conn._handshake(reader, writer, secret), frames.HANDSHAKE_TIMEOUT_S)
        except BaseException as exc:
            writer.close()
            if isinstance(exc, BrokerUnavailableError):
                raise NotWritten(str(exc)) from exc
            if isinstance(exc, Exception):
                raise NotWritten(f"handshake with {conn.name} failed: {exc}") from exc
            raise
        transport = writer.transport
        proto = frames.FrameReader(
            transport, conn._max, conn._on_frame, conn._on_bad_frame, conn._on_lost
        )
        transport.set_protocol(proto)
        conn._stream, conn._transport, conn._proto = writer, transport, proto  # type: ignore[assignment]
        return conn

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes
    ) -> None:
        await client_handshake(reader, writer, secret, self.name)

    @property
    def usable(self) -> bool:
        t = self._transport
        return not self.closed and self.error is None and t is not None and not t.is_closing()

    def request(
        self, header: dict[str, Any], body: Sequence[Any] = (), decode: Decode | None = None
    ) -> asyncio.Future[Any]:
        """Write the request's frame now; the future of its answer (what ``decode``
        makes of it), of the error the broker raised, or of the connection's end.
        Raises :class:`NotWritten` when nothing could be written."""
        transport = self._transport
        if not self.usable or transport is None:
            raise NotWritten(f"connection to {self.name} is closed: {self.error}")
        opaque = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[opaque] = (fut, decode)
        frames.write_frame(transport, {**header, "o": opaque, "f": 0}, body)
        return fut

    async def drain(self) -> None:
        """Until the socket's write buffer is below its high-water mark (backpressure)."""
        if self._proto is not None:
            await self._proto.drain()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._transport is not None:
            self._transport.close()
        self._fail(BrokerUnavailableError(f"connection to {self.name} closed"))

    # ------------------------------------------------------------ the loop's callbacks
    def _on_frame(self, header: dict[str, Any], body: Any) -> None:
        entry = self._pending.pop(header["o"], None)
        if entry is None:
            return
        fut, decode = entry
        if fut.done():  # its caller stopped waiting: the answer has nobody to go to
            return
        if header["c"] != Code.OK:
            fut.set_exception(frames.error_from(header))
            return
        try:
            fut.set_result((header, body) if decode is None else decode(header, body))
        except Exception as exc:  # noqa: BLE001 - the caller hears what decoding raised
            fut.set_exception(exc)

    def _on_bad_frame(self, exc: frames.FrameError) -> None:
        self.error = BrokerUnavailableError(f"connection to {self.name} broke: {exc}")

    def _on_lost(self, exc: Exception | None) -> None:
        if self.error is None:
            self.error = BrokerUnavailableError(
                f"connection to {self.name} broke: {exc}"
                if exc is not None
                else f"{self.name} closed the connection"
            )
        self._fail(self.error)

    def _fail(self, error: BaseException) -> None:
        pending, self._pending = self._pending, {}
        for fut, _ in pending.values():
            if not fut.done():
                fut.set_exception(error)


class AsyncBrokers:
    """One :class:`AsyncConnection` per broker actor, for the loop of its first use."""

    def __init__(self, tls_ca: str | None = None) -> None:
        self._tls_ca = tls_ca
        self._conns: dict[str, AsyncConnection] = {}
        self._opening: dict[str, asyncio.Future[AsyncConnection]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    async def connection(self, actor_name: str, handle: Any) -> AsyncConnection:
        """The open connection to ``actor_name`` (its Ray ``handle`` says where it listens)."""
        loop = asyncio.get_running_loop()
        if self.loop is None:
            self.loop = loop
        elif self.loop is not loop:
            raise RuntimeError("an asyncio client is used on the event loop it first ran on")
        conn = self._conns.get(actor_name)
        if conn is not None and conn.usable:
            return conn
        opening = self._opening.get(actor_name)
        if opening is None:
            opening = self._opening[actor_name] = asyncio.ensure_future(
                self._open(actor_name, handle)
            )
            opening.add_done_callback(lambda _: self._opening.pop(actor_name, None))
        return await asyncio.shield(opening)

    def open_connection(self, actor_name: str) -> AsyncConnection | None:
        """The connection to ``actor_name`` when it is open on the running loop (no
        wait, nothing opened): a write that must not yield looks here first."""
        conn = self._conns.get(actor_name)
        if conn is None or not conn.usable or self.loop is not asyncio.get_running_loop():
            return None
        return conn

    async def _open(self, actor_name: str, handle: Any) -> AsyncConnection:
        try:
            info = await within(handle.data_path.remote(), DATA_PATH_CALL_S)
        except Exception as exc:  # noqa: BLE001 - Ray's failure, as a broker unavailable
            raise NotWritten(f"broker {actor_name}: no data path ({exc})") from exc
        if not info:
            raise NotWritten(f"broker {actor_name} serves no data path")
        ssl = _tls(self._tls_ca) if info.get("tls") else None
        conn = await AsyncConnection.open(info["addr"], info["secret"], name=actor_name, ssl=ssl)
        old = self._conns.get(actor_name)
        self._conns[actor_name] = conn
        if old is not None:
            old.close()
        log.debug("connected to broker %s at %s", actor_name, info["addr"])
        return conn

    async def call(self, actor_name: str, handle: Any, method: str, *args: Any) -> Any:
        """``method(*args)`` of the broker, framed as ``actors.protocol.requests``
        declares it, over its socket; its answer as the Ray method would return it."""
        return await (await self.request(actor_name, handle, method, *args))

    async def request(
        self, actor_name: str, handle: Any, method: str, *args: Any
    ) -> asyncio.Future[Any]:
        """:meth:`call` written now (without a suspension when the connection is
        open): the future of its answer. Awaited through :func:`within`, a future
        costs no task and no turn of the loop, as a coroutine would (each pull and
        commit's answer reaches its caller in the turn it arrives in)."""
        conn = await self.connection(actor_name, handle)
        header, body, decode = _REQUESTS[method].encode(*args)
        return conn.request(header, body, decode)

    def close(self) -> None:
        conns, self._conns = self._conns, {}
        for conn in conns.values():
            conn.close()


async def master(
    ns: Any, topic: str, broker_name: str, route: TopicRouteData | None = None
) -> tuple[str, Any]:
    """The actor name and Ray handle of ``broker_name``'s master, by ``route`` or else
    by ``topic``'s cached route in the client view ``ns`` (read again on a worker
    thread when it does not name the broker; the handle too, when not cached yet).
    Raises :class:`NotWritten` when the broker has no live master."""
    if route is None:
        cached = ns.names.cached_route(topic)
        if cached is None or cached.broker(broker_name) is None:
            cached = await asyncio.to_thread(ns.require_route, topic, refresh=True)
        route = cached
    bd = route.broker(broker_name)
    actor = bd.master_actor_name() if bd is not None else None
    if actor is None:
        raise NotWritten(f"broker {broker_name!r} has no live master in the route")
    stub = ns.handles._handles.get(actor)
    if stub is None:
        stub = await asyncio.to_thread(ns.broker, route, broker_name)
    return actor, getattr(stub, "handle", stub)


def _tls(ca: str | None) -> Any:
    import ssl

    context = ssl.create_default_context(cafile=ca)
    if ca is None:  # the cluster's secret authenticates the broker; TLS only encrypts
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
