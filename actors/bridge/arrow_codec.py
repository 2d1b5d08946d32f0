"""CommitLog records straight to Arrow columns and back, vectorised: no object per message.

A read task of the topic datasource turns each pull's blob into a
``TOPIC_SCHEMA`` table with numpy and pyarrow kernels (``records_to_arrow``), and
a write task turns Arrow columns into the store's record layout
(``encode_arrow``), so neither direction builds a ``MessageExt`` or a
``Message`` per row. The layout is ``storage.codec``'s (RocketMQ's V1 record);
this module reads and writes the same bytes and applies the same rules, and is
tested against it (tests/actors/bridge/test_datasource_codec.py).

Invariants: ``records_to_arrow`` returns one row per record in blob order or
raises ``StoreCorruptedError``; ``encode_arrow`` returns a batch the store
accepts as ``encode_batch`` would have made it, or raises
``InvalidMessageError`` naming the row and the field, before anything is sent.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage._crc import crc32
from storage.codec import (
    HEADER,
    MAGIC,
    MAX_PROPERTIES_LEN,
    OFF_BODYLEN,
    OFF_PHYSICALOFFSET,
    OFF_STOREHOST,
    EncodedBatch,
    PackedKeys,
    host_to_bytes,
    java_hashes,
    prefixed_java_hashes,
    record_starts,
    validate_topic,
    windows,
)
from storage.errors import InvalidMessageError, StoreCorruptedError
from storage.properties import PROP_TRAN_MSG, SYSTEM_PROPS

TOPIC_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("broker_name", pa.string()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("msg_id", pa.string()),
        ("keys", pa.string()),
        ("tags", pa.string()),
        ("born_timestamp", pa.int64()),
        ("store_timestamp", pa.int64()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("body", pa.binary()),
    ]
)
"""One row per message of a topic, as the Spark bridge carries it (keys space-separated).

``broker_name`` is there because a queue is (topic, broker name, queue id), as in
RocketMQ: on a topic spread over brokers, queue ids and offsets repeat."""

# The record header up to BODYLEN, as numpy reads it (storage.codec.HEADER's layout).
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
        ("born_host", "V8"),
        ("store_ts", ">i8"),
        ("store_host", "V8"),
        ("reconsume", ">i4"),
        ("prepared", ">i8"),
        ("body_len", ">i4"),
    ]
)
assert _HDR.itemsize == HEADER.size
_HDR_LEN = HEADER.size
_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_SEGMENTS = np.arange(5, dtype=np.uint8)  # header, body, topic, property length, properties


# ---------------------------------------------------------------- small array helpers


def _hex(raw: np.ndarray) -> np.ndarray:
    """``(n, k)`` bytes -> ``(n, 2k)`` upper-case hex digits (uint8)."""
    out = np.empty((raw.shape[0], raw.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = _HEX[raw >> 4]
    out[:, 1::2] = _HEX[raw & 15]
    return out


def _fixed_width_strings(chars: np.ndarray) -> pa.StringArray:
    """``(n, w)`` ASCII bytes -> a string array of n values of width w."""
    n, width = chars.shape
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.StringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(chars))
    )


def _fixed_width_binary(chars: np.ndarray) -> pa.BinaryArray:
    """``(n, w)`` bytes -> a binary array of n values of width w."""
    n, width = chars.shape
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.BinaryArray.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(chars))]
    )


def _varlen(kind: pa.DataType, lengths: np.ndarray, data: np.ndarray) -> pa.Array:
    """A string or binary array from value lengths and the values' bytes back to back."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise InvalidMessageError(f"{offsets[-1]} bytes in one Arrow array: over 2 GiB")
    buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    return pa.Array.from_buffers(kind, len(lengths), buffers)


