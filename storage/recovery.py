"""Start-up recovery: bring CommitLog, ConsumeQueues and index back to their invariants.

* No ``abort`` file and a checkpoint with a clean end: trust it (after checking
  that nothing but zeros or a blank marker follows that end).
* Otherwise (a crash): scan the CommitLog from the start of the file holding the
  checkpoint's ``min(physic, logics)`` offset, checking size, magic, physical
  offset, lengths and body CRC of every record. Where the chain breaks:

  - if a valid record follows (in the same file, or in the next one), the
    damaged bytes are set aside (``storage.quarantine``: copied to
    ``quarantine/``, replaced by a filler record or the file's blank marker),
    logged as an error, and the scan goes on: good records are never dropped
    for a bad one before them; queue entries of the damaged records become holes;
  - if nothing valid follows (a crash's torn last write), the log ends there.

  Then drop ConsumeQueue entries that point past the end, and re-dispatch every
  record from the checkpoint's ``logics`` offset (entries already present are
  kept, filler records get none), and flush what was rebuilt.
"""

from __future__ import annotations

import logging
import struct
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from . import codec, quarantine, transaction
from .checkpoint import Checkpoint
from .commitlog import CommitLog
from .config import StoreConfig
from .consume_queue_store import ConsumeQueueStore
from .errors import StoreCorruptedError
from .index_file import IndexService
from .mapped_file import MappedFile
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
    damaged: list[tuple[int, int]] = []
    if end is None:
        start = max(cp.recovery_start, cl.min_offset) if cp is not None else cl.min_offset
        redispatch_from = max(cp.logics_offset, cl.min_offset) if cp is not None else cl.min_offset
        end, damaged = _scan(cl, config, start)
        first = cl.files.find(start)  # from where the scan began: its file's start
        torn = open_group_at(cl, first.from_offset if first is not None else start, end)
        if torn is not None:  # a one-phase commit the crash cut: none of it stays
            log.warning(
                "recovery: the commitlog ends in a one-phase commit cut short at %d: "
                "its records from %d are dropped (never acknowledged)",
                end,
                torn,
            )
            end = torn
    if cl.files.files and not queues.root.exists():
        log.warning("no consumequeue directory: rebuilding every queue from the commitlog")
        abnormal, redispatch_from = True, cl.min_offset
    if cl.files.files:
        cl.truncate(end, _max_record(config))
    queues.truncate_to_commitlog(end)
    if damaged:
        holes = queues.mark_holes(damaged)
        log.error("recovery: %d queue entries named damaged records: now holes", holes)
    if abnormal and redispatch_from < end:
        _redispatch(cl, queues, index, config, redispatch_from, end)
    queues.correct_min_offset(cl.min_offset)
    if abnormal:  # what was rebuilt is durable before a checkpoint says so
        queues.flush()
        index.flush()


def _max_record(config: StoreConfig) -> int:
    return (
        config.max_message_size + codec.FIXED_LEN + codec.MAX_TOPIC_LEN + codec.MAX_PROPERTIES_LEN
    )


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


def _scan(cl: CommitLog, config: StoreConfig, start: int) -> tuple[int, list[tuple[int, int]]]:
    """Walk the records from the file holding ``start``: (the valid end, the damaged
    spans set aside on the way)."""
    files = cl.files.files
    if not files:
        return 0, []
    start_file = cl.files.find(start) or files[0]
    total = cl.files.max_offset - start_file.from_offset
    began = time.monotonic()
    last_report = start_file.from_offset
    check_crc = config.check_crc_on_recover
    zero_run = _max_record(config) + (1 << 20)
    directory = Path(config.store_dir) / "quarantine"
    host = codec.host_to_bytes(config.store_host)
    damaged: list[tuple[int, int]] = []
    k, pos = files.index(start_file), 0
    while True:
        mf = files[k]
        pos, sealed = CommitLog.scan_file(mf, check_crc, pos)
        end = mf.from_offset + pos
        if end - last_report >= _PROGRESS_BYTES:
            last_report = end
            done = end - start_file.from_offset
            log.info(
                "recovery: scanned %d of %d MiB of commitlog (%.0f MB/s)",
                done >> 20,
                total >> 20,
                done / 1e6 / max(time.monotonic() - began, 1e-9),
            )
        if sealed:
            if k + 1 == len(files):
                end = mf.from_offset + mf.file_size
                break
            k, pos = k + 1, 0
            continue
        # the chain breaks at pos: the log's end, or damage with good records after it
        why = codec.stored_record_fault(mf.buffer, pos, end, mf.file_size, check_crc)
        valid = quarantine.next_valid(mf, pos + 1, check_crc, zero_run)
        while valid is not None and valid - pos < quarantine.MIN_FILLER and not _blank(mf, valid):
            valid = quarantine.next_valid(mf, valid + 1, check_crc, zero_run)  # too short
        if valid is not None and not _blank(mf, valid):
            saved = quarantine.replace_span(mf, pos, valid, directory, host)
            _report(mf, pos, valid, why, saved)
            damaged.append((end, mf.from_offset + valid))
            pos = valid
            continue
        later = k + 1 < len(files) and (
            quarantine.next_valid(files[k + 1], 0, check_crc, zero_run) is not None
        )
        if valid is not None or later:  # damage up to the file's end, records after it
            saved = quarantine.seal_at(mf, pos, directory, zero_run)
            _report(mf, pos, mf.file_size, why, saved)
            damaged.append((end, mf.from_offset + mf.file_size))
            if k + 1 == len(files):
                end = mf.from_offset + mf.file_size
                break
            k, pos = k + 1, 0
            continue
        if why is not None and not why.startswith("MAGIC=0x0"):
            log.warning("%s: the commitlog ends at %d: %s", mf.path.name, end, why)
        break
    log.info(
        "recovery: commitlog valid up to %d (scanned from %d in %.2fs)",
        end,
        start_file.from_offset,
        time.monotonic() - began,
    )
    return end, damaged


