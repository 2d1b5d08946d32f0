"""The data path's wire: frames between a client and a broker's own socket.

RocketMQ's ``RemotingCommand`` in one module (a length, a header, an opaque body),
with Kafka's habit of a version in every request. Ray stays the control plane;
what flows per message (sends, pulls, offset commits, send-back, heartbeats) goes
over a TCP connection the client keeps to each broker, many requests in flight at
once and answered out of order by request id.

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
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from actors.protocol.errors import PromotionRefusedError
from actors.protocol.fencing import OffsetFencedError
from storage import errors as store_errors
from storage.errors import BrokerUnavailableError, InvalidMessageError, RayMQError

VERSION = 1
NONCE_BYTES = 16
HANDSHAKE_MAX_BYTES = 1024
HANDSHAKE_TIMEOUT_S = 5.0
DEFAULT_MAX_FRAME_BYTES = 128 << 20
MAX_HEADER_BYTES = 1 << 20
_PREFIX = struct.Struct(">II")


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


class Flag(enum.IntFlag):
    RESPONSE = 1
    ONEWAY = 2


class FrameError(InvalidMessageError):
    """A frame that breaks the wire's rules: the connection that sent it is closed."""


class AuthError(BrokerUnavailableError):
    """A peer that could not prove it belongs to the cluster."""


def encode(header: Mapping[str, Any], body: Sequence[Any] = ()) -> list[Any]:
    """The frame as buffers to write back to back (``body``: bytes-like parts, not joined)."""
    head = msgpack.packb(dict(header))
    size = sum(memoryview(p).nbytes for p in body)
    return [_PREFIX.pack(4 + len(head) + size, len(head)), head, *body]


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
        OffsetFencedError,
        PromotionRefusedError,
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
    return cls(str(header.get("m", "")))
