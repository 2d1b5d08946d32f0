"""Message ids: where a message's bytes are, and what its producer named it.

* The offset message id (RocketMQ's ``MessageDecoder.createMessageId``): store
  ip (4 bytes) + port (4) + CommitLog offset (8) as 32 upper-case hex chars.
* The unique key (``UNIQ_KEY``, RocketMQ's ``MessageClientIDSetter``): ip, pid
  and a random salt as 20 hex chars, then a 48-bit counter as 12.

Hosts are ``"a.b.c.d:port"`` and travel as 4 bytes of IPv4 + 4 bytes of port,
RocketMQ's layout of BORNHOST and STOREHOST.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import threading
import time

from .errors import InvalidMessageError


def host_to_bytes(host: str) -> bytes:
    """``"a.b.c.d:port"`` -> 4 bytes of IPv4 + 4 bytes of port (RocketMQ's layout)."""
    ip, _, port = host.rpartition(":")
    try:
        return socket.inet_aton(ip) + int(port).to_bytes(4, "big")
    except (OSError, ValueError) as exc:
        raise InvalidMessageError(f"host={host!r}: must be 'a.b.c.d:port'") from exc


def bytes_to_host(raw: bytes) -> str:
    return f"{socket.inet_ntoa(raw[:4])}:{int.from_bytes(raw[4:8], 'big')}"


def make_offset_msg_id(store_host: str, commitlog_offset: int) -> str:
    """Store ip (4) + port (4) + commitlog offset (8) as 32 upper-case hex chars."""
    return (host_to_bytes(store_host) + commitlog_offset.to_bytes(8, "big")).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """Inverse of :func:`make_offset_msg_id`; raises ``InvalidMessageError``."""
    if len(msg_id) != 32:
        raise InvalidMessageError(f"msg_id={msg_id!r}: must be 32 hex chars")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise InvalidMessageError(f"msg_id={msg_id!r}: not hex") from exc
    return bytes_to_host(raw[:8]), int.from_bytes(raw[8:], "big")


class UniqueKeyGenerator:
    """Client-side message ids, 32 hex chars: ip, pid and a random salt, then a counter."""

    def __init__(self, ip: str = "127.0.0.1") -> None:
        try:
            ip_bytes = socket.inet_aton(ip)
        except OSError:
            ip_bytes = b"\x7f\x00\x00\x01"
        salt = ip_bytes + (os.getpid() & 0xFFFF).to_bytes(2, "big") + random.randbytes(4)
        self.prefix = salt.hex().upper()
        start = (int(time.time() * 1000) & 0xFFFFFF) << 24
        self._counter = itertools.count(start)
        self._lock = threading.Lock()

    def next(self) -> str:
        return f"{self.prefix}{next(self._counter) & 0xFFFFFFFFFFFF:012X}"

    def take(self, n: int) -> int:
        """Reserve ``n`` consecutive counter values; return the first (48-bit wrap)."""
        with self._lock:
            first = next(self._counter)
            if n > 1:
                self._counter = itertools.count(first + n)
        return first


default_generator = UniqueKeyGenerator()
"""The process's generator, for encoders not handed one."""


def new_unique_key() -> str:
    return default_generator.next()
