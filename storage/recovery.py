"""Start-up recovery: bring CommitLog, ConsumeQueues and index back to their invariants.

* No ``abort`` file and a checkpoint with a clean end: trust it (after checking
  that nothing but zeros or a blank marker follows that end).
* Otherwise (a crash): scan the CommitLog from the start of the file holding the
  checkpoint's ``min(physic, logics)`` offset, checking size, magic, physical
  offset and body CRC of every record; truncate at the first bad one; drop
  ConsumeQueue entries that point past the end; re-dispatch every record from
  the checkpoint's ``logics`` offset (entries already present are kept).
"""

from __future__ import annotations

import logging
import struct
import time
from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np

from . import codec
from .consume_queue import ConsumeQueue
from .errors import StoreCorruptedError
from .schedule import SCHEDULE_TOPIC

if TYPE_CHECKING:
    from .store import MessageStore

log = logging.getLogger("raymq.storage.recovery")

_SIZE_MAGIC = struct.Struct(">iI")
_PROGRESS_BYTES = 256 << 20


def recover(store: MessageStore) -> None:
    cl = store.commitlog
    cl.files.load()
    _load_consume_queues(store)
    store.index.load()
    cp = store._checkpoint.value if store._checkpoint and store._checkpoint.valid else None
    end: int | None = None
    if not store.abnormal_start and cp is not None and cp.clean_end >= 0:
        end = _verified_clean_end(store, cp.clean_end)
        if end is None:
            log.warning(
                "checkpoint's clean end %d does not match the commitlog: full recovery",
                cp.clean_end,
            )
    abnormal = end is None
    redispatch_from = cl.min_offset
    if end is None:
        start = max(cp.recovery_start, cl.min_offset) if cp is not None else cl.min_offset
        redispatch_from = max(cp.logics_offset, cl.min_offset) if cp is not None else cl.min_offset
        end = _scan(store, start)
    if cl.files.files and not (store.root / "consumequeue").exists():
        log.warning("no consumequeue directory: rebuilding every queue from the commitlog")
        abnormal, redispatch_from = True, cl.min_offset
    max_record = (
        store.config.max_message_size
        + codec.FIXED_LEN
        + codec.MAX_TOPIC_LEN
        + codec.MAX_PROPERTIES_LEN
    )
    if cl.files.files:
        cl.truncate(end, max_record)
    for cq in store._cqs.values():
        cq.truncate_to_commitlog(end)
    if abnormal and redispatch_from < end:
        _redispatch(store, redispatch_from, end)
    for cq in store._cqs.values():
        cq.correct_min_offset(cl.min_offset)


def _load_consume_queues(store: MessageStore) -> None:
    root = store.root / "consumequeue"
    if not root.exists():
        return
    for topic_dir in sorted(root.iterdir()):
        if not topic_dir.is_dir() or not codec.TOPIC_RE.fullmatch(topic_dir.name):
            log.warning("ignoring %s: not a topic directory", topic_dir)
            continue
        for qdir in sorted(topic_dir.iterdir()):
            if not qdir.is_dir() or not qdir.name.isdigit():
                log.warning("ignoring %s: not a queue directory", qdir)
                continue
            cq = ConsumeQueue(
                root,
                topic_dir.name,
                int(qdir.name),
                store.config.consume_queue_file_entries,
                preallocate=store.config.preallocate,
            )
            cq.load(store.commitlog.min_offset)
            store._cqs[(topic_dir.name, int(qdir.name))] = cq


def _verified_clean_end(store: MessageStore, end: int) -> int | None:
    cl = store.commitlog
    if not cl.files.files:
        return end if end == 0 else None
    if end == cl.files.max_offset:
        return end
    mf = cl.files.find(end)
    if mf is None:
        return None
    rel = end - mf.from_offset
    if rel + 8 > mf.file_size:
        return end
    size, magic = _SIZE_MAGIC.unpack_from(mf.buffer, rel)
    if (size, magic) == (0, 0) or magic == codec.BLANK_MAGIC:
        return end
    return None


def _scan(store: MessageStore, start: int) -> int:
    cl = store.commitlog
    if not cl.files.files:
        return 0
    start_file = cl.files.find(start) or cl.files.files[0]
    total = cl.files.max_offset - start_file.from_offset
    began = time.monotonic()
    last_report = [start_file.from_offset]

    def progress(offset: int) -> None:
        if offset - last_report[0] >= _PROGRESS_BYTES:
            last_report[0] = offset
            done = offset - start_file.from_offset
            log.info(
                "recovery: scanned %d of %d MiB of commitlog (%.0f MB/s)",
                done >> 20,
                total >> 20,
                done / 1e6 / max(time.monotonic() - began, 1e-9),
            )

    end = cl.scan(start_file, store.config.check_crc_on_recover, progress=progress)
    log.info(
        "recovery: commitlog valid up to %d (scanned from %d in %.2fs)",
        end,
        start_file.from_offset,
        time.monotonic() - began,
    )
    return end