def _int_at(buf: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The big-endian ints at positions ``at`` (as int64): signed 4-byte, unsigned 2-byte."""
    return windows(buf.data, {4: ">i4", 2: ">u2"}[width])[at].astype(np.int64)


def _segment_labels(lengths: np.ndarray) -> np.ndarray:
    """For records cut into segments (``lengths`` is ``(n, 5)``), each byte's segment."""
    return np.repeat(np.tile(_SEGMENTS, lengths.shape[0]), lengths.ravel())


def _take_or_null(values: pa.Array, index: np.ndarray) -> pa.Array:
    """``values[index]`` with a null where ``index`` is -1."""
    return values.take(pa.array(index, mask=index < 0))


# ---------------------------------------------------------------- records -> Arrow


def records_to_arrow(
    data: bytes | memoryview,
    *,
    topic: str | None = None,
    broker_name: str | None = None,
    check_crc: bool = False,
) -> pa.Table:
    """Records stored back to back (a pull's blob) as a ``TOPIC_SCHEMA`` table.

    ``topic`` names the records' topic when the caller knows it (a pull of one
    queue); otherwise it is read from the records, which must share one topic.
    ``broker_name`` (null when not given) is the broker the records came from.
    ``msg_id`` is the producer's ``UNIQ_KEY``, else the offset message id, as
    ``MessageExt.msg_id``.
    """
    if len(data) == 0:
        return TOPIC_SCHEMA.empty_table()
    starts = record_starts(data)
    n = len(starts)
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.append(starts[1:], len(buf))
    if int(np.min(ends - starts)) < _HDR_LEN + 3:
        raise StoreCorruptedError("a pulled record is shorter than a header")
    body_len = _int_at(buf, starts + OFF_BODYLEN, 4)
    topic_at = starts + _HDR_LEN + body_len
    bad = (body_len < 0) | (topic_at + 3 > ends)
    if bad.any():
        at = int(starts[np.flatnonzero(bad)[0]])
        raise StoreCorruptedError(f"record at {at}: body length out of bounds")
    topic_len = buf[topic_at].astype(np.int64)
    prop_at = topic_at + 1 + topic_len
    ok = prop_at + 2 <= ends
    prop_len = np.zeros(n, dtype=np.int64)
    prop_len[ok] = _int_at(buf, prop_at[ok], 2)
    mismatch = ~ok | (prop_at + 2 + prop_len != ends)
    if mismatch.any():
        at = int(starts[np.flatnonzero(mismatch)[0]])
        raise StoreCorruptedError(f"record at {at}: sizes do not add up")
    lengths = np.stack(
        [np.full(n, _HDR_LEN), body_len, topic_len + 1, np.full(n, 2), prop_len], axis=1
    )
    labels = _segment_labels(lengths)
    hdr = buf[labels == 0].view(_HDR)
    if np.any(hdr["magic"] != MAGIC):
        at = int(starts[np.flatnonzero(hdr["magic"] != MAGIC)[0]])
        raise StoreCorruptedError(f"record at {at}: bad magic")
    body = _varlen(pa.binary(), body_len, buf[labels == 1])
    if check_crc:
        _check_crcs(body, hdr["crc"], starts)
    topic_bytes = buf[labels == 2]
    if topic is None:
        first = bytes(topic_bytes[1 : 1 + topic_len[0]])
        topic = first.decode("ascii", "replace")
    expected = bytes([len(topic)]) + topic.encode("ascii", "replace")
    if len(topic_bytes) != n * len(expected) or topic_bytes.tobytes() != expected * n:
        raise StoreCorruptedError(f"records of a pull do not all belong to topic {topic!r}")
    props, tags, keys, uniq = _properties(buf[labels == 4], prop_len)
    msg_id = pc.coalesce(uniq, _offset_msg_ids(hdr))
    columns = [
        _fixed_width_strings(np.frombuffer(expected[1:] * n, dtype=np.uint8).reshape(n, -1)),
        _constant(broker_name, n),
        pa.array(hdr["qid"].astype(np.int32)),
        pa.array(hdr["qoff"].astype(np.int64)),
        msg_id,
        keys,
        tags,
        pa.array(hdr["born_ts"].astype(np.int64)),
        pa.array(hdr["store_ts"].astype(np.int64)),
        props,
        body,
    ]
    return pa.Table.from_arrays(columns, schema=TOPIC_SCHEMA)


def _constant(text: str | None, n: int) -> pa.Array:
    if text is None:
        return pa.nulls(n, pa.string())
    if not text:
        return pa.array([""] * n, pa.string())
    raw = text.encode("utf-8")
    return _fixed_width_strings(np.frombuffer(raw * n, dtype=np.uint8).reshape(n, len(raw)))


def _check_crcs(body: pa.BinaryArray, crcs: np.ndarray, starts: np.ndarray) -> None:
    offsets = np.frombuffer(body.buffers()[1], dtype=np.int32)[: len(body) + 1]
    view = memoryview(body.buffers()[2] or b"")
    for i, (a, b, want) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist(), crcs)):
        if crc32(view[a:b]) & 0x7FFFFFFF != want:
            raise StoreCorruptedError(f"record at {int(starts[i])}: body CRC mismatch")


