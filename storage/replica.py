"""CommitLog replication primitives: what a master streams and a slave appends.

A slave holds the master's CommitLog byte for byte at the same offsets (same
file size), and builds its own ConsumeQueue and index entries from it. Chunks
never span two files; they may end inside a record, which the slave
dispatches once the rest arrives.

A slave may append (:func:`append_bytes`), acknowledge, and only then
dispatch (:func:`dispatch`), so a SYNC_MASTER put waits for the copy,
not for the slave's indexing. The dispatch reads only the header fields, the
topic and the four properties the entries need (TAGS, KEYS, UNIQ_KEY, DELAY)
and writes the entries in vectorised runs, as a put does: decoding each record
into a ``MessageExt`` cost about 14 times the master's own put and made the
slave the bottleneck of synchronous replication.

These functions work on the parts they are given; the store's methods
(``MessageStore.append_commitlog`` ...) call them under its put lock.

Invariants: ``dispatched_offset <= commitlog.max_offset``; everything below
``dispatched_offset`` is in the ConsumeQueues; the bytes between the two are
whole records appended but not yet dispatched, then at most a prefix of one
record.
"""

from __future__ import annotations

import logging
import struct
from collections import defaultdict

import numpy as np

from . import codec, transaction
from .commitlog import CommitLog
from .config import StoreConfig
from .consume_queue_store import ConsumeQueueStore
from .errors import OffsetOutOfRangeError, StoreCorruptedError
from .index_file import IndexService
from .producer_state import ProducerStateTable
from .quarantine import QUARANTINE_TOPIC
from .schedule import SCHEDULE_TOPIC

log = logging.getLogger("raymq.storage.replica")

_SIZE_MAGIC = struct.Struct(">iI")
# size, magic, queue id, queue offset, physical offset, store timestamp, body length
_HEAD = struct.Struct(">iI4xi4xqq20xq20xi")
_BODY_AT = 88
_SYSFLAG = struct.Struct(">i")
_TAGS = codec.PROP_TAGS.encode()
_KEYS = codec.PROP_KEYS.encode()
_UNIQ = codec.PROP_UNIQ_KEY.encode()
_DELAY = codec.PROP_DELAY.encode()
_PSEQ = codec.PROP_PRODUCER_SEQ.encode()
_PAIR = codec.PROPERTY_SEP.encode()
_NAME_VALUE = codec.NAME_VALUE_SEP.encode()


def read_chunk(cl: CommitLog, offset: int, max_bytes: int) -> bytes:
    """Up to ``max_bytes`` of the CommitLog from ``offset``, within one file."""
    if offset == cl.max_offset:
        return b""
    if not cl.min_offset <= offset < cl.max_offset:
        raise OffsetOutOfRangeError(
            f"replication offset {offset} outside [{cl.min_offset}, {cl.max_offset}]"
        )
    mf = cl.files.find(offset)
    assert mf is not None
    rel = offset - mf.from_offset
    return mf.read(rel, min(max_bytes, mf.wrote_position - rel))


def append_bytes(cl: CommitLog, offset: int, data: bytes | memoryview) -> int:
    """Append master bytes at ``offset`` (this log's end) without dispatching them; return
    the new end offset (what a slave acknowledges). An empty log joins at ``offset``: its
    first file starts where the master's file holding ``offset`` does."""
    if offset != cl.max_offset:
        raise OffsetOutOfRangeError(
            f"replica ends at {cl.max_offset}; a chunk starting at {offset} does not follow"
        )
    if not data:
        return offset
    if offset == 0 and not cl.files.files:
        mf = cl.files.create(0)
    else:
        last = cl.files.last()
        if last is None:  # an empty replica joining a master whose early files expired
            mf = cl.files.create(offset - offset % cl.file_size)
            mf.wrote_position = mf.flushed_position = offset % cl.file_size
        elif last.is_full:
            mf = cl.files.create(last.from_offset + cl.file_size)
        else:
            mf = last
    if len(data) > mf.remaining:
        raise StoreCorruptedError(
            f"a chunk of {len(data)} bytes at {offset} crosses the end of {mf.path.name}"
        )
    mf.append(data)
    return cl.max_offset


