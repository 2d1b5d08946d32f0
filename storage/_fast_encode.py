"""The producer's hot path: encode a batch of plain messages with numpy.

"Plain" is what most batches are: one topic, no user properties, keys or
delay, tags shared by the whole batch (or absent). Headers, the topic and
property tails, the unique keys and their index hashes are built as arrays
for the whole batch; the only per-message Python work left is the body's
CRC and one slice of each part. Anything else goes through
:func:`storage.codec.encode_batch`'s general loop; both give the same bytes.
"""

from __future__ import annotations

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
_SHIFTS = np.arange(44, -4, -4, dtype=np.uint64)  # 12 hex digits of a 48-bit counter
_UNIQ_HEAD = b"UNIQ_KEY\x01"


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
    topic, tags = first.topic, first.tags
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
    codec.validate_topic(topic)
    if tags is not None and (not tags or "\x01" in tags or "\x02" in tags):
        return None  # the general path names the error
    bodies = [m.body for m in messages]
    lengths = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    if int(lengths.min()) == 0 or int(lengths.max()) > max_message_size:
        return None
    try:
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
    digits = _HEX[((counters[:, None] >> _SHIFTS) & np.uint64(0xF)).astype(np.intp)]
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
    hdr["crc"] = np.array(list(map(crc32, bodies)), dtype=np.int64) & 0x7FFFFFFF
    hdr["qid"] = queue_ids
    hdr["flag"] = flags
    hdr["born_ts"] = born_ts
    hdr["born_ip"] = int.from_bytes(born_raw[:4], "big")
    hdr["born_port"] = int.from_bytes(born_raw[4:], "big")
    hdr["body_len"] = lengths

    # between two bodies lie one record's tail and the next one's header: build those
    # "glue" chunks as rows of one array, then join glue, body, glue, body, ..., glue
    hs, ts = codec.HEADER.size, tail_len
    glue = np.empty((n + 1, ts + hs), dtype=np.uint8)
    glue[1:, :ts] = tails
    glue[:-1, ts:] = hdr.view(np.uint8).reshape(n, hs)
    width = ts + hs
    raw = glue.tobytes()
    parts: list[bytes] = [b""] * (2 * n + 1)
    parts[0::2] = [raw[i : i + width] for i in range(0, (n + 1) * width, width)]
    parts[0] = parts[0][ts:]
    parts[-1] = parts[-1][:ts]
    parts[1::2] = bodies
    data = b"".join(parts)

    # index keys "topic#<uniq>": equal lengths, so the Java hash is one matrix product
    key_head = np.frombuffer(f"{topic}#".encode("ascii"), dtype=np.uint8)
    key_len = len(key_head) + 32
    weights = codec._pow31(key_len + 1)[key_len - 1 :: -1][:key_len]
    codes = np.empty((n, key_len), dtype=np.uint32)
    codes[:, : len(key_head)] = key_head
    codes[:, len(key_head) :] = uniq
    key_hashes = (codes * weights).sum(axis=1, dtype=np.uint32).view(np.int32)

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