class _Dispatcher:
    """Accumulates re-dispatched records and writes them in vectorised chunks."""

    CHUNK = 65536

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.queues: dict[tuple[str, int], list[tuple[int, int, int, int]]] = defaultdict(list)
        self.keys: list[str] = []
        self.key_offsets: list[int] = []
        self.key_ts: list[int] = []
        self.count = 0
        self._tag_cache: dict[str | None, int] = {None: 0}

    def add(self, m: codec.MessageExt, cq: bool = True, index: bool = True) -> None:
        if cq:
            tags = m.tags
            code = self._tag_cache.get(tags)
            if code is None:
                code = self._tag_cache[tags] = codec.java_hash(tags) if tags else 0
            if m.topic == SCHEDULE_TOPIC:  # the tag field holds the delivery time
                levels = self.store.config.delay_levels_ms
                code = m.store_timestamp + levels[min(max(m.delay_level, 1), len(levels)) - 1]
            self.queues[(m.topic, m.queue_id)].append(
                (m.queue_offset, m.commitlog_offset, m.store_size, code)
            )
        if index:
            uk = m.properties.get(codec.PROP_UNIQ_KEY)
            for key in (*m.keys, uk) if uk else m.keys:
                self.keys.append(f"{m.topic}#{key}")
                self.key_offsets.append(m.commitlog_offset)
                self.key_ts.append(m.store_timestamp)
        self.count += 1
        if self.count % self.CHUNK == 0:
            self.flush()

    def flush(self) -> None:
        for (topic, qid), rows in self.queues.items():
            arr = np.array(rows, dtype=np.int64)
            self.store._cq(topic, qid).append(int(arr[0, 0]), arr[:, 1], arr[:, 2], arr[:, 3])
        self.queues.clear()
        if self.keys and self.store.config.message_index_enable:
            hashes = np.abs(codec.java_hashes(self.keys).astype(np.int64))
            hashes[hashes > 0x7FFFFFFF] = 0
            offsets = np.array(self.key_offsets, dtype=np.int64)
            ts = np.array(self.key_ts, dtype=np.int64)
            # one index put per distinct store timestamp keeps time diffs right
            for value in np.unique(ts).tolist():
                sel = ts == value
                self.store.index.put(hashes[sel], offsets[sel], int(value))
        self.keys, self.key_offsets, self.key_ts = [], [], []


_PREFIX = struct.Struct(">iIiiiq")  # size, magic, crc, queue id, flag, queue offset


def _redispatch(store: MessageStore, start: int, end: int) -> None:
    """Re-add ConsumeQueue and index entries for records from ``start`` that lack them.

    Only the header is parsed for records already dispatched; a record is
    decoded in full only when its queue or the index is missing it.
    """
    cl = store.commitlog
    dispatcher = _Dispatcher(store)
    index_end = store.index.files[-1].end_offset if store.index.files else -1
    cq_max: dict[tuple[str, int], int] = {k: cq.max_offset for k, cq in store._cqs.items()}
    skipped = 0
    pos = start
    while pos < end:
        mf = cl.files.find(pos)
        if mf is None:
            raise StoreCorruptedError(f"recovery: no commitlog file holds offset {pos}")
        rel = pos - mf.from_offset
        if rel + 8 > mf.file_size:
            pos = mf.from_offset + mf.file_size
            continue
        buf = mf.buffer
        size, magic = _SIZE_MAGIC.unpack_from(buf, rel)
        if magic == codec.BLANK_MAGIC:
            pos = mf.from_offset + mf.file_size
            continue
        size, magic, _crc, qid, _flag, qoff = _PREFIX.unpack_from(buf, rel)
        body_len = int.from_bytes(buf[rel + codec.OFF_BODYLEN : rel + codec.HEADER.size], "big")
        t = rel + codec.HEADER.size + body_len
        topic = buf[t + 1 : t + 1 + buf[t]].decode("ascii")
        need_cq = qoff >= cq_max.get((topic, qid), 0)
        need_index = pos > index_end
        if need_cq or need_index:
            m, _ = codec.decode_record(buf, rel, check_crc=False)  # type: ignore[arg-type]
            dispatcher.add(m, need_cq, need_index)
            if need_cq:
                cq_max[(topic, qid)] = qoff + 1
        else:
            skipped += 1
        pos += size
    dispatcher.flush()
    log.info(
        "recovery: re-dispatched %d records from commitlog offset %d (%d already there)",
        dispatcher.count,
        start,
        skipped,
    )
