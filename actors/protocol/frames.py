"""The data path's wire: frames between a client and a broker's own socket.

RocketMQ's ``RemotingCommand`` in one module (a length, a header, an opaque body),
with Kafka's habit of a version in every request. Ray stays the control plane;
what flows per message (sends, pulls, offset commits, send-back, heartbeats, POP
receives, acks and changes of invisible time) goes over a TCP connection the client
keeps to each broker, many requests in flight at once and answered out of order by
request id.

A frame, big-endian::

    length  u32   bytes after this field: 4 + header length + body length
    hlen    u32   header length
    header  msgpack map: "c" code, "o" request id (opaque), "f" flags, "v" version,
            and the request's own fields (short keys)
    body    bytes: for a send, the batch exactly as ``EncodedBatch.to_bytes`` encodes it
            (nothing is encoded twice); for a pull answer, ``pulls_to_wire``'s blob

A response carries its request's id, the RESPONSE flag and code ``OK`` or
``ERROR`` (then "e" the error's type name and "m" its message: the client raises
the same RayMQError type the broker raised).

Before anything else is read, a connection proves it belongs to the cluster
(challenge and response over the cluster's secret, HMAC-SHA256):

    broker -> client   HELLO  {"n": broker nonce}
    client -> broker   AUTH   {"n": client nonce, "p": hmac(secret, "client" | bn | cn)}
    broker -> client   OK     {"p": hmac(secret, "broker" | cn | bn)}

A broker reads at most ``HANDSHAKE_MAX_BYTES`` of a connection that has not proved
itself, and closes it on the first wrong byte; the client checks the broker's proof
in turn, so neither side talks to an impostor. The secret itself never crosses the
socket. TLS (Python's ``ssl``) can wrap the connection as well.

Invariants: a frame's declared length is checked against the receiver's
``max_frame_bytes`` before its body is read; a malformed frame (bad lengths, a header
that is not a msgpack map, a missing code or id) closes the connection, and nothing
it carried reaches a processor.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import hmac
import os
import struct
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from actors.protocol.errors import (
    AnswerDroppedError,
    OnePhaseRefusedError,
    PromotionRefusedError,
    TransactionStateError,
    mark_answered,
)
from actors.protocol.fencing import OffsetFencedError
from storage import errors as store_errors
from storage.errors import BrokerUnavailableError, InvalidMessageError, RayMQError
from storage.lite import errors as lite_errors

VERSION = 1
NONCE_BYTES = 16
HANDSHAKE_MAX_BYTES = 1024
HANDSHAKE_TIMEOUT_S = 5.0
DEFAULT_MAX_FRAME_BYTES = 128 << 20
MAX_HEADER_BYTES = 1 << 20
_PREFIX = struct.Struct(">II")
_packers = threading.local()


def _packb(obj: Any) -> bytes:
    """``msgpack.packb(obj)`` with this thread's packer, reused (its buffer too): making a
    packer is most of what packing a frame's small header costs."""
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer()
    return packer.pack(obj)  # type: ignore[no-any-return]


class Code(enum.IntEnum):
    """Request codes, and the two response codes."""

    OK = 0
    ERROR = 1
    HELLO = 2
    AUTH = 3
    SEND = 10
    PULL = 11
    COMMIT_OFFSETS = 12
    SEND_BACK = 13
    HEARTBEAT = 14
    UNREGISTER = 15
    END_TRANSACTION = 16
    POP = 17
    ACK = 18
    CHANGE_INVISIBLE = 19
    END_TRANSACTION_BATCH = 20  # the transaction coordinator's decision on one broker
    END_TRANSACTIONS = 21  # a transactional producer's answers to a check round
    TXN_COMMIT_ONE_PHASE = 22  # a transaction one broker holds whole, committed there alone
    SEND_SHARED = 23  # a send whose records wait in the producer's shared ring (same node)
    TXN_END = 30  # a transactional producer's commit or abort, to the transaction coordinator


class Flag(enum.IntFlag):
    """A frame's flags. ``STREAM`` on a response: one of many answers to its request,
    more to come (the request stays open); its last answer has no ``STREAM``."""

    RESPONSE = 1
    ONEWAY = 2
    STREAM = 4


class FrameError(InvalidMessageError):
    """A frame that breaks the wire's rules: the connection that sent it is closed."""


class AuthError(BrokerUnavailableError):
    """A peer that could not prove it belongs to the cluster."""


def nbytes(parts: Sequence[Any]) -> int:
    """The bytes in ``parts`` (bytes-like): ``len`` for ``bytes``, a view's size for the
    rest (a numpy array's ``len`` counts its items, not its bytes)."""
    size = 0
    for part in parts:
        size += len(part) if type(part) is bytes else memoryview(part).nbytes
    return size


