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

import numpy as np

from . import codec
from .checkpoint import Checkpoint
from .commitlog import CommitLog
from .config import StoreConfig
from .consume_queue_store import ConsumeQueueStore
from .errors import StoreCorruptedError
from .index_file import IndexService
from .message import MessageExt
from .schedule import SCHEDULE_TOPIC

log = logging.getLogger("raymq.storage.recovery")

_SIZE_MAGIC = struct.Struct(">iI")
_PROGRESS_BYTES = 256 << 20


def recover(
    *,
    commitlog: CommitLog,
    queues: ConsumeQueueStore,
    index: IndexService,
    config: StoreConfig,
    checkpoint: Checkpoint | None,
    abnormal_start: bool,
) -> None:
    """Load the files and restore the invariants; ``checkpoint`` is the last valid one."""
    cl = commitlog
    cl.files.load()
    queues.load(cl.min_offset)
    index.load()
    cp = checkpoint
    end: int | None = None
    if not abnormal_start and cp is not None and cp.clean_end >= 0:
        end = _verified_clean_end(cl, cp.clean_end)
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
        end = _scan(cl, config, start)
    if cl.files.files and not queues.root.exists():
        log.warning("no consumequeue directory: rebuilding every queue from the commitlog")
        abnormal, redispatch_from = True, cl.min_offset
    max_record = (
        config.max_message_size + codec.FIXED_LEN + codec.MAX_TOPIC_LEN + codec.MAX_PROPERTIES_LEN
    )
    if cl.files.files:
        cl.truncate(end, max_record)
    queues.truncate_to_commitlog(end)
    if abnormal and redispatch_from < end:
        _redispatch(cl, queues, index, config, redispatch_from, end)
    queues.correct_min_offset(cl.min_offset)


def _verified_clean_end(cl: CommitLog, end: int) -> int | None:
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


def _scan(cl: CommitLog, config: StoreConfig, start: int) -> int:
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

    end = cl.scan(start_file, config.check_crc_on_recover, progress=progress)
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

    def __init__(self, queues: ConsumeQueueStore, index: IndexService, config: StoreConfig) -> None:
        self.consume_queues = queues
        self.index = index
        self.config = config
        self.queues: dict[tuple[str, int], list[tuple[int, int, int, int]]] = defaultdict(list)
        self.keys: list[str] = []
        self.key_offsets: list[int] = []
        self.key_ts: list[int] = []
        self.count = 0
        self._tag_cache: dict[str | None, int] = {None: 0}

    def add(self, m: MessageExt, cq: bool = True, index: bool = True) -> None:
        if cq:
            tags = m.tags
            code = self._tag_cache.get(tags)
            if code is None:
                code = self._tag_cache[tags] = codec.java_hash(tags) if tags else 0
            if m.topic == SCHEDULE_TOPIC:  # the tag field holds the delivery time
                levels = self.config.delay_levels_ms
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
            self.consume_queues.find_or_create(topic, qid).append(
                int(arr[0, 0]), arr[:, 1], arr[:, 2], arr[:, 3]
            )
        self.queues.clear()
        if self.keys and self.config.message_index_enable:
            hashes = np.abs(codec.java_hashes(self.keys).astype(np.int64))
            hashes[hashes > 0x7FFFFFFF] = 0
            offsets = np.array(self.key_offsets, dtype=np.int64)
            ts = np.array(self.key_ts, dtype=np.int64)
            # one index put per distinct store timestamp keeps time diffs right
            for value in np.unique(ts).tolist():
                sel = ts == value
                self.index.put(hashes[sel], offsets[sel], int(value))
        self.keys, self.key_offsets, self.key_ts = [], [], []


_PREFIX = struct.Struct(">iIiiiq")  # size, magic, crc, queue id, flag, queue offset


def _redispatch(
    cl: CommitLog,
    queues: ConsumeQueueStore,
    index: IndexService,
    config: StoreConfig,
    start: int,
    end: int,
) -> None:
    """Re-add ConsumeQueue and index entries for records from ``start`` that lack them.

    Only the header is parsed for records already dispatched; a record is
    decoded in full only when its queue or the index is missing it.
    """
    dispatcher = _Dispatcher(queues, index, config)
    index_end = index.files[-1].end_offset if index.files else -1
    cq_max: dict[tuple[str, int], int] = {k: cq.max_offset for k, cq in queues.items()}
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