def _offset_msg_ids(hdr: np.ndarray) -> pa.StringArray:
    """Store host (ip4 + port4) + commitlog offset (8), 32 hex chars per record."""
    raw = np.empty((len(hdr), 16), dtype=np.uint8)
    rows = hdr.view(np.uint8).reshape(len(hdr), _HDR_LEN)
    raw[:, :8] = rows[:, OFF_STOREHOST : OFF_STOREHOST + 8]
    raw[:, 8:] = rows[:, OFF_PHYSICALOFFSET : OFF_PHYSICALOFFSET + 8]
    return _fixed_width_strings(_hex(raw))


def _properties(
    pbuf: np.ndarray, prop_len: np.ndarray
) -> tuple[pa.MapArray, pa.Array, pa.Array, pa.Array]:
    """``name\\x01value\\x02`` pairs of every record -> the map column and the
    TAGS, KEYS and UNIQ_KEY values (null where a record has none)."""
    n = len(prop_len)
    is_sep = (pbuf == 1) | (pbuf == 2)
    sep_at = np.flatnonzero(is_sep)
    seps = pbuf[sep_at]
    ends = np.cumsum(prop_len)
    if (
        len(seps) % 2
        or not (np.all(seps[0::2] == 1) and np.all(seps[1::2] == 2))
        or np.any(pbuf[ends[prop_len > 0] - 1] != 2)
    ):
        raise StoreCorruptedError("properties are not name\\x01value\\x02 pairs")
    value_end = sep_at[1::2]
    name_end = sep_at[0::2]
    name_start = np.concatenate([[0], value_end[:-1] + 1]).astype(np.int64)
    # A text byte after an even number of separators is a name's, after an odd one a value's.
    odd = np.bitwise_xor.accumulate(is_sep.view(np.uint8)).view(bool)
    text = ~is_sep
    names = _varlen(pa.string(), name_end - name_start, pbuf[text & ~odd])
    values = _varlen(pa.string(), value_end - name_end - 1, pbuf[text & odd])
    pair_offsets = np.zeros(n + 1, dtype=np.int32)
    pair_offsets[1:] = np.searchsorted(value_end, ends, side="left")
    props = pa.MapArray.from_arrays(pa.array(pair_offsets), names, values)
    owner = np.repeat(np.arange(n), np.diff(pair_offsets))
    picked = []
    for name in ("TAGS", "KEYS", "UNIQ_KEY"):
        hit = np.flatnonzero(pc.equal(names, name).to_numpy(zero_copy_only=False))
        index = np.full(n, -1, dtype=np.int64)
        index[owner[hit]] = hit
        picked.append(_take_or_null(values, index))
    return props, picked[0], picked[1], picked[2]


# ---------------------------------------------------------------- Arrow -> records


