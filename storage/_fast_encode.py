"""The producer's hot path: encode a batch of plain messages.

"Plain" is what most batches are: one topic, no user properties or delay, tags
shared by the whole batch (or absent), and either no keys or one key each (an
order id, as a str or a list or tuple of one str: the C encoder writes it and its
index hash). Anything else goes through
:func:`storage.codec.encode_batch`'s general loop. This module builds on
``storage.batch`` and registers :func:`encode_plain` with it when imported
(``batch.use_plain_encoder``), so ``encode_batch`` takes this path for plain
batches; the producer calls :func:`encode_plain` directly.

Two encoders give the same bytes. ``storage._native`` (C, built at install
where a compiler is) reads each message's slots and writes its record in one
pass, ~0.1 us a 100 B message. Where it is missing, the numpy one builds the
headers, tails, unique keys and their index hashes as arrays for the whole
batch, leaving a validation loop, the body's CRC and one slice of each part as
per-message Python work: ~0.5-0.9 us a message. The C encoder takes batches of any
size, a single message too (~18-21 us against ~33-36 us for the general loop, with
its fixed cost of building the batch's arrays); the numpy one only batches of 8 and
more, below which its array calls cost more than the loop.
"""

from __future__ import annotations

import functools
import logging
import struct
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from . import batch, java_hash, properties, record, seq_slots
from ._crc import crc32, crc32_address
from .batch import EncodedBatch
from .errors import InvalidMessageError
from .message import Message
from .message_id import UniqueKeyGenerator
from .properties import PROP_TRAN_MSG, SYSTEM_PROPS

_native = record._native
if _native is not None:
    _native.bind(Message)

log = logging.getLogger("raymq.storage.encode")
if _native is None:  # pragma: no cover
    log.info("storage._native is not built: plain batches encode with numpy (slower)")

_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
# byte -> its two hex digits, as one uint16 in memory order (np.take of 2-byte items)
_HEX_PAIRS = (
    np.stack([_HEX[np.arange(256) >> 4], _HEX[np.arange(256) & 0xF]], axis=1).copy().view(np.uint16)
).ravel()
_UNIQ_HEAD = b"UNIQ_KEY\x01"


@functools.lru_cache(maxsize=64)
def _splitter(width: int, count: int) -> struct.Struct:
    """Cuts ``count`` chunks of ``width`` bytes out of one buffer in a single C call
    (a slice per chunk in Python cost ~5x more)."""
    return struct.Struct(f"{width}s" * count)


_local = threading.local()


def _scratch(size: int) -> np.ndarray:
    """A uint8 buffer of ``size`` bytes this thread reuses from batch to batch: a fresh
    one of a batch's size comes from ``mmap`` and pays a page fault per 4 KiB."""
    buf: np.ndarray | None = getattr(_local, "buf", None)
    if buf is None or len(buf) < size:
        buf = _local.buf = np.empty(max(size, 1 << 16), dtype=np.uint8)
    return buf[:size]


def encode_plain(
    messages: Sequence[Message],
    max_message_size: int,
    born_ts: int,
    born_raw: bytes,
    gen: UniqueKeyGenerator,
    seq_slot: bytes | None = None,
    shared: Mapping[str, str] | None = None,
    extras: Sequence[bytes] | None = None,
) -> EncodedBatch | None:
    """The batch encoded, or ``None`` when it is not plain (the caller then loops).

    ``seq_slot`` (``seq_slots.seq_slot(producer id)``): an idempotent producer's batch, its
    first record ending with that reserved ``PRODUCER_SEQ`` property, so binding it to
    a queue's sequences patches a few bytes in place (``EncodedBatch.with_sequence``)
    instead of copying the batch; ``data`` is then a writable view of a bytearray.

    ``shared``: properties every message carries, none of its own (a transaction's
    marks): written as the general loop writes a message whose properties they are
    (the C encoder only; without it, None).

    ``extras``: per message, properties of its own already encoded
    (``properties.encode_properties``), written after ``shared`` (a lite topic named
    per message; the C encoder only)."""
    if _native is not None:
        return encode_plain_c(
            messages, max_message_size, born_ts, born_raw, gen, seq_slot, shared, extras
        )
    if shared or extras is not None:
        return None
    return encode_plain_numpy(messages, max_message_size, born_ts, born_raw, gen, seq_slot)


