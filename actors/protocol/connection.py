"""One TCP connection from a client to a broker's data path (aiokafka's ``conn.py``).

Every connection of a process runs on one asyncio loop in a daemon thread (the
client I/O loop); callers on any thread hand it a request and get a
``concurrent.futures.Future`` of the answer. Requests are multiplexed by id: many
are in flight on one connection and answered in whatever order the broker
finishes them (a held pull does not hold up a send behind it).

A connection opens with the cluster's handshake (``actors.protocol.frames``): it
proves it holds the broker's secret and checks that the broker proves it too.
When the connection breaks, every request still waiting fails at once with
``BrokerUnavailableError`` (whoever sent it decides whether to send it again: a
producer retries on another broker, as it does when Ray cannot deliver); the next
request opens a new connection.

Writes (plaintext connections): the caller's thread writes its frame to the socket
itself, with a non-blocking send under the connection's write lock, instead of
waking the I/O loop to do it: a thread hand-over less on every request's way out
(the I/O loop still reads every answer). Whatever the socket cannot take at once,
and every frame while such a remainder waits (or while the connection is opening),
goes through the I/O loop's transport, in order: frames leave in the order their
``request`` calls took the write lock, whichever thread wrote them. TLS connections
always write through the loop (an SSL object is not shared between threads).
``RAYMQ_CLIENT_DIRECT_WRITES=0`` in a process's environment turns direct writes off
(a diagnostic switch, to compare both ways in one benchmark).

A stream (:meth:`BrokerConnection.stream`) is a request with many answers: each
answer the broker flags ``STREAM`` goes to the caller's handler, in the order the
broker wrote them, and the request stays open until an answer without the flag, an
error, or the connection's end settles its future.

Invariant: a request's future is completed exactly once, by its own answer, by
the connection's failure, or by the caller's timeout, never by another's answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from typing import Any

from actors.protocol import frames
from actors.protocol.frames import Code, Flag
from actors.protocol.shared_future import SharedFuture, new_lock
from storage.errors import BrokerUnavailableError

log = logging.getLogger("raymq.actors.protocol.connection")

# plain ints for the per-frame tests: ``int & IntFlag`` runs enum code in Python
_STREAM, _ONEWAY, _OK = int(Flag.STREAM), int(Flag.ONEWAY), int(Code.OK)

CONNECT_TIMEOUT_S = 5.0
DIRECT_WRITES = os.environ.get("RAYMQ_CLIENT_DIRECT_WRITES", "1") != "0"
Answer = tuple[dict[str, Any], bytes]
"""A response: its header, and its body."""
Decode = Callable[[dict[str, Any], Any], Any]
"""What a request's caller makes of its answer's header and body (on the I/O thread)."""
OnAnswer = Callable[[dict[str, Any], Any], None]
"""What a stream's caller does with each of its answers flagged STREAM (on the I/O
thread; what it raises is logged and the stream goes on)."""


class IOLoop:
    """The process's client I/O loop: one asyncio loop in a daemon thread."""

    _instance: IOLoop | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="raymq-client-io", daemon=True
        )
        self._thread.start()

    @classmethod
    def get(cls) -> IOLoop:
        """The loop of this process (a forked child gets its own: threads do not fork)."""
        inst = cls._instance
        if inst is not None and inst.pid == os.getpid():
            return inst
        with cls._lock:
            if cls._instance is None or cls._instance.pid != os.getpid():
                cls._instance = IOLoop()
            return cls._instance

    def run(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    @classmethod
    def on_loop_thread(cls) -> bool:
        """Whether the calling thread is this process's client I/O loop (False when none
        runs): where answers are read, so where nothing may wait for one."""
        inst = cls._instance
        return (  # the thread first: the pid (a system call) only on the loop's thread
            inst is not None
            and threading.current_thread() is inst._thread
            and inst.pid == os.getpid()
        )


async def client_handshake(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes, name: str
) -> None:
    """The client's half of a connection's mutual proof: the broker greets with its
    nonce, the client answers with its own and its proof of the cluster's secret, the
    broker proves it holds the secret too. Raises ``AuthError`` naming ``name``."""
    hello, _ = await frames.read_frame(reader, frames.HANDSHAKE_MAX_BYTES)
    theirs = hello.get("n")
    if hello.get("c") != Code.HELLO or not isinstance(theirs, bytes):
        raise frames.AuthError(f"{name} did not greet as a RayMQ broker")
    mine = frames.nonce()
    auth = {"c": int(Code.AUTH), "o": 0, "n": mine}
    auth["p"] = frames.proof(secret, b"client", theirs, mine)
    writer.writelines(frames.encode(auth))
    try:
        reply, _ = await frames.read_frame(reader, frames.HANDSHAKE_MAX_BYTES)
    except asyncio.IncompleteReadError:
        raise frames.AuthError(f"{name} refused this client's proof") from None
    if reply.get("c") != Code.OK or not frames.check_proof(
        secret, b"broker", mine, theirs, reply.get("p")
    ):
        raise frames.AuthError(f"{name} could not prove it holds the cluster's secret")


class BrokerConnection:
    """A connection to one broker incarnation's data path, shared by every thread."""

    def __init__(
        self,
        addr: str,
        secret: bytes,
        *,
        tls: bool = False,
        tls_ca: str | None = None,
        max_frame_bytes: int = frames.DEFAULT_MAX_FRAME_BYTES,
        name: str = "",
        unix: str | None = None,
    ) -> None:
        """``unix``: the server's Unix socket, for a client on its node; taken instead
        of ``addr`` while it can be connected to (``addr`` otherwise)."""
        host, _, port = addr.rpartition(":")
        self._unix = None if tls else unix
        self.addr = addr
        self.name = name or addr
        self._host, self._port = host, int(port)
        self._secret = secret
        self._ssl = _client_tls(tls_ca) if tls else None
        self._max = max_frame_bytes
        self._io = IOLoop.get()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[concurrent.futures.Future[Any], Decode | None]] = {}
        self._futures = new_lock()  # its requests' futures share it
        self._streams: dict[int, OnAnswer] = {}  # request id -> its STREAM answers' handler
        self._opening_streams: dict[int, OnAnswer] = {}  # id(future) -> handler, until sent
        self._writer: asyncio.WriteTransport | None = None  # after the handshake
        self._broken: BaseException | None = None  # why the broker's frames stopped
        self._stream: asyncio.StreamWriter | None = None
        self._opening: asyncio.Future[None] | None = None
        self.closed = False
        self.error: BaseException | None = None
        # writing: see the module doc. Under _wlock: _direct_ok (callers may write to
        # _sock themselves), _queued (frames handed to the loop, not written yet)
        self._wlock = threading.Lock()
        self._sock: socket.socket | None = None  # a duplicate of the socket's fd
        self._direct_ok = False
        self._queued = 0

    # ------------------------------------------------------------ from any thread
    def request(
        self,
        header: dict[str, Any],
        body: Sequence[Any] = (),
        *,
        oneway: bool = False,
        decode: Decode | None = None,
    ) -> concurrent.futures.Future[Any]:
        """Send a request; a future of its answer (``(header, body)``, or what
        ``decode(header, body)`` makes of it, on the I/O thread), or of the error the
        broker raised (the same RayMQError type), or of what ``decode`` raised, or of the
        connection's failure. One future per request: a caller that wants the answer
        decoded needs no second future settled from the first's callback."""
        fut = SharedFuture(self._futures)
        return self._request_into(fut, header, body, oneway=oneway, decode=decode)

    def _request_into(
        self,
        fut: concurrent.futures.Future[Any],
        header: dict[str, Any],
        body: Sequence[Any],
        *,
        oneway: bool = False,
        decode: Decode | None = None,
    ) -> concurrent.futures.Future[Any]:
        if self.closed:
            _settle(fut, exc=BrokerUnavailableError(f"connection to {self.name} is closed"))
            return fut
        with self._wlock:
            direct = self._direct_ok
            if direct:
                opaque = self._register(fut, oneway, decode)
                self._send_direct(frames.encode({**header, "o": opaque, "f": _flags(oneway)}, body))
            else:
                self._queued += 1
        if not direct:
            self._io.loop.call_soon_threadsafe(self._submit, header, body, fut, oneway, decode)
        elif oneway:
            fut.set_result(({}, b""))  # its callbacks run outside the write lock
        return fut

    def stream(
        self, header: dict[str, Any], on_answer: OnAnswer, body: Sequence[Any] = ()
    ) -> concurrent.futures.Future[Any]:
        """Send a request that has many answers: each answer flagged ``STREAM`` is given
        to ``on_answer(header, body)`` on the I/O thread, in the order the broker wrote
        them. The future settles with the last answer (``(header, body)``, without the
        flag), the broker's error, or the connection's failure; no ``on_answer`` call
        comes after it settles."""
        fut = SharedFuture(self._futures)
        with self._wlock:
            self._opening_streams[id(fut)] = on_answer
        fut.add_done_callback(self._forget_stream)
        return self._request_into(fut, header, body)

    def _forget_stream(self, fut: concurrent.futures.Future[Any]) -> None:
        with self._wlock:
            self._opening_streams.pop(id(fut), None)

    def _register(
        self, fut: concurrent.futures.Future[Any], oneway: bool, decode: Decode | None
    ) -> int:
        """A request id for ``fut``, which waits in ``_pending`` for its answer (before
        its frame is written: the answer may come before the write returns). A oneway
        request's future is the caller's to settle, after the write lock is let go.
        The entry leaves ``_pending`` with its answer or with the connection's failure,
        whichever comes first (a caller's timeout leaves the future pending: the
        broker's answer, or the end of the connection, still takes it out)."""
        opaque = next(self._ids)
        if not oneway:
            self._pending[opaque] = (fut, decode)
            on_answer = self._opening_streams.pop(id(fut), None)
            if on_answer is not None:
                self._streams[opaque] = on_answer
        return opaque

    def _send_direct(self, parts: list[Any]) -> None:
        """Write a frame to the socket from this thread (``_wlock`` held, ``_direct_ok``);
        what the socket cannot take now goes to the loop, and the frames after it too."""
        sock = self._sock
        assert sock is not None
        one = len(parts) == 1 and type(parts[0]) is bytes  # a small frame: joined
        views = parts if one else [memoryview(p).cast("B") for p in parts]
        try:
            sent = sock.send(parts[0]) if one else sock.sendmsg(views)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:  # the loop's reader hears of it too: end the connection
            self._direct_ok = False
            self._io.loop.call_soon_threadsafe(self._abort, exc)
            return
        if sent == (len(parts[0]) if one else sum(v.nbytes for v in views)):
            return
        if one:
            views = [memoryview(parts[0])]
        rest = []  # views of what is left (the transport copies what it cannot send)
        for v in views:
            if sent >= v.nbytes:
                sent -= v.nbytes
                continue
            rest.append(v[sent:])
            sent = 0
        self._direct_ok = False
        self._queued += 1
        self._io.loop.call_soon_threadsafe(self._write_rest, rest)

    def open(self, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """Connect and prove membership now (raises BrokerUnavailableError if it cannot)."""
        self._io.run(self._ensure_open()).result(timeout_s)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with self._wlock:
            self._direct_ok = False
        self._io.loop.call_soon_threadsafe(self._fail, BrokerUnavailableError("closed"))

    # ------------------------------------------------------------ on the I/O loop
    def _submit(
        self,
        header: dict[str, Any],
        body: Sequence[Any],
        fut: concurrent.futures.Future[Any],
        oneway: bool,
        decode: Decode | None,
    ) -> None:
        """A frame handed to the loop, written through the transport (in the order the
        frames were handed over) once the connection is open; then callers may write
        directly again if all is out."""
        writer = self._writer
        if writer is None or writer.is_closing():

            def opened(t: asyncio.Future[None]) -> None:
                exc = t.exception() if not t.cancelled() else BrokerUnavailableError("cancelled")
                if exc is None and self._writer is not None:
                    self._submit(header, body, fut, oneway, decode)
                    return
                with self._wlock:
                    self._queued -= 1
                _settle(fut, exc=exc or BrokerUnavailableError(f"{self.name}: not connected"))

            asyncio.ensure_future(self._ensure_open()).add_done_callback(opened)
            return
        with self._wlock:
            self._queued -= 1
            written = not fut.done()  # else the caller gave up before it left
            if written:
                opaque = self._register(fut, oneway, decode)
                frames.write_frame(writer, {**header, "o": opaque, "f": _flags(oneway)}, body)
            self._allow_direct()
        if written and oneway:
            _settle(fut, ({}, b""))

    def _write_rest(self, rest: list[memoryview]) -> None:
        """What a direct write left over."""
        with self._wlock:
            self._queued -= 1
            writer = self._writer
            if writer is not None and not writer.is_closing():
                for view in rest:
                    writer.write(view)
            self._allow_direct()

    def _allow_direct(self) -> None:
        """Callers may write themselves once nothing waits to be written (``_wlock`` held)."""
        writer = self._writer
        self._direct_ok = (
            DIRECT_WRITES
            and self._sock is not None
            and not self.closed
            and self._queued == 0
            and writer is not None
            and not writer.is_closing()
            and writer.get_write_buffer_size() == 0
        )

    def _on_drained(self) -> None:
        with self._wlock:
            self._allow_direct()

    def _abort(self, exc: BaseException) -> None:
        writer = self._writer
        if writer is not None:
            self._broken = BrokerUnavailableError(f"connection to {self.name} broke: {exc}")
            writer.abort()

    async def _ensure_open(self) -> None:
        if self._writer is not None and not self._writer.is_closing():
            return
        if self._opening is None or self._opening.done():
            self._opening = asyncio.ensure_future(self._connect())
        await asyncio.shield(self._opening)

    async def _connect(self) -> None:
        if self.closed:
            raise BrokerUnavailableError(f"connection to {self.name} is closed")
        opened: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        if self._unix is not None:
            try:
                opened = await asyncio.wait_for(
                    asyncio.open_unix_connection(self._unix, limit=1 << 20), CONNECT_TIMEOUT_S
                )
            except (OSError, asyncio.TimeoutError) as exc:  # gone, or not this node's
                log.info(
                    "%s: its local socket %s: %s; taking %s", self.name, self._unix, exc, self.addr
                )
                self._unix = None
        if opened is None:
            try:
                opened = await asyncio.wait_for(
                    asyncio.open_connection(self._host, self._port, ssl=self._ssl, limit=1 << 20),
                    CONNECT_TIMEOUT_S,
                )
            except (OSError, asyncio.TimeoutError) as exc:
                raise BrokerUnavailableError(f"cannot connect to {self.name}: {exc}") from exc
        reader, writer = opened
        try:
            await asyncio.wait_for(self._handshake(reader, writer), frames.HANDSHAKE_TIMEOUT_S)
        except BaseException as exc:
            writer.close()
            if isinstance(exc, BrokerUnavailableError):
                raise
            raise BrokerUnavailableError(f"handshake with {self.name} failed: {exc}") from exc
        # from here the broker's frames are parsed as they arrive (frames.FrameReader)
        transport = writer.transport
        leftover = bytes(getattr(reader, "_buffer", b""))  # none: the broker waits for us
        proto = frames.FrameReader(
            transport,
            self._max,
            self._on_frame,
            self._on_bad_frame,
            lambda exc: self._on_lost(transport, exc),
        )
        transport.set_protocol(proto)
        if leftover:
            proto.feed(leftover)
        self._stream = writer  # a StreamWriter that is collected closes its transport
        self._broken = None
        self.error = None
        with self._wlock:
            self._writer = transport
            if self._ssl is None and DIRECT_WRITES:
                if self._sock is not None:  # an old transport's, not yet told it was lost
                    self._sock.close()
                raw = transport.get_extra_info("socket")
                self._sock = socket.socket(fileno=os.dup(raw.fileno()))
                self._sock.setblocking(False)
                # told when a remainder is out: pause at any byte buffered, resume at none
                transport.set_write_buffer_limits(high=0, low=0)  # type: ignore[attr-defined]
                proto.on_drained = self._on_drained
            self._allow_direct()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await client_handshake(reader, writer, self._secret, self.name)

    def _on_frame(self, header: dict[str, Any], body: bytes | memoryview) -> None:
        flags = header.get("f", 0)
        if isinstance(flags, int) and flags & _STREAM and header["c"] == _OK:
            on_answer = self._streams.get(header["o"])
            if on_answer is not None:
                try:
                    on_answer(header, body)
                except Exception:  # noqa: BLE001 - the caller's handler; the stream goes on
                    log.exception("%s: a stream's handler failed", self.name)
            return
        self._streams.pop(header["o"], None)
        entry = self._pending.pop(header["o"], None)
        if entry is None:
            return  # not a request of this connection's (or answered already)
        fut, decode = entry
        if fut.done():
            return
        if header["c"] != Code.OK:
            _settle(fut, exc=frames.error_from(header))
        elif decode is None:
            _settle(fut, (header, body))  # type: ignore[arg-type]
        else:
            try:
                answer = decode(header, body)
            except BaseException as exc:  # noqa: BLE001 - the caller's rpc.get raises it
                _settle(fut, exc=exc)
                return
            _settle(fut, answer)

    def _on_bad_frame(self, exc: frames.FrameError) -> None:
        self._broken = BrokerUnavailableError(f"connection to {self.name} broke: {exc}")

    def _on_lost(self, transport: asyncio.BaseTransport, exc: Exception | None) -> None:
        error = self._broken
        if error is None:
            error = BrokerUnavailableError(
                f"connection to {self.name} broke: {exc}"
                if exc is not None
                else f"{self.name} closed the connection"
            )
        with self._wlock:
            if self._writer is transport:
                self._writer = None
                self._drop_sock()
        self._fail(error)

    def _drop_sock(self) -> None:
        """No direct writes from now (``_wlock`` held): the duplicate fd is closed."""
        self._direct_ok = False
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _fail(self, error: BaseException) -> None:
        """Every request still waiting fails with ``error`` (and the writer closes)."""
        self.error = error
        if self.closed and self._writer is not None:
            with self._wlock:
                self._writer.close()
                self._writer = None
                self._drop_sock()
        pending, self._pending = self._pending, {}
        self._streams = {}
        for fut, _ in pending.values():
            _settle(fut, exc=error)


def _flags(oneway: bool) -> int:
    return _ONEWAY if oneway else 0


def _settle(
    fut: concurrent.futures.Future[Any],
    result: Any = None,
    *,
    exc: BaseException | None = None,
) -> None:
    if fut.done():
        return
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)  # type: ignore[arg-type]
    except concurrent.futures.InvalidStateError:  # completed meanwhile by a timeout
        pass


def _client_tls(ca: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca)
    if ca is None:  # the cluster's secret authenticates the broker; TLS only encrypts
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
