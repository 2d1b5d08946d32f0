"""Damaged CommitLog bytes set aside, so the good records after them stay readable.

Recovery walks the record chain; where it breaks (a record whose magic, size,
lengths, physical offset or body CRC is wrong) and a valid record follows, the
damaged span is copied to ``<store>/quarantine/<offset>.damaged`` for an
operator and overwritten in place:

* by a *filler*: one valid record of :data:`QUARANTINE_TOPIC` exactly as long as
  the span, so every walker of the chain (recovery, a slave's dispatch,
  replication, a DLedger follower) steps over it unchanged; no queue ever gets an
  entry for it;
* or, when the span runs to the end of its file, by the file's blank marker
  (the file then simply ends early).

Invariant: a filler or blank marker replaces only bytes that failed the checks,
and only when a valid record (or another file's records) follows them; a
damaged tail with nothing valid after it (a crash's torn last write) is cut,
as before.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from pathlib import Path

from . import codec
from ._crc import crc32
from .mapped_file import MappedFile

log = logging.getLogger("raymq.storage.quarantine")

QUARANTINE_TOPIC = "RMQ_SYS_QUARANTINE"
_TOPIC = QUARANTINE_TOPIC.encode("ascii")
MIN_FILLER = codec.FIXED_LEN + len(_TOPIC) + 1
"""The shortest span a filler can take (a one-byte body)."""
_SIZE = struct.Struct(">i")
_TIMESTAMP = struct.Struct(">q")


def filler(phys: int, size: int, store_timestamp: int, store_host: bytes, note: str) -> bytes:
    """A valid record of ``size`` bytes at ``phys`` holding ``note`` (space-padded)."""
    body_len = size - codec.FIXED_LEN - len(_TOPIC)
    if body_len < 1:
        raise ValueError(f"a filler needs {MIN_FILLER} bytes, the span has {size}")
    text = note.encode("utf-8")[:body_len]
    body = text + b" " * (body_len - len(text))
    header = codec.HEADER.pack(
        size,
        codec.MAGIC,
        crc32(body) & 0x7FFFFFFF,
        0,
        0,
        0,
        phys,
        0,
        store_timestamp,
        store_host,
        store_timestamp,
        store_host,
        0,
        0,
        body_len,
    )
    return b"".join((header, body, bytes((len(_TOPIC),)), _TOPIC, b"\x00\x00"))


def set_aside(directory: Path, offset: int, data: bytes) -> Path | None:
    """Copy damaged bytes (trailing zeros dropped) to ``directory``; None if all zeros."""
    kept = data.rstrip(b"\x00")
    if not kept:
        return None
    path = directory / f"{offset:020d}.damaged"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(kept)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:  # a full disk must not keep the store from opening
        log.error("could not keep %d damaged bytes from %d in %s: %s", len(kept), offset, path, exc)
        path.unlink(missing_ok=True)
        return None
    return path


_MAGIC = codec.MAGIC.to_bytes(4, "big")
_BLANK = codec.BLANK_MAGIC.to_bytes(4, "big")
_CHUNK = 1 << 20
_ZEROS = bytes(_CHUNK)


def next_valid(mf: MappedFile, after: int, check_crc: bool, zero_run: int) -> int | None:
    """The first position from ``after`` in ``mf`` where a valid record starts (its
    PHYSICALOFFSET is its own offset, so stale or foreign bytes never pass) or where
    the file's blank marker runs to its end; None if there is none before ``zero_run``
    zero bytes in a row (no record chain crosses such a run) or the file's end."""
    buf, limit, base = mf.buffer, mf.file_size, mf.from_offset
    zeros = 0
    at = max(after, 0)
    while at < limit and zeros < zero_run:
        end = min(at + _CHUNK, limit)
        if buf[at:end] == _ZEROS[: end - at]:
            zeros += end - at
            at = end
            continue
        zeros = 0
        found = sorted(
            _occurrences(buf, _MAGIC, at + 4, min(end + 4, limit))
            + _occurrences(buf, _BLANK, at + 4, min(end + 4, limit))
        )
        for magic_at in found:
            q = magic_at - 4
            if buf[magic_at : magic_at + 4] == _BLANK:
                if _SIZE.unpack_from(buf, q)[0] == limit - q:
                    return q
            elif codec.stored_record_fault(buf, q, base + q, limit, check_crc) is None:
                return q
        at = end
    return None


def _occurrences(buf: mmap.mmap, pattern: bytes, start: int, end: int) -> list[int]:
    out = []
    at = buf.find(pattern, start, end)
    while at >= 0:
        out.append(at)
        at = buf.find(pattern, at + 1, end)
    return out


def replace_span(
    mf: MappedFile, pos: int, valid_at: int, directory: Path, store_host: bytes
) -> Path | None:
    """Set ``[pos, valid_at)`` of ``mf`` aside and write a filler over it; ``valid_at``
    is a valid record and the span at least :data:`MIN_FILLER` long. Returns the copy."""
    offset = mf.from_offset + pos
    saved = set_aside(directory, offset, mf.read(pos, valid_at - pos))
    (store_ts,) = _TIMESTAMP.unpack_from(mf.buffer, valid_at + codec.OFF_STORETIMESTAMP)
    where = f"quarantine/{saved.name}" if saved is not None else "nowhere (it was zeros)"
    note = f"damaged commitlog bytes [{offset}, {mf.from_offset + valid_at}) set aside: {where}"
    mf.write_at(pos, filler(offset, valid_at - pos, store_ts, store_host, note))
    _sync(mf, pos, valid_at)
    return saved


def seal_at(mf: MappedFile, pos: int, directory: Path, zero_run: int) -> Path | None:
    """Set the rest of ``mf`` from ``pos`` aside (up to a run of ``zero_run`` zeros) and
    end the file there: the blank marker at ``pos``, zeros after it. Returns the copy."""
    limit = mf.file_size
    parts, zeros, at = [], 0, pos
    while at < limit and zeros < zero_run:
        end = min(at + _CHUNK, limit)
        part = mf.read(at, end - at)
        zeros = zeros + len(part) if part == _ZEROS[: len(part)] else 0
        parts.append(part)
        at = end
    saved = set_aside(directory, mf.from_offset + pos, b"".join(parts))
    if pos + 8 <= limit:
        mf.write_at(pos, _SIZE.pack(limit - pos) + _BLANK)
        _sync(mf, pos, pos + 8)
    mf.zero_from(min(pos + 8, limit), zero_run)
    return saved


def _sync(mf: MappedFile, start: int, end: int) -> None:
    first = start - start % mmap.PAGESIZE
    mf.sync(first, end - first)