def _shared_text(shared: Mapping[str, str]) -> bytes | None:
    """``shared`` as the general loop writes a message's own properties (checked as it
    checks them); None when they ask for what it treats its own way (a delivery time)."""
    if properties.PROP_TIMER_DELIVER_MS in shared or properties.PROP_TIMER_DELAY_SEC in shared:
        return None
    return properties.encode_properties({k: v for k, v in shared.items() if k not in SYSTEM_PROPS})


def _tail_head(topic: str, tags: str | None, extra: bytes = b"") -> bytes | None:
    """A record's tail up to its unique key (topic section, PROPLEN, the tags, the
    shared properties ``extra``, the key's name), or ``None`` when the properties would
    not fit."""
    raw_topic = topic.encode("ascii")
    tag_part = f"TAGS\x01{tags}\x02".encode() if tags is not None else b""
    props_len = len(tag_part) + len(extra) + len(_UNIQ_HEAD) + 32 + 1
    if props_len > properties.MAX_PROPERTIES_LEN:
        return None
    return (
        bytes((len(raw_topic),))
        + raw_topic
        + props_len.to_bytes(2, "big")
        + tag_part
        + extra
        + _UNIQ_HEAD
    )


def encode_plain_c(
    messages: Sequence[Message],
    max_message_size: int,
    born_ts: int,
    born_raw: bytes,
    gen: UniqueKeyGenerator,
    seq_slot: bytes | None = None,
    shared: Mapping[str, str] | None = None,
    extras: Sequence[bytes] | None = None,
) -> EncodedBatch | None:
    """:func:`encode_plain` through ``storage._native``."""
    assert _native is not None
    n = len(messages)
    extra = b""
    if shared:
        got = _shared_text(shared)
        if got is None:
            return None
        extra = got
    first = messages[0]
    if first.__class__ is not Message:
        return None
    topic, tags = first.topic, first.tags
    if topic.__class__ is not str or (tags is not None and tags.__class__ is not str):
        return None
    key = first.keys
    if (key.__class__ is list or key.__class__ is tuple) and len(key) == 1:
        key = key[0]  # keys=[order_id]: one key, as the C encoder takes it
    keyed = key.__class__ is str and bool(key)
    consts = _consts(topic, tags, keyed, extra, gen.prefix)
    if consts is None:
        return None
    head, prefix, key_base, topic_hash, tag_code = consts
    header = record.HEADER.pack(
        0, record.MAGIC, 0, 0, 0, 0, 0, 0, born_ts, born_raw, 0, bytes(8), 0, 0, 0
    )
    # a batch found not plain has then used up n counter values: harmless, they
    # only need to be unique
    out = _native.encode_plain(
        messages,
        topic,
        tags,
        max_message_size,
        header,
        head,
        prefix,
        gen.take(n),
        key_base,
        crc32_address,
        keyed,
        topic_hash,
        seq_slot or b"",
        extras,
    )
    if out is None:
        return None
    raw, sizes, queue_ids, key_hashes, uniq_raw = out
    size_arr = np.frombuffer(sizes, dtype=np.int32)
    # with a slot, a bytearray's view: bound in place
    data = memoryview(raw) if isinstance(raw, bytearray) else raw
    if n == 1:  # a lone message (the usual send at a low rate): shared read-only arrays
        topic_idx, owners = _ONE_TOPIC_IDX, _ONE_OWNERS[keyed]
        codes = batch.shared_one(_ONE_TAG_CODES, tag_code, np.int64)
    else:
        topic_idx = np.zeros(n, dtype=np.int16)
        # a keyed record has two index entries, its key's then its unique key's
        ids = np.arange(n, dtype=np.int32)
        owners = np.repeat(ids, 2) if keyed else ids
        codes = np.full(n, tag_code, dtype=np.int64)
    return batch.new_batch(
        data=data,
        sizes=size_arr,
        topics=(topic,),
        topic_idx=topic_idx,
        queue_ids=np.frombuffer(queue_ids, dtype=np.int32),
        tag_codes=codes,
        key_hashes=np.frombuffer(key_hashes, dtype=np.int32),
        key_owner=owners,
        uniq_keys=batch.PackedKeys(uniq_raw),
        checked=True,
        seq_slot_at=seq_slots.slot_at(int(size_arr[0]), seq_slot) if seq_slot else None,
        transactional=shared is not None and shared.get(PROP_TRAN_MSG) == "true",
    )