def encode(header: Mapping[str, Any], body: Sequence[Any] = ()) -> list[Any]:
    """The frame as buffers to write back to back (``body``: bytes-like parts). A frame
    under ``SCRATCH_BYTES`` is one ``bytes`` (joined: one buffer for the socket, no view
    per part), a larger one its parts, not joined (as :func:`write_frame` writes them)."""
    head = _packb(header if type(header) is dict else dict(header))
    size = nbytes(body)
    prefix = _PREFIX.pack(4 + len(head) + size, len(head))
    if size < SCRATCH_BYTES:
        return [b"".join((prefix, head, *body))]
    return [prefix, head, *body]


async def read_frame(
    reader: asyncio.StreamReader, max_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> tuple[dict[str, Any], bytes]:
    """One frame: its header and its body. Raises FrameError on a frame that breaks the
    rules (its body unread), ``asyncio.IncompleteReadError`` when the peer closed."""
    prefix = await reader.readexactly(_PREFIX.size)
    total, hlen = _PREFIX.unpack(prefix)
    if total > max_bytes:
        raise FrameError(f"frame of {total} bytes: over max_frame_bytes={max_bytes}")
    if hlen > min(total - 4, MAX_HEADER_BYTES) or total < 4:
        raise FrameError(f"frame of {total} bytes with a header of {hlen}")
    rest = await reader.readexactly(total - 4)
    return decode_header(rest[:hlen]), rest[hlen:]


def decode_header(raw: bytes) -> dict[str, Any]:
    try:
        header = msgpack.unpackb(raw, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - whatever the bytes were, one clear error
        raise FrameError(f"frame header is not msgpack: {exc}") from None
    if not isinstance(header, dict):
        raise FrameError(f"frame header is a {type(header).__name__}, not a map")
    code, opaque = header.get("c"), header.get("o", 0)
    if not isinstance(code, int) or not isinstance(opaque, int) or isinstance(code, bool):
        raise FrameError(f"frame header without an int code and id: {header!r:.200}")
    return header


# ------------------------------------------------------------ proving membership
def nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def proof(secret: bytes, side: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, side + b"|" + first + b"|" + second, hashlib.sha256).digest()


def check_proof(secret: bytes, side: bytes, first: bytes, second: bytes, given: object) -> bool:
    return isinstance(given, bytes) and hmac.compare_digest(
        proof(secret, side, first, second), given
    )


# ------------------------------------------------------------ errors across the wire
_ERRORS: dict[str, type[RayMQError]] = {
    cls.__name__: cls
    for cls in (
        *(v for v in vars(store_errors).values() if isinstance(v, type)),
        *(v for v in vars(lite_errors).values() if isinstance(v, type)),
        OffsetFencedError,
        PromotionRefusedError,
        AnswerDroppedError,
        TransactionStateError,
        OnePhaseRefusedError,
        FrameError,
        AuthError,
    )
    if issubclass(cls, RayMQError)
}


def error_fields(exc: BaseException) -> dict[str, Any]:
    """A response's fields for an error raised by a processor."""
    name = type(exc).__name__ if type(exc).__name__ in _ERRORS else "BrokerUnavailableError"
    return {"c": int(Code.ERROR), "e": name, "m": str(exc) or type(exc).__name__}


def error_from(header: Mapping[str, Any]) -> RayMQError:
    """The error an ERROR response names, as the type the broker raised."""
    cls = _ERRORS.get(str(header.get("e")), BrokerUnavailableError)
    exc = cls(str(header.get("m", "")))
    if cls is not AnswerDroppedError:  # a broker's refusal: nothing was written
        mark_answered(exc)
    return exc


# ------------------------------------------------------------ after the handshake
SCRATCH_BYTES = 256 << 10
"""Frames smaller than this are parsed out of one reused receive buffer, many per
``recv``; a larger one is received straight into a buffer of its own size."""


class FrameReader(asyncio.BufferedProtocol):
    """A connection's frames after its handshake, parsed as the bytes arrive.

    Installed with ``transport.set_protocol`` once a connection has proved itself. Asyncio
    receives into the buffer this hands out (``recv_into``): small frames, several per
    receive, are cut out of one reused scratch buffer; a large frame (a batch, a pull
    answer) gets a buffer of exactly its size and is received into it with no other
    copy. Each complete frame goes to ``on_frame(header, body)`` at once, from the
    event loop's read callback: no task wakes up to read it. A frame that breaks the
    rules calls ``on_error(FrameError)`` and closes the transport, its body unread;
    ``on_lost(exc)`` is called once when the connection ends.

    ``body`` is ``bytes`` for a frame that fit the scratch buffer and a read-only
    ``memoryview`` of the frame's own buffer for a larger one.
    """

    def __init__(
        self,
        transport: asyncio.BaseTransport,
        max_bytes: int,
        on_frame: Any,
        on_error: Any,
        on_lost: Any,
    ) -> None:
        self.transport = transport
        self.max_bytes = max_bytes
        self.on_frame, self.on_error, self.on_lost = on_frame, on_error, on_lost
        self._buf = bytearray(SCRATCH_BYTES)
        self._view = memoryview(self._buf)
        self._start = self._end = 0
        self._big: bytearray | None = None  # a large frame being received, and how far
        self._big_view: memoryview | None = None
        self._big_pos = 0
        self._big_hlen = 0
        self._closed = False
        self._paused_reading = False
        self._paused_writing = False
        self._drained: list[asyncio.Future[None]] = []
        self.on_drained: Any = None  # called when the transport's write buffer empties

    def feed(self, data: bytes) -> None:
        """Bytes that arrived before this reader took over (none, normally)."""
        pos = 0
        while pos < len(data) and not self._closed:
            buf = self.get_buffer(len(data) - pos)
            n = min(len(buf), len(data) - pos)
            buf[:n] = data[pos : pos + n]
            pos += n
            self.buffer_updated(n)

    # ------------------------------------------------------------ asyncio's side
    def get_buffer(self, sizehint: int) -> memoryview:
        if self._big_view is not None:
            return self._big_view[self._big_pos :]
        if self._start and len(self._buf) - self._end < SCRATCH_BYTES // 4:
            # room is short at the end: move what is left of a frame to the front
            left = self._end - self._start
            self._buf[:left] = self._buf[self._start : self._end]
            self._start, self._end = 0, left
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._big is not None:
            self._big_pos += nbytes
            if self._big_pos == len(self._big):
                frame, hlen = self._big, self._big_hlen
                self._big = self._big_view = None
                self._deliver(bytes(frame[:hlen]), memoryview(frame)[hlen:].toreadonly())
            return
        self._end += nbytes
        self._parse()

    def pause(self) -> None:
        """Hand out no more frames (those received already wait) and read no more."""
        if not self._paused_reading:
            self._paused_reading = True
            if not self._closed:
                self.transport.pause_reading()  # type: ignore[attr-defined]

    def resume(self) -> None:
        """Hand out the frames that waited, then read again."""
        if self._paused_reading:
            self._paused_reading = False
            self._parse()
            if not self._closed and not self._paused_reading:
                self.transport.resume_reading()  # type: ignore[attr-defined]

    def _parse(self) -> None:
        buf, view = self._buf, self._view
        while (
            not self._closed
            and not self._paused_reading
            and self._end - self._start >= _PREFIX.size
        ):
            total, hlen = _PREFIX.unpack_from(buf, self._start)
            if total > self.max_bytes:
                return self.fail(
                    FrameError(f"frame of {total} bytes: over max_frame_bytes={self.max_bytes}")
                )
            if total < 4 or hlen > min(total - 4, MAX_HEADER_BYTES):
                return self.fail(FrameError(f"frame of {total} bytes with a header of {hlen}"))
            size = total - 4
            begin = self._start + _PREFIX.size
            have = self._end - begin
            if have >= size:
                self._start = begin + size
                head = bytes(view[begin : begin + hlen])
                self._deliver(head, bytes(view[begin + hlen : begin + size]))
                continue
            if size + _PREFIX.size > len(buf) // 2:  # large: a buffer of its own
                frame = bytearray(size)
                frame[:have] = view[begin : self._end]
                self._big, self._big_view = frame, memoryview(frame)
                self._big_pos, self._big_hlen = have, hlen
                self._start = self._end = 0
                return None
            break
        if self._start == self._end:
            self._start = self._end = 0
        return None

    def _deliver(self, head: bytes, body: bytes | memoryview) -> None:
        try:
            header = decode_header(head)
        except FrameError as exc:
            self.fail(exc)
            return
        self.on_frame(header, body)

    def fail(self, exc: FrameError) -> None:
        """Refuse the connection for ``exc``: ``on_error(exc)``, then close it, unread."""
        self._closed = True
        self.on_error(exc)
        self.transport.close()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        for fut in self._drained:
            if not fut.done():
                fut.set_result(None)
        self._drained.clear()
        self.on_lost(exc)

    # ------------------------------------------------------------ writing
    def pause_writing(self) -> None:
        self._paused_writing = True

    def resume_writing(self) -> None:
        self._paused_writing = False
        waiters, self._drained = self._drained, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        if self.on_drained is not None:
            self.on_drained()

    @property
    def writing_paused(self) -> bool:
        """Whether the transport's write buffer is over its high-water mark."""
        return self._paused_writing

    async def drain(self) -> None:
        """Until the transport's write buffer is below its high-water mark."""
        if not self._paused_writing or self._closed:
            return
        fut = asyncio.get_running_loop().create_future()
        self._drained.append(fut)
        await fut


def write_frame(
    transport: asyncio.WriteTransport, header: Mapping[str, Any], body: Sequence[Any] = ()
) -> None:
    """Write one frame. A small one is joined and written at once; a large body's parts
    are handed to the transport one by one, so they are copied only if the socket
    cannot take them now (asyncio's ``writelines`` joins them all first)."""
    buffers = encode(header, body)
    if len(buffers) == 1:  # joined: the socket takes it whole
        transport.write(buffers[0])
        return
    prefix, head, *parts = buffers
    transport.write(prefix + head)
    for part in parts:
        view = memoryview(part).cast("B")  # numpy arrays too: the transport takes views
        if view.nbytes:
            transport.write(view)
