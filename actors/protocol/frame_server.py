"""A server of the cluster's framed protocol (``actors.protocol.frames``): the door a
Ray actor opens for what its clients do often, beside its Ray methods.

A broker serves its data path this way (``actors.broker.listener``) and the
transaction coordinator its producers' decisions (``actors.coordinator.txn``). What
both share is here:

* A connection must prove it belongs to the cluster (HMAC over this incarnation's
  secret, which clients get through Ray) before anything else is read from it, and
  at most ``HANDSHAKE_MAX_BYTES`` until then; the server proves it holds the secret
  too.
* A proved connection's frames are parsed as they arrive, each request run as its own
  task and answered in whatever order they finish; at most
  ``max_requests_per_connection`` run at once (reading pauses beyond). A request the
  subclass can do without waiting for anything (:meth:`FrameServer._answer_now`: a
  broker's send to an ASYNC_FLUSH store), arriving while none of its connection's
  requests runs as a task, is done and answered from the reader's callback instead:
  requests still take effect in the order they came.
* A frame over ``max_frame_bytes`` or malformed closes the connection; nothing is
  dispatched from it. A RayMQError a request raises is its answer (the same type on
  the client's side); the connection goes on.

A request may answer many times (a stream, the wire's ``STREAM`` flag): while it
runs as a task its serving coroutine finds its :class:`ServerStream` with
:func:`current_stream` (None when it was called through Ray), writes answers flagged
``STREAM`` with :meth:`ServerStream.send`, and its return is the last answer. The
connection's state (:class:`Peer`) holds what its streams left open (a broker's
subscriptions) and says when the connection is gone.

Beside its TCP port a server without TLS listens on a Unix socket (``local_socket``):
a file only its user may open, in a directory only its user may enter
(:func:`local_socket_dir`), named with the process and a random token, removed when
the server stops (and, once its process is gone, by the next server that starts). A
client on the same node reaches it there instead (``actors.protocol.data_path``):
the same handshake and frames, at half the kernel's cost of a loopback TCP segment
(``benchmarks/local_socket.py``, a send of a few hundred bytes a millisecond apart on
a 2-core VM: 8 us of CPU against 17, a round trip's median 23 us against 38). With
TLS every client takes the TLS port: an operator who asked for TLS gets it on every
connection.

A server is given its requests' table (``actors.protocol.requests.Dispatch``: each
code's declaration and the coroutine serving it); a subclass names itself and may
answer some requests at once (:meth:`FrameServer._answer_now`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import secrets
import socket
import ssl
import stat
import tempfile
from typing import Any

from actors.protocol import frames
from actors.protocol.errors import AnswerDroppedError
from actors.protocol.frames import Code, Flag
from actors.protocol.requests import Dispatch
from storage.errors import RayMQError

log = logging.getLogger("raymq.actors.protocol.frame_server")

# plain ints for the per-frame tests: ``int & IntFlag`` runs enum code in Python
_RESPONSE, _ONEWAY, _STREAM = int(Flag.RESPONSE), int(Flag.ONEWAY), int(Flag.STREAM)


class Peer:
    """One proved connection's state, shared by its requests: ``streams`` holds what
    its open streams keep by their request id (a broker's subscriptions), ``on_lost``
    callbacks run once when the connection ends."""

    def __init__(self) -> None:
        self.streams: dict[int, Any] = {}
        self.lost = False
        self._on_lost: list[Any] = []

    def on_lost(self, callback: Any) -> None:
        """``callback()`` when the connection ends (at once if it has)."""
        if self.lost:
            callback()
        else:
            self._on_lost.append(callback)

    def forget(self, callback: Any) -> None:
        with contextlib.suppress(ValueError):
            self._on_lost.remove(callback)

    def _end(self) -> None:
        if self.lost:
            return
        self.lost = True
        callbacks, self._on_lost = self._on_lost, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: BLE001 - one stream's cleanup; the others go on
                log.exception("a connection's end callback failed")


class ServerStream:
    """The request a serving coroutine is answering, when it came on a connection:
    its id, its connection (:class:`Peer`), and :meth:`send` for answers before the
    last one."""

    def __init__(
        self, opaque: int, peer: Peer, transport: asyncio.WriteTransport, proto: Any
    ) -> None:
        self.opaque = opaque
        self.peer = peer
        self._transport = transport
        self._proto = proto
        self.sent = 0

    @property
    def lost(self) -> bool:
        return self.peer.lost or self._transport.is_closing()

    async def send(self, fields: dict[str, Any], parts: list[Any]) -> bool:
        """One answer flagged ``STREAM`` (the request stays open); it waits while the
        connection's write buffer is over its high-water mark. False: the connection
        is gone, nothing was written."""
        if self.lost:
            return False
        reply = {"c": int(Code.OK), **fields, "o": self.opaque}
        reply["f"] = _RESPONSE | _STREAM
        frames.write_frame(self._transport, reply, parts)
        self.sent += 1
        await self._proto.drain()
        return not self.lost


_CURRENT: contextvars.ContextVar[ServerStream | None] = contextvars.ContextVar(
    "raymq_frame_request", default=None
)


def current_stream() -> ServerStream | None:
    """The request the running serving coroutine answers on a connection (None when it
    was called through Ray or outside a request)."""
    return _CURRENT.get()


class FrameServer:
    """Serves framed requests on ``host:port`` (0: any free port) to proved clients, each
    as ``dispatch`` says (an unknown code is a malformed frame)."""

    def __init__(
        self,
        name: str,
        dispatch: Dispatch,
        host: str,
        port: int,
        max_frame_bytes: int,
        max_requests_per_connection: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.name = name
        self.dispatch = dispatch
        self.host = host
        self.bind_port = port
        self.max_frame_bytes = max_frame_bytes
        self.max_requests = max_requests_per_connection
        self.ssl_context = ssl_context
        self.secret = secrets.token_bytes(32)
        """This incarnation's secret: clients get it through Ray."""
        self._server: asyncio.Server | None = None
        self._unix_server: asyncio.AbstractServer | None = None
        self.unix_path: str | None = None
        """The Unix socket clients on this node may take (``start(local_socket=True)``)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.stats = {
            "connections": 0,
            "local_connections": 0,  # of them: on its Unix socket
            "refused": 0,
            "requests": 0,
            "answered_at_once": 0,  # of them: done in the reader's callback, no task
            "bad_frames": 0,
            "paused_reads": 0,
        }

    @property
    def closing(self) -> bool:
        """Whether the actor is shutting down (new requests close their connection)."""
        return False

    async def start(self, advertised_host: str, local_socket: bool = False) -> None:
        """Listen on the TCP port and, with ``local_socket`` and no TLS, on a Unix
        socket too (:attr:`unix_path`; none when it cannot be made: local clients then
        take the port, as remote ones do)."""
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(
            self._serve, host=self.host, port=self.bind_port, ssl=self.ssl_context, limit=1 << 20
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.advertised = f"{advertised_host}:{self.port}"
        if local_socket and self.ssl_context is None:
            await self._listen_locally()

    async def _listen_locally(self) -> None:
        try:
            folder = local_socket_dir()
            _remove_stale_sockets(folder)
            path = os.path.join(folder, f"{os.getpid()}-{secrets.token_hex(6)}.sock")
            self._unix_server = await asyncio.start_unix_server(
                self._serve, path=path, limit=1 << 20
            )
            os.chmod(path, 0o600)
        except OSError as exc:
            log.warning(
                "%s: no local socket (%s): clients on this node take its port", self.name, exc
            )
            return
        self.unix_path = path

    @property
    def addr(self) -> str:
        return self.advertised if self.port else ""

    async def stop(self) -> None:
        if self._unix_server is not None:
            self._unix_server.close()
            self._unix_server = None
        if self.unix_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.unix_path)
            self.unix_path = None
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._conns):
            writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)
        self._server = None

    # ------------------------------------------------------------ a connection
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            if not await self._handshake(reader, writer):
                self.stats["refused"] += 1
                log.warning("%s: refused a connection from %s", self.name, peer)
                return
            self.stats["connections"] += 1
            if writer.get_extra_info("socket").family == socket.AF_UNIX:
                self.stats["local_connections"] += 1
            self._conns.add(writer)
            await self._serve_frames(reader, writer, peer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
            return
        finally:
            self._conns.discard(writer)
            writer.close()

    async def _serve_frames(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Any
    ) -> None:
        """A proved connection's requests, parsed as they arrive (``frames.FrameReader``),
        each run as its own task, until the connection ends."""
        transport = writer.transport
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tasks: set[asyncio.Task[None]] = set()
        peer = Peer()

        cap = self.max_requests
        paused = False

        def ended(task: asyncio.Task[None]) -> None:
            nonlocal paused
            tasks.discard(task)
            if paused and len(tasks) < cap and not transport.is_closing():
                paused = False
                proto.resume()

        def on_frame(header: dict[str, Any], body: bytes | memoryview) -> None:
            nonlocal paused
            if self.closing:
                transport.close()
                return
            if "o" not in header:  # no id to answer it by: malformed, like a bad header
                proto.fail(frames.FrameError(f"a request without an id: {header!r:.200}"))
                return
            # at once only behind no task of this connection: what a client sent first
            # takes effect first (a send answered at once never overtakes one in a task)
            if (
                not tasks
                and not proto.writing_paused
                and self._answered_now(header, body, transport)
            ):
                return
            task = asyncio.ensure_future(self._request(header, body, transport, proto, peer))
            tasks.add(task)
            task.add_done_callback(ended)
            if len(tasks) >= cap and not paused:  # read no more until some end
                paused = True
                self.stats["paused_reads"] += 1
                proto.pause()

        def on_error(exc: frames.FrameError) -> None:
            self.stats["bad_frames"] += 1
            log.warning("%s: closing %s: %s", self.name, peer, exc)

        def on_lost(exc: Exception | None) -> None:
            peer._end()
            if not lost.done():
                lost.set_result(None)

        proto = frames.FrameReader(transport, self.max_frame_bytes, on_frame, on_error, on_lost)
        transport.set_protocol(proto)
        leftover = bytes(getattr(reader, "_buffer", b""))  # requests sent right behind AUTH
        if leftover:
            proto.feed(leftover)
        try:
            await lost
        finally:
            peer._end()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        mine = frames.nonce()
        writer.writelines(frames.encode({"c": int(Code.HELLO), "o": 0, "n": mine}))
        try:
            header, _ = await asyncio.wait_for(
                frames.read_frame(reader, frames.HANDSHAKE_MAX_BYTES), frames.HANDSHAKE_TIMEOUT_S
            )
        except (frames.FrameError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            return False
        theirs = header.get("n")
        if (
            header.get("c") != Code.AUTH
            or not isinstance(theirs, bytes)
            or len(theirs) != frames.NONCE_BYTES
            or not frames.check_proof(self.secret, b"client", mine, theirs, header.get("p"))
        ):
            return False
        reply = {"c": int(Code.OK), "o": 0, "p": frames.proof(self.secret, b"broker", theirs, mine)}
        writer.writelines(frames.encode(reply))
        return True

    # ------------------------------------------------------------ a request
    async def _request(
        self,
        header: dict[str, Any],
        body: bytes | memoryview,
        transport: asyncio.WriteTransport,
        proto: frames.FrameReader,
        peer: Peer,
    ) -> None:
        self.stats["requests"] += 1
        opaque = header["o"]
        _CURRENT.set(ServerStream(opaque, peer, transport, proto))  # this task's own
        flags = _flags_of(header)
        try:
            if flags is None:  # refused before anything is done
                raise frames.FrameError(f"frame flags {header.get('f')!r:.40}: not an int")
            fields, parts = await self.dispatch(header["c"], header, body)
            reply = {"c": int(Code.OK), **fields}
        except AnswerDroppedError:  # an injected fault: the connection goes, unanswered
            transport.abort()
            return
        except RayMQError as exc:
            reply, parts = frames.error_fields(exc), []
        except Exception as exc:  # noqa: BLE001 - the client hears of it; the server goes on
            log.exception("%s: request %s failed", self.name, header.get("c"))
            reply, parts = frames.error_fields(exc), []
        if (flags or 0) & _ONEWAY or transport.is_closing():
            return
        reply.update(o=opaque, f=_RESPONSE)
        frames.write_frame(transport, reply, parts)
        await proto.drain()

    def _answered_now(
        self, header: dict[str, Any], body: bytes | memoryview, transport: asyncio.WriteTransport
    ) -> bool:
        """A request the subclass can answer at once (:meth:`_answer_now`), answered from
        the frame reader's callback: no task, no coroutines. False: run it as a task.
        Only asked while none of the connection's requests runs as a task (so requests
        take effect in the order they came) and while the transport's buffer is under
        its high-water mark (a task's answer waits for it to drain, and holds its place
        among the connection's ``max_requests_per_connection`` meanwhile)."""
        flags = _flags_of(header)
        if flags is None:  # malformed: the task's path refuses it
            return False
        try:
            now = self._answer_now(header["c"], header, body)
            if now is None:
                return False
            fields, parts, later = now
            reply = {"c": int(Code.OK), **fields}
        except RayMQError as exc:
            reply, parts, later = frames.error_fields(exc), [], False
        except Exception as exc:  # noqa: BLE001 - the client hears of it; the server goes on
            log.exception("%s: request %s failed", self.name, header.get("c"))
            reply, parts, later = frames.error_fields(exc), [], False
        self.stats["requests"] += 1
        self.stats["answered_at_once"] += 1
        if flags & _ONEWAY:
            return True
        reply.update(o=header["o"], f=_RESPONSE)
        if later:  # after the callbacks already scheduled (held pulls it woke)
            assert self._loop is not None  # a frame came: the server was started
            self._loop.call_soon(_write_open, transport, reply, parts)
        else:
            _write_open(transport, reply, parts)
        return True

    def _answer_now(
        self, code: int, h: dict[str, Any], body: bytes | memoryview
    ) -> tuple[dict[str, Any], list[Any], bool] | None:
        """Request ``code`` done and answered at once, when nothing in it would wait:
        (the answer's header fields, its body parts, whether to write it only after the
        loop's callbacks scheduled already), or None for a task of :attr:`dispatch`'s.
        It raises what the dispatch would. None here: every request is a task."""
        return None


def local_socket_dir() -> str:
    """The directory of this user's servers' Unix sockets (``<tmp>/raymq-<uid>``), made
    if missing: ``OSError`` unless it is this user's own, a real directory, that no one
    else may enter or write to."""
    folder = os.path.join(tempfile.gettempdir(), f"raymq-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(
            f"{folder}: not a directory of this user's alone (mode {st.st_mode:o}, "
            f"uid {st.st_uid}): no Unix socket is made there"
        )
    return folder


def _remove_stale_sockets(folder: str) -> None:
    """Remove the sockets of servers whose process is gone (killed: not stopped)."""
    for name in os.listdir(folder):
        pid, _, rest = name.partition("-")
        if not rest.endswith(".sock") or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
        except PermissionError:  # alive, another user's (in our directory? left alone)
            continue


def _flags_of(header: dict[str, Any]) -> int | None:
    """A request's flags (0 when it names none), None when they are not an int."""
    flags = header.get("f", 0)
    return flags if isinstance(flags, int) and not isinstance(flags, bool) else None


def _write_open(transport: asyncio.WriteTransport, reply: dict[str, Any], parts: list[Any]) -> None:
    if not transport.is_closing():
        frames.write_frame(transport, reply, parts)