_Consts = tuple[bytes, bytes, int, int, int]
_CONSTS: dict[tuple[str, str | None, bool, bytes, str], _Consts | None] = {}
"""What :func:`encode_plain_c` derives from a batch's topic, tags, kind of key, shared
properties and key prefix alone, by those (checked once: a bad topic is not kept)."""


def _consts(topic: str, tags: str | None, keyed: bool, extra: bytes, prefix: str) -> _Consts | None:
    """(record tail head, key prefix, unique key hash base, topic hash, tag code), or None
    when the general path is to encode (and name the error of) such a batch."""
    key = (topic, tags, keyed, extra, prefix)
    try:
        return _CONSTS[key]
    except KeyError:
        pass
    record.validate_topic(topic)
    consts: _Consts | None = None
    if tags is None or (tags and "\x01" not in tags and "\x02" not in tags):
        head = _keyed_head(topic, tags, extra) if keyed else _tail_head(topic, tags, extra)
        if head is not None:
            consts = (
                head,
                prefix.encode("ascii"),
                java_hash.java_hash(f"{topic}#{prefix}") & 0xFFFFFFFF,
                java_hash.java_hash(f"{topic}#") & 0xFFFFFFFF,
                java_hash.java_hash(tags) if tags is not None else 0,
            )
    if len(_CONSTS) >= 4096:
        _CONSTS.clear()
    _CONSTS[key] = consts
    return consts


def _read_only(values: np.ndarray) -> np.ndarray:
    values.flags.writeable = False
    return values


_ONE_TOPIC_IDX = _read_only(np.zeros(1, dtype=np.int16))
_ONE_OWNERS = (
    _read_only(np.zeros(1, dtype=np.int32)),  # its unique key's entry
    _read_only(np.zeros(2, dtype=np.int32)),  # keyed: its key's, then its unique key's
)
_ONE_TAG_CODES: dict[int, np.ndarray] = {}
"""A lone message's arrays that depend on its topic, kind of key and tags alone are
shared read-only between batches (as its queue ids are, ``batch.shared_one``): four
numpy arrays made per message were a fifth of its encode."""


def _keyed_head(topic: str, tags: str | None, extra: bytes = b"") -> bytes:
    """A keyed record's tail up to its KEYS property: topic section, a PROPLEN the C
    encoder writes per record, the tags, the shared properties ``extra``."""
    raw_topic = topic.encode("ascii")
    tag_part = f"TAGS\x01{tags}\x02".encode() if tags is not None else b""
    return bytes((len(raw_topic),)) + raw_topic + b"\x00\x00" + tag_part + extra


