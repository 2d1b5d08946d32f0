"""RocketMQ's V1 CommitLog record layout, byte for byte, and nothing else.

Record (big-endian, IPv4 hosts, 91 fixed bytes)::

    TOTALSIZE i4 | MAGIC i4 (0xdaa320a7) | BODYCRC i4 | QUEUEID i4 | FLAG i4 |
    QUEUEOFFSET i8 | PHYSICALOFFSET i8 | SYSFLAG i4 | BORNTIMESTAMP i8 |
    BORNHOST ip4+port4 | STORETIMESTAMP i8 | STOREHOST ip4+port4 |
    RECONSUMETIMES i4 | PREPAREDTXOFFSET i8 | BODYLEN i4 + body |
    TOPICLEN i1 + topic | PROPLEN i2 + properties

Properties are ``name\\x01value\\x02`` pairs. A mapped file's unused tail starts
with ``[length i4][0xcbd43194]``. BODYCRC is ``crc32(body) & 0x7fffffff``, as
RocketMQ's ``UtilAll.crc32`` stores it.

Invariant: :func:`decode_record` either returns a record whose sizes add up,
whose magic is right and whose body matches its CRC, or raises
:class:`StoreCorruptedError`; no other exception escapes it.

The batch wire form built on it is ``storage.batch``; ``storage.codec`` gathers both
(and the hashing and sequence slots) under the names callers have always used.
"""

from __future__ import annotations

import mmap
import re
import socket
import struct
from typing import Any

import numpy as np

from ._crc import crc32, crc32_address
from .errors import InvalidMessageError, StoreCorruptedError
from .message import MessageExt, record_starts_of
from .message_id import (
    bytes_to_host,
)
from .properties import (
    decode_properties,
)

# the hot loops in C, built by setup.py where a compiler is (storage/_native.c); import
# graphs that read only .py files see this as an import of the package itself
try:
    from . import _native
except ImportError:  # pragma: no cover - installed without a compiler: numpy does it all
    _native = None  # type: ignore[assignment]

MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
FIXED_LEN = 91
END_FILE_MIN_BLANK = 8
HEADER = struct.Struct(">iIiiiqqiq8sq8siqi")  # everything up to and including BODYLEN
assert HEADER.size == 88

# byte offsets of the fields the store patches
OFF_TOTALSIZE = 0
OFF_MAGIC = 4
OFF_QUEUEID = 12
OFF_QUEUEOFFSET = 20
OFF_PHYSICALOFFSET = 28
OFF_BORNTIMESTAMP = 40
OFF_STORETIMESTAMP = 56
OFF_STOREHOST = 64
OFF_BODYLEN = 84

MAX_TOPIC_LEN = 127
TOPIC_RE = re.compile(r"[A-Za-z0-9_%|-]{1,127}")

# Batches of at most this many records take the store's scalar paths (struct and
# lists): below it numpy's fixed cost per call (1-3 us) outweighs the per-record
# Python work, above it the vectorised paths win. Both write the same bytes.
SMALL_BATCH = 16
_I32 = struct.Struct(">i")
_SIZE_MAGIC = struct.Struct(">iI")


# ---------------------------------------------------------------- validation


def validate_topic(topic: object) -> str:
    if not isinstance(topic, str) or not TOPIC_RE.fullmatch(topic):
        raise InvalidMessageError(
            f"topic={topic!r}: must match [A-Za-z0-9_%|-]{{1,{MAX_TOPIC_LEN}}}"
        )
    return topic


def validate_queue_id(queue_id: object) -> int:
    if not isinstance(queue_id, int) or isinstance(queue_id, bool) or queue_id < 0:
        raise InvalidMessageError(f"queue_id={queue_id!r}: must be an int >= 0")
    if queue_id > 0x7FFFFFFF:
        raise InvalidMessageError(f"queue_id={queue_id}: must fit in int32")
    return queue_id


def windows(
    buf: bytes | memoryview | bytearray | mmap.mmap, dtype: np.typing.DTypeLike
) -> np.ndarray:
    """Every ``dtype``-wide window of ``buf`` as one array (a view): element ``i``
    is the bytes at ``i .. i + itemsize``.

    Indexing it with record positions gathers (or scatters) one field of many
    records, one element per record; a byte index array would move the field a
    byte at a time, each byte with its own 8-byte index (4-5x slower). Windows
    overlap, so a scatter must not write two overlapping positions.
    """
    dt = np.dtype(dtype)
    size = memoryview(buf).nbytes
    return np.ndarray(
        (max(size - dt.itemsize + 1, 0),),
        dtype=dt,
        buffer=buf,
        strides=(1,),  # type: ignore[arg-type]
    )


SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
CLIENT_SYSFLAGS = SYSFLAG_COMPRESSED | SYSFLAG_MULTI_TAGS
"""The SYSFLAG bits a producer may set. The others are the broker's: the transaction
state (RayMQ has no transactional messages) and the IPv6 host flags (records here
hold IPv4 hosts; :func:`decode_record` refuses the flags)."""

# ---------------------------------------------------------------- decoding


def record_size_at(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(total size, magic) of the record or blank marker at ``pos``."""
    if pos + 8 > len(buf):
        raise StoreCorruptedError(f"record header at {pos} runs past the end ({len(buf)})")
    size, magic = struct.unpack_from(">iI", buf, pos)
    return size, magic


def decode_record(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, check_crc: bool = True
) -> tuple[MessageExt, int]:
    """Decode the record at ``pos``; return it and the position after it."""
    n = len(buf)
    if pos < 0 or pos + HEADER.size > n:
        raise StoreCorruptedError(f"record at {pos}: fewer than {HEADER.size} bytes left")
    try:
        (
            size,
            magic,
            body_crc,
            queue_id,
            flag,
            queue_offset,
            phys,
            sys_flag,
            born_ts,
            born_host,
            store_ts,
            store_host,
            reconsume,
            prepared,
            body_len,
        ) = HEADER.unpack_from(buf, pos)
    except struct.error as exc:  # pragma: no cover - guarded by the length check
        raise StoreCorruptedError(str(exc)) from exc
    if magic != MAGIC:
        raise StoreCorruptedError(f"record at {pos}: bad magic {magic:#x}")
    end = pos + size
    if size < FIXED_LEN or end > n:
        raise StoreCorruptedError(f"record at {pos}: size {size} out of bounds ({n - pos} left)")
    if body_len < 0 or pos + HEADER.size + body_len + 3 > end:
        raise StoreCorruptedError(f"record at {pos}: body length {body_len} out of bounds")
    if sys_flag & 0x30:
        raise StoreCorruptedError(f"record at {pos}: IPv6 host flags are not supported")
    p = pos + HEADER.size
    body = bytes(buf[p : p + body_len])
    p += body_len
    topic_len = buf[p]
    p += 1
    if topic_len > MAX_TOPIC_LEN or p + topic_len + 2 > end:
        raise StoreCorruptedError(f"record at {pos}: topic length {topic_len} out of bounds")
    try:
        topic = bytes(buf[p : p + topic_len]).decode("ascii")
    except UnicodeDecodeError as exc:
        raise StoreCorruptedError(f"record at {pos}: topic is not ASCII") from exc
    p += topic_len
    prop_len = (buf[p] << 8) | buf[p + 1]
    p += 2
    if p + prop_len != end:
        raise StoreCorruptedError(
            f"record at {pos}: sizes do not add up (total {size}, properties {prop_len})"
        )
    if check_crc and (crc32(body) & 0x7FFFFFFF) != body_crc:
        raise StoreCorruptedError(f"record at {pos}: body CRC mismatch")
    raw_props = bytes(buf[p:end])
    props = decode_properties(raw_props)
    message = MessageExt(
        topic,
        body,
        queue_id,
        queue_offset,
        phys,
        size,
        born_ts,
        store_ts,
        bytes_to_host(born_host),
        bytes_to_host(store_host),
        flag,
        sys_flag,
        body_crc,
        reconsume,
        prepared,
        raw_props,
    )
    message.__dict__["_props"] = props
    return message, end


def stored_record_fault(
    buf: bytes | memoryview | mmap.mmap, pos: int, phys: int, limit: int, check_crc: bool
) -> str | None:
    """Why the bytes at ``pos`` (of ``limit``) are not a valid record stored at CommitLog
    offset ``phys``, or None when they are: TOTALSIZE, MAGIC, PHYSICALOFFSET, lengths
    that add up, and (with ``check_crc``) BODYCRC. What recovery checks of a record."""
    if pos < 0 or pos + HEADER.size > limit:
        return f"a header at {pos} runs past the end ({limit})"
    size, magic, body_crc, *_, body_len = HEADER.unpack_from(buf, pos)
    if magic != MAGIC:
        return f"MAGIC={magic:#x}"
    if size < FIXED_LEN or pos + size > limit:
        return f"TOTALSIZE={size} ({limit - pos} bytes left)"
    (physical,) = struct.unpack_from(">q", buf, pos + OFF_PHYSICALOFFSET)
    if physical != phys:
        return f"PHYSICALOFFSET={physical}, the record is at {phys}"
    if body_len < 0 or body_len > size - FIXED_LEN:
        return f"BODYLEN={body_len} (TOTALSIZE={size})"
    at = pos + HEADER.size + body_len
    topic_len = buf[at]
    if topic_len > size - FIXED_LEN - body_len:
        return f"TOPICLEN={topic_len} (TOTALSIZE={size}, BODYLEN={body_len})"
    prop_len = (buf[at + 1 + topic_len] << 8) | buf[at + 2 + topic_len]
    if FIXED_LEN + body_len + topic_len + prop_len != size:
        return f"PROPERTIESLEN={prop_len}: the lengths do not add up to TOTALSIZE={size}"
    if check_crc and crc32(buf[pos + HEADER.size : at]) & 0x7FFFFFFF != body_crc:
        return f"BODYCRC={body_crc} does not match the body"
    return None


_HDR = np.dtype(
    [
        ("size", ">i4"),
        ("magic", ">u4"),
        ("crc", ">i4"),
        ("qid", ">i4"),
        ("flag", ">i4"),
        ("qoff", ">i8"),
        ("phys", ">i8"),
        ("sysflag", ">i4"),
        ("born_ts", ">i8"),
        ("born_ip", ">u4"),
        ("born_port", ">i4"),
        ("store_ts", ">i8"),
        ("store_ip", ">u4"),
        ("store_port", ">i4"),
        ("reconsume", ">i4"),
        ("prepared", ">i8"),
        ("body_len", ">i4"),
    ]
)
assert _HDR.itemsize == HEADER.size
_host_cache: dict[tuple[int, int], str] = {}


def _host(ip: int, port: int) -> str:
    host = _host_cache.get((ip, port))
    if host is None:
        if len(_host_cache) > 4096:
            _host_cache.clear()
        host = _host_cache[(ip, port)] = f"{socket.inet_ntoa(ip.to_bytes(4, 'big'))}:{port}"
    return host


def record_starts(data: bytes | memoryview) -> np.ndarray:
    """Start positions of records stored back to back (walks the size chain)."""
    unpack = _I32.unpack_from
    n = len(data)
    starts = []
    pos = 0
    while pos < n:
        if pos + 4 > n:
            raise StoreCorruptedError(f"record header at {pos} runs past the end ({n})")
        starts.append(pos)
        size = unpack(data, pos)[0]
        if size < FIXED_LEN:
            raise StoreCorruptedError(f"record at {pos}: size {size} below {FIXED_LEN}")
        pos += size
    if pos != n:
        raise StoreCorruptedError(f"last record runs past the end ({pos} > {n})")
    return np.array(starts, dtype=np.int64)


def body_slices(data: bytes, starts: np.ndarray) -> list[bytes]:
    """The bodies of records stored back to back at ``starts``, without decoding the rest."""
    n = len(starts)
    if n == 0:
        return []
    if int(starts[-1]) + HEADER.size > len(data):
        raise StoreCorruptedError("last record is shorter than a header")
    if _native is not None:
        bodies = _native.body_slices(data, np.ascontiguousarray(starts, dtype=np.int64))
        if bodies is not None:
            return bodies
        # the numpy checks below name what is wrong
    words = windows(data, ">i4")
    if not bool((words[starts + OFF_MAGIC].view(">u4") == MAGIC).all()):
        raise StoreCorruptedError("a record's magic is wrong")
    body_len = words[starts + OFF_BODYLEN].astype(np.int64)
    sizes = words[starts].astype(np.int64)
    if bool((body_len < 0).any()) or bool((HEADER.size + body_len > sizes).any()):
        raise StoreCorruptedError("a record's body length is out of bounds")
    first = (starts + HEADER.size).tolist()
    last = (starts + HEADER.size + body_len).tolist()
    return [data[a:b] for a, b in zip(first, last)]


_SCALAR_DECODE_MAX = 16
"""Up to this many records, :func:`decode_records` decodes each on its own (10 us a
record here) rather than through numpy (about 150 us whatever the count, then cheaper
per record)."""


def decode_records(
    data: bytes | memoryview,
    *,
    check_crc: bool = True,
    starts: np.ndarray | None = None,
    sizes: Any = None,
) -> list[MessageExt]:
    """Decode records stored back to back (a pull's answer): in C where the module is
    built, else with the headers vectorised (a few records one at a time). Each
    record is checked as :func:`decode_record` checks it; the first that fails raises
    ``StoreCorruptedError`` naming it. Properties are parsed on first access of a
    message's properties (by :func:`decode_record` at once). ``starts`` (where each
    record starts) or ``sizes`` (each record's size, as a pull's answer carries them)
    spare the Python paths a walk; the C pass checks its count against them."""
    if starts is None and sizes is not None:
        n_known: int | None = len(sizes)
    else:
        n_known = None if starts is None else len(starts)
    # one pass in C (~1 us a record, where the Python paths below cost 5-10 us for one
    # record and ~150 us of numpy for many); None: a record breaks a rule, which the
    # paths below name. A module built before it had the function goes without it (an
    # editable install keeps its built module until it is built again).
    decode = getattr(_native, "decode_records", None) if _native is not None else None
    if decode is not None:
        try:
            out = decode(data, MessageExt, check_crc, crc32_address)
        except (BufferError, TypeError, ValueError):  # a buffer it cannot read in place
            out = None
        if out is not None and (n_known is None or n_known == len(out)):
            return out  # type: ignore[no-any-return]
    if starts is None:
        starts = record_starts_of(sizes)
    data = bytes(data)
    n_bytes = len(data)
    if n_bytes == 0:
        return []
    if starts is None:
        starts = record_starts(data)
    n = len(starts)
    if n <= _SCALAR_DECODE_MAX:  # a few records: one at a time is ~15x cheaper than arrays
        out, end = [], 0
        for s in starts.tolist():
            msg, end = decode_record(data, int(s), check_crc=check_crc)
            out.append(msg)
        if end != n_bytes:  # starts given by the caller that leave bytes over
            raise StoreCorruptedError(f"records end at {end} of {n_bytes} bytes")
        return out
    if int(starts[-1]) + HEADER.size > n_bytes:
        raise StoreCorruptedError("last record is shorter than a header")
    hdr = windows(data, _HDR)[starts]
    sizes = hdr["size"].astype(np.int64)
    ends = starts + sizes
    body_len = hdr["body_len"].astype(np.int64)
    topic_at = starts + HEADER.size + body_len
    bad = (
        (hdr["magic"] != MAGIC)
        | (sizes < FIXED_LEN)
        | (ends > n_bytes)
        | (body_len < 0)
        | (topic_at + 3 > ends)
        | ((hdr["sysflag"] & 0x30) != 0)
    )
    if n > 1:
        bad[:-1] |= ends[:-1] != starts[1:]
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return [decode_record(data, int(s), check_crc=check_crc)[0] for s in starts[: i + 1]]
    if int(ends[-1]) != n_bytes:  # starts given by the caller that leave bytes over
        raise StoreCorruptedError(f"records end at {int(ends[-1])} of {n_bytes} bytes")
    buf = np.frombuffer(data, dtype=np.uint8)
    topic_len = buf[topic_at].astype(np.int64)
    prop_at = topic_at + 1 + topic_len
    bad = (topic_len > MAX_TOPIC_LEN) | (prop_at + 2 > ends)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        decode_record(data, int(starts[i]), check_crc=check_crc)
    prop_len = windows(data, ">u2")[prop_at].astype(np.int64)
    if not np.array_equal(prop_at + 2 + prop_len, ends):
        i = int(np.flatnonzero(prop_at + 2 + prop_len != ends)[0])
        decode_record(data, int(starts[i]), check_crc=check_crc)
    body_at = (starts + HEADER.size).tolist()
    body_end = topic_at.tolist()
    bodies = [data[a:b] for a, b in zip(body_at, body_end)]
    if check_crc:
        for a, body, crc in zip(body_at, bodies, hdr["crc"].tolist()):
            if (crc32(body) & 0x7FFFFFFF) != crc:
                raise StoreCorruptedError(f"record at {a - HEADER.size}: body CRC mismatch")
    topics = _topics(data, (topic_at + 1).tolist(), prop_at.tolist())
    props = [data[a:b] for a, b in zip((prop_at + 2).tolist(), ends.tolist())]
    born = _hosts(hdr["born_ip"], hdr["born_port"])
    stored = _hosts(hdr["store_ip"], hdr["store_port"])
    new = tuple.__new__
    return [
        new(MessageExt, row)
        for row in zip(
            topics,
            bodies,
            hdr["qid"].tolist(),
            hdr["qoff"].tolist(),
            hdr["phys"].tolist(),
            sizes.tolist(),
            hdr["born_ts"].tolist(),
            hdr["store_ts"].tolist(),
            born,
            stored,
            hdr["flag"].tolist(),
            hdr["sysflag"].tolist(),
            hdr["crc"].tolist(),
            hdr["reconsume"].tolist(),
            hdr["prepared"].tolist(),
            props,
        )
    ]


def _topics(data: bytes, starts: list[int], ends: list[int]) -> list[str]:
    """Topic names of a pull: usually one name, decoded once."""
    names: dict[bytes, str] = {}
    out = []
    for a, b in zip(starts, ends):
        raw = data[a:b]
        name = names.get(raw)
        if name is None:
            try:
                name = names[raw] = raw.decode("ascii")
            except UnicodeDecodeError as exc:
                raise StoreCorruptedError(f"record topic {raw[:20]!r} is not ASCII") from exc
        out.append(name)
    return out


def _hosts(ips: np.ndarray, ports: np.ndarray) -> list[str]:
    """``ip:port`` per record, formatted once per distinct host."""
    if len(ips) and bool((ips == ips[0]).all()) and bool((ports == ports[0]).all()):
        return [_host(int(ips[0]), int(ports[0]))] * len(ips)
    return [_host(ip, port) for ip, port in zip(ips.tolist(), ports.tolist())]