class _UniqueKeys:
    """Producer-side message ids in blocks: ``storage.codec.UniqueKeyGenerator``'s
    format (ip, pid and a random salt, then a 48-bit counter), 32 hex chars."""

    def __init__(self, ip: str = "127.0.0.1") -> None:
        try:
            ip_bytes = socket.inet_aton(ip)
        except OSError:
            ip_bytes = b"\x7f\x00\x00\x01"
        salt = ip_bytes + (os.getpid() & 0xFFFF).to_bytes(2, "big") + random.randbytes(4)
        self._prefix = np.frombuffer(salt.hex().upper().encode(), dtype=np.uint8)
        self._counter = itertools.count((int(time.time() * 1000) & 0xFFFFFF) << 24)
        self._lock = threading.Lock()

    def take(self, n: int) -> np.ndarray:
        """``n`` fresh keys as an ``(n, 32)`` array of ASCII bytes."""
        with self._lock:
            first = next(self._counter)
            self._counter = itertools.count(first + n)
        counters = (
            np.arange(first, first + n, dtype=np.uint64) & np.uint64(0xFFFFFFFFFFFF)
        ).astype(">u8")
        chars = np.empty((n, 32), dtype=np.uint8)
        chars[:, :20] = self._prefix
        chars[:, 20:] = _hex(counters.view(np.uint8).reshape(n, 8)[:, 2:])
        return chars


def _packed_keys(chars: np.ndarray) -> PackedKeys:
    """Fixed-width keys as the ``\\x00``-joined text a batch carries them in."""
    n, width = chars.shape
    joined = np.zeros((n, width + 1), dtype=np.uint8)
    joined[:, :width] = chars
    return PackedKeys(joined.tobytes()[:-1])


_uniq = _UniqueKeys()


@dataclass(frozen=True)
class ArrowMessages:
    """The message fields of ``n`` rows as Arrow arrays: what ``encode_arrow`` encodes.

    ``body`` is binary (a string column is sent as its UTF-8 bytes); ``keys`` is
    space-separated text, each key indexed; ``properties`` a map of user
    properties (TAGS, KEYS, UNIQ_KEY and PRODUCER_SEQ among them are ignored, as
    ``Message``'s).
    """

    body: pa.Array
    tags: pa.Array | None = None
    keys: pa.Array | None = None
    properties: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.body)


def _check_text(what: str, column: pa.Array, first_row: int) -> None:
    """No separator characters in a property text column (names the first bad row)."""
    bad = pc.match_substring_regex(column, "[\\x01\\x02]")
    if pc.any(bad).as_py():
        row = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
        raise InvalidMessageError(
            f"{what} of row {first_row + row} ({column[row].as_py()!r}): "
            "must not contain the separators \\x01 or \\x02"
        )


def _as_binary(what: str, column: pa.Array) -> pa.BinaryArray:
    if pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    if pa.types.is_string(column.type):
        column = column.cast(pa.binary())
    if not pa.types.is_binary(column.type):
        raise InvalidMessageError(f"{what}: must be a binary or string column, not {column.type}")
    return column


def _as_string(what: str, column: pa.Array) -> pa.StringArray:
    if pa.types.is_large_string(column.type):
        column = column.cast(pa.string())
    if not pa.types.is_string(column.type):
        raise InvalidMessageError(f"{what}: must be a string column, not {column.type}")
    return column


def _keys_text(keys: pa.Array, n: int, first_row: int) -> pa.Array:
    keys = _as_string("keys", keys)
    _check_text("keys", keys, first_row)
    # Runs of spaces or blanks at the ends would index empty keys: normalise them away.
    keys = pc.utf8_trim_whitespace(pc.replace_substring_regex(keys, " +", " "))
    return pc.if_else(pc.equal(keys, ""), pa.scalar(None, pa.string()), keys)


def _user_properties(
    properties: pa.Array, first_row: int, reserved: Sequence[str] = ()
) -> pa.Array:
    """``name\\x01value\\x02`` text of each row's user properties ("" for none); names in
    ``reserved`` (besides TAGS, KEYS, DELAY, UNIQ_KEY and PRODUCER_SEQ, the encoder's own:
    ``storage.properties.SYSTEM_PROPS``) are left out."""
    if not pa.types.is_map(properties.type):
        raise InvalidMessageError(f"properties: must be a map column, not {properties.type}")
    names = _as_string("property names", properties.keys)
    values = _as_string("property values", properties.items)
    _check_text("property names", names, first_row)
    _check_text("property values", values, first_row)
    offsets = properties.offsets.to_numpy()
    owner = np.repeat(np.arange(len(properties)), np.diff(offsets))
    if pc.any(pc.equal(pc.utf8_length(names), 0)).as_py():
        raise InvalidMessageError(f"properties: an empty name in row {first_row + owner[0]}")
    dropped = [*sorted(SYSTEM_PROPS), *reserved]  # as encode_batch drops them
    keep = pc.invert(pc.is_in(names, pa.array(dropped, pa.string())))
    pairs = pc.binary_join_element_wise(
        names, values.fill_null(""), pa.array(["\x01"] * len(names), pa.string())
    )
    pairs = pc.binary_join_element_wise(pairs, "\x02", "")
    pairs = pc.if_else(keep, pairs, "")
    per_row = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pairs)
    return pc.binary_join(per_row, "").fill_null("")


