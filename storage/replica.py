"""CommitLog replication primitives: what a master streams and a slave appends.

A slave holds the master's CommitLog byte for byte at the same offsets (same
file size), and builds its own ConsumeQueue and index entries from it. Chunks
never span two files; they may end inside a record, which the slave
dispatches once the rest arrives.

Invariants: ``dispatched_offset <= commitlog.max_offset``; everything below
``dispatched_offset`` is in the ConsumeQueues; the bytes between the two are a
prefix of one record (or nothing).
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING

from . import codec
from .errors import OffsetOutOfRangeError, StoreCorruptedError
from .recovery import _Dispatcher

if TYPE_CHECKING:
    from .store import MessageStore

log = logging.getLogger("raymq.storage.replica")

_SIZE_MAGIC = struct.Struct(">iI")


def read_chunk(store: MessageStore, offset: int, max_bytes: int) -> bytes:
    """Up to ``max_bytes`` of the CommitLog from ``offset``, within one file."""
    cl = store.commitlog
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


def append_chunk(store: MessageStore, offset: int, data: bytes) -> int:
    """Append master bytes at ``offset`` (= this store's end); dispatch whole records.

    Returns the new end offset (what a slave acknowledges).
    """
    with store._put_lock:
        store._check_open()
        cl = store.commitlog
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
                store._dispatched = offset
            elif last.is_full:
                mf = cl.files.create(last.from_offset + cl.file_size)
            else:
                mf = last
        if len(data) > mf.remaining:
            raise StoreCorruptedError(
                f"a chunk of {len(data)} bytes at {offset} crosses the end of {mf.path.name}"
            )
        mf.append(data)
        notes = _dispatch_complete(store)
        end = cl.max_offset
    store._notify(notes)
    if store.config.sync_flush:
        cl.flush_until(end)
    return end


def _dispatch_complete(store: MessageStore) -> list[tuple[str, int, int]]:
    cl = store.commitlog
    end = cl.max_offset
    pos = store._dispatched
    dispatcher = _Dispatcher(store)
    touched: set[tuple[str, int]] = set()
    while pos + 8 <= end:
        mf = cl.files.find(pos)
        if mf is None:
            break
        rel = pos - mf.from_offset
        if rel + 8 > mf.file_size:
            pos = mf.from_offset + mf.file_size
            continue
        size, magic = _SIZE_MAGIC.unpack_from(mf.buffer, rel)
        if magic == codec.BLANK_MAGIC:
            if mf.wrote_position < mf.file_size:
                break  # the rest of the file has not arrived yet
            pos = mf.from_offset + mf.file_size
            continue
        if magic != codec.MAGIC or size < codec.FIXED_LEN:
            raise StoreCorruptedError(f"replicated bytes at {pos} are not a record")
        if pos + size > end:
            break
        m, _ = codec.decode_record(mf.buffer, rel, check_crc=False)  # type: ignore[arg-type]
        if m.commitlog_offset != pos:
            raise StoreCorruptedError(
                f"replicated record at {pos} claims offset {m.commitlog_offset}"
            )
        dispatcher.add(m)
        touched.add((m.topic, m.queue_id))
        pos += size
    dispatcher.flush()
    store._dispatched = pos
    return [(t, q, store._cqs[(t, q)].max_offset) for t, q in sorted(touched)]


def truncate(store: MessageStore, offset: int) -> None:
    """Cut the CommitLog (and the queue entries pointing past it) back to ``offset``.

    For a Raft follower dropping an uncommitted divergent tail, and for a slave
    promoted to master (cut to its last whole record).
    """
    with store._put_lock:
        store._check_open()
        cl = store.commitlog
        if not cl.min_offset <= offset <= cl.max_offset:
            raise OffsetOutOfRangeError(
                f"truncation point {offset} outside [{cl.min_offset}, {cl.max_offset}]"
            )
        if offset == cl.max_offset:
            return
        log.warning("truncating commitlog %s from %d to %d", store.root, cl.max_offset, offset)
        max_record = store.config.max_message_size + codec.FIXED_LEN + codec.MAX_TOPIC_LEN
        cl.truncate(offset, max_record + codec.MAX_PROPERTIES_LEN)
        for cq in store._cqs.values():
            cq.truncate_to_commitlog(offset)
        store._dispatched = min(store._dispatched, offset)