def encode_plain_numpy(
    messages: Sequence[Message],
    max_message_size: int,
    born_ts: int,
    born_raw: bytes,
    gen: UniqueKeyGenerator,
    seq_slot: bytes | None = None,
) -> EncodedBatch | None:
    """:func:`encode_plain` with numpy: the fallback, and the C encoder's reference."""
    n = len(messages)
    if n < 8:
        return None
    first = messages[0]
    topic, tags, qid, flag = first.topic, first.tags, first.queue_id, first.flag
    uniform = True  # every message has the first one's queue id and flag
    for m in messages:
        if (
            m.topic != topic
            or m.tags != tags
            or m.properties
            or m.keys
            or m.delay_level
            or m.body.__class__ is not bytes
        ):
            return None
        if uniform and (m.queue_id != qid or m.flag != flag):
            uniform = False
    record.validate_topic(topic)
    if tags is not None and (not tags or "\x01" in tags or "\x02" in tags):
        return None  # the general path names the error
    bodies = [m.body for m in messages]
    lengths = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    if int(lengths.min()) == 0 or int(lengths.max()) > max_message_size:
        return None
    try:
        if uniform:
            queue_ids = np.full(n, qid, dtype=np.int64)
            flags = np.full(n, flag, dtype=np.int64)
        else:
            queue_ids = np.array([m.queue_id for m in messages], dtype=np.int64)
            flags = np.array([m.flag for m in messages], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return None
    if int(queue_ids.min()) < 0 or int(queue_ids.max()) > 0x7FFFFFFF:
        return None
    if int(flags.min()) < -(1 << 31) or int(flags.max()) >= 1 << 31:
        return None

    # unique keys: the generator's prefix + 12 hex digits of consecutive counters
    start = gen.take(n)
    counters = (np.arange(n, dtype=np.uint64) + np.uint64(start)) & np.uint64(0xFFFFFFFFFFFF)
    # the low 6 big-endian bytes of each counter, each byte two hex digits from a table
    low6 = counters.astype(">u8").view(np.uint8).reshape(n, 8)[:, 2:]
    digits = np.take(_HEX_PAIRS, low6).view(np.uint8).reshape(n, 12)
    prefix = np.frombuffer(gen.prefix.encode("ascii"), dtype=np.uint8)
    uniq = np.empty((n, 32), dtype=np.uint8)
    uniq[:, :20] = prefix
    uniq[:, 20:] = digits

    # the tail of every record: topic section, property length, properties
    head = _tail_head(topic, tags)
    if head is None:
        return None
    extra = len(seq_slot) if seq_slot else 0
    props_at = head[0] + 1  # PROPLEN in a tail, after the topic section
    if extra and int.from_bytes(head[props_at : props_at + 2], "big") + extra > (
        properties.MAX_PROPERTIES_LEN
    ):
        return None
    tails = np.empty((n, len(head) + 33), dtype=np.uint8)
    tails[:, : len(head)] = np.frombuffer(head, dtype=np.uint8)
    tails[:, len(head) : len(head) + 32] = uniq
    tails[:, -1] = 2
    tail_len = tails.shape[1]

    sizes = record.HEADER.size + lengths + tail_len
    sizes[0] += extra  # the first record ends with the reserved slot
    hdr = np.zeros(n, dtype=record._HDR)
    hdr["size"] = sizes
    hdr["magic"] = record.MAGIC
    hdr["crc"] = np.fromiter(map(crc32, bodies), dtype=np.int64, count=n) & 0x7FFFFFFF
    hdr["qid"] = queue_ids
    hdr["flag"] = flags
    hdr["born_ts"] = born_ts
    hdr["born_ip"] = int.from_bytes(born_raw[:4], "big")
    hdr["born_port"] = int.from_bytes(born_raw[4:], "big")
    hdr["body_len"] = lengths

    # between two bodies lie one record's tail and the next one's header: build those
    # "glue" chunks as rows of one array, then join glue, body, glue, body, ..., glue
    hs, ts = record.HEADER.size, tail_len
    width = ts + hs
    glue = _scratch((n + 1) * width).reshape(n + 1, width)
    glue[1:, :ts] = tails
    glue[:-1, ts:] = hdr.view(np.uint8).reshape(n, hs)
    parts: list[bytes] = [b""] * (2 * n + 1)
    parts[0::2] = _splitter(width, n + 1).unpack(glue.data)
    parts[0] = parts[0][ts:]
    parts[-1] = parts[-1][:ts]
    parts[1::2] = bodies
    if extra:  # the first tail: its PROPLEN counting the slot, the slot after it
        assert seq_slot is not None
        first_tail = bytearray(parts[2][:ts])
        props = int.from_bytes(first_tail[props_at : props_at + 2], "big") + extra
        first_tail[props_at : props_at + 2] = props.to_bytes(2, "big")
        parts[2] = bytes(first_tail) + seq_slot + parts[2][ts:]
    data = memoryview(bytearray().join(parts)) if extra else b"".join(parts)

    # index keys "topic#<prefix><12 digits>": the Java hash of the shared head times
    # 31**12 plus the digits' own, one matrix product for the batch
    key_hashes = java_hash.prefixed_java_hashes(f"{topic}#{gen.prefix}", digits)

    sep = np.zeros((n, 33), dtype=np.uint8)
    sep[:, :32] = uniq
    uniq_raw = sep.tobytes()[:-1]
    tag_code = java_hash.java_hash_cached(tags) if tags is not None else 0
    if int(sizes.max()) > (1 << 31) - 1:
        raise InvalidMessageError("a record over 2 GiB")
    return batch.new_batch(
        data=data,
        sizes=sizes.astype(np.int32),
        topics=(topic,),
        topic_idx=np.zeros(n, dtype=np.int16),
        queue_ids=queue_ids.astype(np.int32),
        tag_codes=np.full(n, tag_code, dtype=np.int64),
        key_hashes=key_hashes.copy(),
        key_owner=np.arange(n, dtype=np.int32),
        uniq_keys=batch.PackedKeys(uniq_raw),
        checked=True,
        seq_slot_at=seq_slots.slot_at(int(sizes[0]), seq_slot) if seq_slot else None,
    )


batch.use_plain_encoder(encode_plain)