def encode_arrow(
    topic: str,
    messages: ArrowMessages,
    *,
    max_message_size: int = 4 << 20,
    born_host: str = "127.0.0.1:0",
    first_row: int = 0,
    extra_properties: Mapping[str, str] | None = None,
) -> EncodedBatch:
    """Encode Arrow rows as ``storage.codec.encode_batch`` would encode the same messages.

    ``extra_properties`` are added to every row (they win over a row's own of the same
    name): a transaction's marks (``TransactionContext.properties()``), which make the
    batch a transactional one (the store keeps its rows as half messages).

    Raises ``InvalidMessageError`` naming the row (``first_row`` + index) and the
    field: an empty or null body, a body over ``max_message_size``, a separator
    in tags, keys or properties, properties over 32 767 bytes.
    """
    validate_topic(topic)
    n = len(messages)
    if n == 0:
        raise InvalidMessageError("a batch needs at least one message")
    body = _as_binary("body", messages.body)
    body_len = pc.binary_length(body).fill_null(0).to_numpy().astype(np.int64)
    if np.any(body_len == 0):
        row = int(np.flatnonzero(body_len == 0)[0])
        raise InvalidMessageError(f"body of row {first_row + row} to {topic!r} is empty or null")
    if int(body_len.max()) > max_message_size:
        row = int(np.argmax(body_len))
        raise InvalidMessageError(
            f"body of row {first_row + row} is {body_len[row]} bytes: "
            f"over max_message_size={max_message_size}"
        )
    parts: list[pa.Array] = []
    tags = None
    if messages.tags is not None:
        tags = _as_string("tags", messages.tags)
        _check_text("tags", tags, first_row)
        if pc.any(pc.equal(tags, "")).as_py():
            row = int(np.flatnonzero(pc.equal(tags, "").to_numpy(zero_copy_only=False))[0])
            raise InvalidMessageError(f"tags of row {first_row + row}: must be null or non-empty")
        parts.append(pc.binary_join_element_wise("TAGS\x01", tags, "\x02", "").fill_null(""))
    extra = dict(extra_properties or {})
    for name, value in extra.items():
        if not name or any(c in f"{name}{value}" for c in "\x01\x02"):
            raise InvalidMessageError(f"extra property {name!r}={value!r}: empty or a separator")
    if messages.properties is not None:
        parts.append(_user_properties(messages.properties, first_row, list(extra)))
    if extra:
        const = "".join(f"{k}\x01{v}\x02" for k, v in extra.items())
        parts.append(pa.array([const] * n, pa.string()))
    keys = None
    if messages.keys is not None:
        keys = _keys_text(messages.keys, n, first_row)
        parts.append(pc.binary_join_element_wise("KEYS\x01", keys, "\x02", "").fill_null(""))
    uniq_chars = _uniq.take(n)
    uniq = _fixed_width_strings(uniq_chars)
    parts.append(pc.binary_join_element_wise("UNIQ_KEY\x01", uniq, "\x02", ""))
    props = pc.binary_join_element_wise(*parts, "") if len(parts) > 1 else parts[0]
    prop_len = pc.binary_length(props).to_numpy().astype(np.int64)
    if int(prop_len.max()) > MAX_PROPERTIES_LEN:
        row = int(np.argmax(prop_len))
        raise InvalidMessageError(
            f"properties of row {first_row + row} are {prop_len[row]} bytes: "
            f"over {MAX_PROPERTIES_LEN}"
        )
    topic_seg = bytes([len(topic)]) + topic.encode("ascii")
    sizes = _HDR_LEN + body_len + len(topic_seg) + 2 + prop_len
    hdr = np.zeros(n, dtype=_HDR)
    hdr["size"] = sizes
    hdr["magic"] = MAGIC
    hdr["crc"] = _crcs(body)
    hdr["born_ts"] = int(time.time() * 1000)
    hdr["born_host"] = np.frombuffer(host_to_bytes(born_host), dtype="V8")[0]
    hdr["body_len"] = body_len
    # Arrow's element-wise join writes each record in one pass: header, body, topic,
    # properties length, properties (no per-byte segment labels, no Python per row).
    records = pc.binary_join_element_wise(
        _fixed_width_binary(hdr.view(np.uint8).reshape(n, _HDR_LEN)),
        body,
        pa.scalar(topic_seg, pa.binary()),
        _fixed_width_binary(prop_len.astype(">u2").view(np.uint8).reshape(n, 2)),
        props.cast(pa.binary()),
        pa.scalar(b"", pa.binary()),
    )
    out = _values_bytes(records)
    index_keys, key_owner = _index_keys(topic, keys, n)
    key_hashes = np.concatenate(
        [java_hashes(index_keys), prefixed_java_hashes(f"{topic}#", uniq_chars)]
    )
    tag_codes = np.zeros(n, dtype=np.int64)
    if tags is not None:
        tag_codes = _tag_codes(tags)
    return EncodedBatch(
        data=out.tobytes(),
        sizes=sizes.astype(np.int32),
        topics=(topic,),
        topic_idx=np.zeros(n, dtype=np.int16),
        queue_ids=np.zeros(n, dtype=np.int32),
        tag_codes=tag_codes,
        key_hashes=key_hashes,
        key_owner=key_owner,
        uniq_keys=_packed_keys(uniq_chars),
        transactional=extra.get(PROP_TRAN_MSG) == "true",
        checked=True,  # built here, consistent by construction
    )