_SYSFLAG = struct.Struct(">i")


def open_group_at(cl: CommitLog, start: int, end: int) -> int | None:
    """Where the one-phase commit group that the records up to ``end`` end in begins,
    when its marker is missing (the crash cut the append short); None when the log does
    not end inside a group. Only a run of group members reaching ``end`` counts: a
    record outside a group (or a marker) after members closes the run, so nothing but
    an unfinished tail is ever cut."""
    open_at: int | None = None
    pos = start
    while pos < end:
        mf = cl.files.find(pos)
        if mf is None:
            break
        rel = pos - mf.from_offset
        if rel + 8 > mf.file_size:
            pos = mf.from_offset + mf.file_size
            continue
        size, magic = _SIZE_MAGIC.unpack_from(mf.buffer, rel)
        if magic == codec.BLANK_MAGIC or size < codec.FIXED_LEN:
            pos = mf.from_offset + mf.file_size
            continue
        role = transaction.group_role(_SYSFLAG.unpack_from(mf.buffer, rel + 36)[0])
        if role == transaction.GROUP_MEMBER:
            if open_at is None:
                open_at = pos
        else:
            open_at = None
        pos += size
    return open_at


def _blank(mf: MappedFile, pos: int) -> bool:
    return bool(_SIZE_MAGIC.unpack_from(mf.buffer, pos)[1] == codec.BLANK_MAGIC)


def _report(mf: MappedFile, pos: int, stop: int, why: str | None, saved: Path | None) -> None:
    base = mf.from_offset
    log.error(
        "recovery: commitlog bytes [%d, %d) are damaged (%s): set aside in %s; "
        "the records after them are kept",
        base + pos,
        base + stop,
        why or "zeros",
        saved if saved is not None else "nowhere (they were zeros)",
    )


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

    def add_entry_only(self, topic: str, queue_id: int, qoff: int, phys: int, size: int) -> None:
        """A queue entry (no tag, no keys) for a record whose properties do not decode."""
        self.queues[(topic, queue_id)].append((qoff, phys, size, 0))
        self.count += 1

    def flush(self) -> None:
        for (topic, qid), rows in self.queues.items():
            arr = np.array(rows, dtype=np.int64)
            self.consume_queues.find_or_create(topic, qid).append_dispatched(
                arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3]
            )
        self.queues.clear()
        if self.keys and self.config.message_index_enable:
            hashes = np.abs(codec.java_hashes(self.keys).astype(np.int64))
            hashes[hashes > 0x7FFFFFFF] = 0
            offsets = np.array(self.key_offsets, dtype=np.int64)
            # one index put per store timestamp keeps time diffs right
            self.index.put_stamped(hashes, offsets, np.array(self.key_ts, dtype=np.int64))
        self.keys, self.key_offsets, self.key_ts = [], [], []


_PREFIX = struct.Struct(">iIiiiq")  # size, magic, crc, queue id, flag, queue offset
_BODY_LEN = struct.Struct(">i")


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
        (body_len,) = _BODY_LEN.unpack_from(buf, rel + codec.OFF_BODYLEN)
        t = rel + codec.HEADER.size + body_len
        topic = buf[t + 1 : t + 1 + buf[t]].decode("ascii", "replace")
        if topic == quarantine.QUARANTINE_TOPIC:  # damaged bytes set aside: no entries
            pos += size
            continue
        if not codec.TOPIC_RE.fullmatch(topic) or qid < 0:
            log.error(
                "recovery: record at %d names topic %r queue %d: not dispatched", pos, topic, qid
            )
            pos += size
            continue
        need_cq = qoff >= cq_max.get((topic, qid), 0)
        need_index = pos > index_end
        if need_cq or need_index:
            try:
                m, _ = codec.decode_record(buf, rel, check_crc=False)  # type: ignore[arg-type]
            except StoreCorruptedError as exc:  # properties the body CRC does not cover
                log.error("recovery: record at %d: %s: queued without tags or keys", pos, exc)
                if need_cq:
                    dispatcher.add_entry_only(topic, qid, qoff, pos, size)
            else:
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