_UNIQ_ONLY = _UNIQ + _NAME_VALUE


def _properties(
    raw: bytes,
) -> tuple[bytes | None, bytes | None, bytes | None, bytes | None, bytes | None]:
    """TAGS, KEYS, UNIQ_KEY, DELAY and PRODUCER_SEQ of a record's properties (None when
    absent)."""
    if raw.startswith(_UNIQ_ONLY) and raw.count(_PAIR) <= 1:  # most records: the unique key
        return None, None, raw[len(_UNIQ_ONLY) :].rstrip(_PAIR), None, None
    tags = keys = uniq = delay = pseq = None
    for pair in raw.split(_PAIR):
        name, _, value = pair.partition(_NAME_VALUE)
        if name == _UNIQ:
            uniq = value
        elif name == _TAGS:
            tags = value
        elif name == _KEYS:
            keys = value
        elif name == _DELAY:
            delay = value
        elif name == _PSEQ:
            pseq = value
    return tags, keys, uniq, delay, pseq


def dispatch(
    cl: CommitLog,
    queues: ConsumeQueueStore,
    index: IndexService,
    config: StoreConfig,
    dispatched: int,
    producers: ProducerStateTable | None = None,
) -> tuple[int, list[tuple[str, int, int]]]:
    """ConsumeQueue and index entries of every whole record from ``dispatched`` on; return
    the new dispatched offset and ``(topic, queue id, max offset)`` of each queue fed.
    Runs of idempotent producers (``PRODUCER_SEQ``) go into ``producers``."""
    end = cl.max_offset
    pos = dispatched
    rows: dict[tuple[str, int], list[tuple[int, int, int, int]]] = defaultdict(list)
    keys: list[str] = []
    key_offsets: list[int] = []
    key_ts: list[int] = []
    # a one-phase commit's records gather apart until its marker arrives (group_at: where
    # it began); what is outside any group goes to the done_* lists
    done_rows, done_keys, done_key_offsets, done_key_ts = rows, keys, key_offsets, key_ts
    group_at: int | None = None
    topics: dict[bytes, str] = {}
    tag_codes: dict[bytes | None, int] = {None: 0}
    levels = config.delay_levels_ms
    unpack_head = _HEAD.unpack_from
    unpack_size = _SIZE_MAGIC.unpack_from
    while pos + 8 <= end:
        mf = cl.files.find(pos)
        if mf is None:
            break
        base = mf.from_offset
        buf = mf.buffer
        file_size = mf.file_size
        stop = min(end - base, file_size)  # this file's bytes that arrived
        rel = pos - base
        while rel + 8 <= stop:
            size, magic = unpack_size(buf, rel)
            if magic != codec.MAGIC:
                if magic == codec.BLANK_MAGIC:
                    if stop == file_size:  # the file's end arrived: go on with the next
                        rel = file_size
                    break
                raise StoreCorruptedError(f"replicated bytes at {base + rel} are not a record")
            if rel + size > stop:
                break
            if size < codec.FIXED_LEN:
                raise StoreCorruptedError(f"replicated bytes at {base + rel} are not a record")
            size, _, qid, qoff, phys, store_ts, body_len = unpack_head(buf, rel)
            if phys != base + rel:
                raise StoreCorruptedError(f"replicated record at {base + rel} claims offset {phys}")
            t = rel + _BODY_AT + body_len
            p = t + 1 + buf[t]
            raw_topic = buf[t + 1 : p]
            topic = topics.get(raw_topic)
            if topic is None:
                topic = topics[raw_topic] = raw_topic.decode("utf-8")
            if topic == QUARANTINE_TOPIC:  # damaged bytes the master set aside: no entries
                rel += size
                continue
            role = transaction.group_role(_SYSFLAG.unpack_from(buf, rel + 36)[0])
            if role == transaction.GROUP_MEMBER:
                if group_at is None:  # a one-phase commit: dispatched once its marker is here
                    group_at = base + rel
                    rows, keys, key_offsets, key_ts = defaultdict(list), [], [], []
            elif group_at is not None:  # its marker (or a record outside it: none came)
                for k, v in rows.items():
                    done_rows[k].extend(v)
                done_keys.extend(keys)
                done_key_offsets.extend(key_offsets)
                done_key_ts.extend(key_ts)
                group_at = None
                rows, keys, key_offsets, key_ts = (
                    done_rows,
                    done_keys,
                    done_key_offsets,
                    done_key_ts,
                )
            prop_len = (buf[p] << 8) | buf[p + 1]
            tags = key_list = uniq = delay = pseq = None
            if prop_len:
                tags, key_list, uniq, delay, pseq = _properties(buf[p + 2 : p + 2 + prop_len])
                if pseq is not None and producers is not None:
                    producers.apply_property(pseq, topic, qid, qoff, phys, store_ts)
            code = tag_codes.get(tags)
            if code is None:
                code = tag_codes[tags] = codec.java_hash(tags.decode("utf-8")) if tags else 0
            if topic == SCHEDULE_TOPIC:  # the tag field holds the delivery time
                code = store_ts + levels[min(max(int(delay or 0), 1), len(levels)) - 1]
            rows[(topic, qid)].append((qoff, phys, size, code))
            if uniq:
                keys.append(f"{topic}#{uniq.decode('utf-8')}")
                key_offsets.append(phys)
                key_ts.append(store_ts)
            if key_list:
                for key in key_list.decode("utf-8").split(" "):
                    if key:
                        keys.append(f"{topic}#{key}")
                        key_offsets.append(phys)
                        key_ts.append(store_ts)
            rel += size
        if stop == file_size and rel + 8 > file_size:
            rel = file_size  # a tail too short for a blank marker
        pos = base + rel
        if rel < file_size:
            break  # waiting for the rest of this file (or of a record)
    if group_at is not None:  # its marker has yet to arrive: dispatched from there next time
        pos = group_at
    rows, keys, key_offsets, key_ts = done_rows, done_keys, done_key_offsets, done_key_ts
    for (topic, qid), queue_rows in rows.items():
        arr = np.array(queue_rows, dtype=np.int64)
        queues.find_or_create(topic, qid).append_dispatched(
            arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3]
        )
    if keys and config.message_index_enable:
        hashes = np.abs(codec.java_hashes(keys).astype(np.int64))
        hashes[hashes > 0x7FFFFFFF] = 0
        offsets = np.array(key_offsets, dtype=np.int64)
        index.put_stamped(hashes, offsets, np.array(key_ts, dtype=np.int64))  # right time diffs
    return pos, [(t, q, queues[(t, q)].max_offset) for t, q in sorted(rows)]


def truncate(cl: CommitLog, queues: ConsumeQueueStore, config: StoreConfig, offset: int) -> None:
    """Cut the CommitLog (and the queue entries pointing past it) back to ``offset``.

    For a Raft follower dropping an uncommitted divergent tail, and for a slave
    promoted to master (cut to its last whole record).
    """
    if not cl.min_offset <= offset <= cl.max_offset:
        raise OffsetOutOfRangeError(
            f"truncation point {offset} outside [{cl.min_offset}, {cl.max_offset}]"
        )
    if offset == cl.max_offset:
        return
    log.warning("truncating commitlog %s from %d to %d", cl.files.directory, cl.max_offset, offset)
    max_record = config.max_message_size + codec.FIXED_LEN + codec.MAX_TOPIC_LEN
    cl.truncate(offset, max_record + codec.MAX_PROPERTIES_LEN)
    queues.truncate_to_commitlog(offset)