def _values_bytes(column: pa.Array) -> np.ndarray:
    """The value bytes of a binary or string array (no nulls), back to back."""
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[
        column.offset : column.offset + len(column) + 1
    ]
    data = column.buffers()[2]
    if data is None:
        return np.zeros(0, dtype=np.uint8)
    return np.frombuffer(data, dtype=np.uint8)[offsets[0] : offsets[-1]]


def _crcs(body: pa.Array) -> np.ndarray:
    offsets = np.frombuffer(body.buffers()[1], dtype=np.int32)[
        body.offset : body.offset + len(body) + 1
    ].tolist()
    view = memoryview(body.buffers()[2] or b"")
    return np.fromiter(
        (crc32(view[a:b]) & 0x7FFFFFFF for a, b in zip(offsets[:-1], offsets[1:])),
        dtype=np.int32,
        count=len(body),
    )


def _tag_codes(tags: pa.Array) -> np.ndarray:
    """Java ``hashCode`` of each row's tags (0 for none), hashing each distinct tag once."""
    encoded = pc.dictionary_encode(tags)
    hashes = java_hashes(encoded.dictionary.to_pylist()).astype(np.int64)
    index = encoded.indices.to_numpy(zero_copy_only=False)
    codes = np.zeros(len(tags), dtype=np.int64)
    present = ~np.asarray(pc.is_null(tags).to_numpy(zero_copy_only=False), dtype=bool)
    codes[present] = hashes[index[present].astype(np.int64)]
    return codes


def _index_keys(topic: str, keys: pa.Array | None, n: int) -> tuple[list[str], np.ndarray]:
    """``topic#key`` for each key of each row, and the owner of every IndexFile entry
    ``encode_batch`` makes: those keys' rows, then each of the ``n`` rows once more for
    its unique key (hashed by the caller)."""
    names: list[str] = []
    owners: list[np.ndarray] = []
    if keys is not None:
        split = pc.split_pattern(keys, " ")
        flat = pc.list_flatten(split)
        names = pc.binary_join_element_wise(f"{topic}#", flat, "").to_pylist()
        owners.append(pc.list_parent_indices(split).to_numpy().astype(np.int32))
    owners.append(np.arange(n, dtype=np.int32))
    return names, np.concatenate(owners)
