"""The producer's hot path: encode a batch of plain messages with numpy.

"Plain" is what most batches are: one topic, no user properties, keys or
delay, tags shared by the whole batch (or absent). Headers, the topic and
property tails, the unique keys and their index hashes are built as arrays
for the whole batch; the only per-message Python work left is the body's
CRC and one slice of each part. Anything else goes through
:func:`storage.codec.encode_batch`'s general loop; both give the same bytes.
"""

from __future__ import annotations

import functools
import struct
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from . import codec
from ._crc import crc32
from .errors import InvalidMessageError
from .message import Message

if TYPE_CHECKING:
    from .codec import EncodedBatch, UniqueKeyGenerator

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
) -> EncodedBatch | None:
    """The batch encoded, or ``None`` when it is not plain (the caller then loops)."""
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
    codec.validate_topic(topic)
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
    raw_topic = topic.encode("ascii")
    tag_part = f"TAGS\x01{tags}\x02".encode() if tags is not None else b""
    props_len = len(tag_part) + len(_UNIQ_HEAD) + 32 + 1
    if props_len > codec.MAX_PROPERTIES_LEN:
        return None
    head = (
        bytes((len(raw_topic),)) + raw_topic + props_len.to_bytes(2, "big") + tag_part + _UNIQ_HEAD
    )
    tails = np.empty((n, len(head) + 33), dtype=np.uint8)
    tails[:, : len(head)] = np.frombuffer(head, dtype=np.uint8)
    tails[:, len(head) : len(head) + 32] = uniq
    tails[:, -1] = 2
    tail_len = tails.shape[1]

    sizes = codec.HEADER.size + lengths + tail_len
    hdr = np.zeros(n, dtype=codec._HDR)
    hdr["size"] = sizes
    hdr["magic"] = codec.MAGIC
    hdr["crc"] = np.fromiter(map(crc32, bodies), dtype=np.int64, count=n) & 0x7FFFFFFF
    hdr["qid"] = queue_ids
    hdr["flag"] = flags
    hdr["born_ts"] = born_ts
    hdr["born_ip"] = int.from_bytes(born_raw[:4], "big")
    hdr["born_port"] = int.from_bytes(born_raw[4:], "big")
    hdr["body_len"] = lengths

    # between two bodies lie one record's tail and the next one's header: build those
    # "glue" chunks as rows of one array, then join glue, body, glue, body, ..., glue
    hs, ts = codec.HEADER.size, tail_len
    width = ts + hs
    glue = _scratch((n + 1) * width).reshape(n + 1, width)
    glue[1:, :ts] = tails
    glue[:-1, ts:] = hdr.view(np.uint8).reshape(n, hs)
    parts: list[bytes] = [b""] * (2 * n + 1)
    parts[0::2] = _splitter(width, n + 1).unpack(glue.data)
    parts[0] = parts[0][ts:]
    parts[-1] = parts[-1][:ts]
    parts[1::2] = bodies
    data = b"".join(parts)

    # index keys "topic#<prefix><12 digits>": the Java hash of the shared head times
    # 31**12 plus the digits' own, one matrix product for the batch
    key_hashes = codec.prefixed_java_hashes(f"{topic}#{gen.prefix}", digits)

    sep = np.zeros((n, 33), dtype=np.uint8)
    sep[:, :32] = uniq
    uniq_text = sep.tobytes()[:-1].decode("ascii")
    tag_code = codec.java_hash(tags) if tags is not None else 0
    if int(sizes.max()) > (1 << 31) - 1:
        raise InvalidMessageError("a record over 2 GiB")
    return codec.EncodedBatch(
        data=data,
        sizes=sizes.astype(np.int32),
        topics=(topic,),
        topic_idx=np.zeros(n, dtype=np.int16),
        queue_ids=queue_ids.astype(np.int32),
        tag_codes=np.full(n, tag_code, dtype=np.int64),
        key_hashes=key_hashes.copy(),
        key_owner=np.arange(n, dtype=np.int32),
        uniq_keys=codec.PackedKeys(uniq_text),
        checked=True,
    )
