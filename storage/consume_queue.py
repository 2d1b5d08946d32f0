"""ConsumeQueue: the per-(topic, queue) index into the CommitLog.

``consumequeue/<topic>/<queueId>/<20-digit byte offset>``; each entry is 20
bytes, ``commitlog offset i8 | size i4 | tags hash i8``, and entry ``n`` (the
message at queue offset ``n``) lives at byte ``20 * n``.

Invariants: entries are dense from ``min_offset`` to ``max_offset`` (the next
queue offset); commitlog offsets never decrease along the queue; no entry
points past the CommitLog's end (recovery drops those, :meth:`truncate_to_commitlog`).

A *hole* is an entry of size 0 (tag :data:`HOLE_TAG`): its record was damaged
on disk and set aside by recovery (``storage.quarantine``), so it keeps its
queue offset (consumers' offsets keep their meaning) and is never served. A
hole's commitlog offset is the damaged record's, or, for a record whose entry
was lost too, the offset of the entry after it.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import numpy as np

from . import record
from .errors import StoreCorruptedError
from .mapped_file import MappedFileQueue

log = logging.getLogger("raymq.storage.consume_queue")

ENTRY = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tag", ">i8")])


def _first_live(mf: object, count: int, commitlog_min: int) -> int | None:
    """The index of the first of a file's ``count`` entries whose message is still in the
    CommitLog, or None. Read in place, not copied (a file is 6 MB, and expiry asks this of
    every queue while writes wait); the view is gone when this returns, before the file
    can be unmapped."""
    view = np.frombuffer(mf.buffer, dtype=ENTRY, count=count)  # type: ignore[attr-defined]
    live = np.flatnonzero((view["offset"] >= commitlog_min) & (view["size"] > 0))
    del view
    return int(live[0]) if len(live) else None


UNIT = ENTRY.itemsize
_ENTRY = struct.Struct(">qiq")
assert UNIT == 20
HOLE_TAG = -1  # with size 0: never all zeros, so a trailing hole is still an entry


def _used(entries: np.ndarray) -> np.ndarray:
    """Which entries were written: a never-written one is all zeros."""
    return (entries["size"] != 0) | (entries["tag"] != 0) | (entries["offset"] != 0)


class ConsumeQueue:
    def __init__(
        self,
        root: Path,
        topic: str,
        queue_id: int,
        entries_per_file: int,
        *,
        preallocate: bool = True,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.files = MappedFileQueue(
            root / topic / str(queue_id), entries_per_file * UNIT, preallocate=preallocate
        )
        self.min_logic_offset = 0  # byte offset of the first live entry

    # -- offsets (in messages)
    @property
    def min_offset(self) -> int:
        return max(self.min_logic_offset, self.files.min_offset) // UNIT

    @property
    def max_offset(self) -> int:
        return self.files.max_offset // UNIT

    # -- load and recovery
    def load(self, commitlog_min: int) -> None:
        """Map the files, find the write position and the first live entry."""
        self.files.load()
        if not self.files.files:
            return
        # the write position: just past the last written entry
        for mf in reversed(self.files.files):
            used_idx = np.flatnonzero(_used(self._entries_of(mf, 0, mf.file_size // UNIT)))
            used = int(used_idx[-1]) + 1 if len(used_idx) else 0
            mf.wrote_position = mf.flushed_position = used * UNIT
            if used > 0 or mf is self.files.files[0]:
                break
        # drop trailing files that turned out empty (never written before a crash)
        while len(self.files.files) > 1 and self.files.files[-1].wrote_position == 0:
            self.files.files.pop().destroy()
        self.correct_min_offset(commitlog_min)

    def correct_min_offset(self, commitlog_min: int) -> None:
        """Skip entries whose messages expired with their CommitLog file."""
        for mf in self.files.files:
            first = _first_live(mf, mf.wrote_position // UNIT, commitlog_min)
            if first is not None:
                self.min_logic_offset = mf.from_offset + first * UNIT
                return
        self.min_logic_offset = self.files.max_offset

    def truncate_to_commitlog(self, commitlog_end: int) -> int:
        """Drop entries pointing at or past ``commitlog_end``; return how many."""
        dropped = 0
        while self.files.files:
            mf = self.files.files[-1]
            count = mf.wrote_position // UNIT
            entries = self._entries_of(mf, 0, count)
            ends = entries["offset"].astype(np.int64) + entries["size"]
            bad = np.flatnonzero(ends > commitlog_end)
            if not len(bad):
                break
            first_bad = int(bad[0])
            dropped += count - first_bad
            self.files.truncate(mf.from_offset + first_bad * UNIT)
            if first_bad > 0 or len(self.files.files) == 1:
                break
            self.files.files.pop().destroy()
        if dropped:
            log.warning(
                "%s/%d: dropped %d entries past the commitlog end %d",
                self.topic,
                self.queue_id,
                dropped,
                commitlog_end,
            )
        return dropped

    # -- write
    def append(
        self, queue_offset: int, phys: np.ndarray, sizes: np.ndarray, tags: np.ndarray
    ) -> None:
        """Write entries for queue offsets ``queue_offset ..`` (dense, in order)."""
        n = len(phys)
        cur = self.max_offset
        if queue_offset < cur:  # re-dispatch after a crash: keep what is there
            skip = cur - queue_offset
            if skip >= n:
                return
            phys, sizes, tags = phys[skip:], sizes[skip:], tags[skip:]
            queue_offset, n = cur, n - skip
        if queue_offset > cur:
            if self.files.files and cur > self.min_offset:
                raise StoreCorruptedError(
                    f"consume queue {self.topic}/{self.queue_id}: gap from {cur} to {queue_offset}"
                )
            self.files.reset_empty(queue_offset * UNIT)
            self.min_logic_offset = queue_offset * UNIT
        if n <= record.SMALL_BATCH:  # struct beats numpy's per-call cost for a few entries
            packed = map(_ENTRY.pack, phys.tolist(), sizes.tolist(), tags.tolist())
            raw = memoryview(b"".join(packed))
        else:
            entries = np.empty(n, dtype=ENTRY)
            entries["offset"] = phys
            entries["size"] = sizes
            entries["tag"] = tags
            raw = memoryview(entries.tobytes())
        pos = 0
        total = len(raw)
        while pos < total:
            mf = self.files.last_writable(queue_offset * UNIT)
            take = min(mf.remaining, total - pos)
            mf.append(raw[pos : pos + take])
            pos += take

    def append_one(self, queue_offset: int, phys: int, size: int, tag: int) -> None:
        """:meth:`append` of one entry in plain ints (a single send's)."""
        files = self.files.files
        if files:  # the usual entry: next in the last file, which has room for it
            last = files[-1]
            pos = last.wrote_position
            if last.from_offset + pos == queue_offset * UNIT and pos + UNIT <= last.file_size:
                last.append(_ENTRY.pack(phys, size, tag))
                return
        if queue_offset != self.max_offset:  # a gap or a re-dispatch: as append decides
            self.append(
                queue_offset,
                np.array([phys], dtype=np.int64),
                np.array([size], dtype=np.int32),
                np.array([tag], dtype=np.int64),
            )
            return
        self.files.last_writable(queue_offset * UNIT).append(_ENTRY.pack(phys, size, tag))

    def reserve_next(self) -> int:
        """The queue offset of the next entry, the file it goes into allocated now
        (:meth:`reserve` of one entry at :attr:`max_offset`)."""
        files = self.files.files
        if files:  # the usual entry: the last file has room for it
            last = files[-1]
            pos = last.wrote_position
            if pos + UNIT <= last.file_size:
                return (last.from_offset + pos) // UNIT
        base = self.max_offset
        self.reserve(base, 1)
        return base

    def reserve(self, queue_offset: int, count: int) -> None:
        """Allocate now the files ``count`` entries from ``queue_offset`` need (see
        ``MappedFileQueue.reserve``): a put reserves before it writes anything."""
        self.files.reserve(queue_offset * UNIT, (queue_offset + count) * UNIT)

    def append_dispatched(
        self, queue_offsets: np.ndarray, phys: np.ndarray, sizes: np.ndarray, tags: np.ndarray
    ) -> int:
        """Entries for records found walking the CommitLog (recovery, a slave), in
        CommitLog order. Those already here are kept; queue offsets the walk did not
        find (their records were set aside as damaged) become holes. Returns how
        many holes were written."""
        cur = self.max_offset
        keep = queue_offsets >= cur
        if not keep.all():
            queue_offsets, phys, sizes, tags = (
                queue_offsets[keep],
                phys[keep],
                sizes[keep],
                tags[keep],
            )
        if not len(queue_offsets):
            return 0
        first = int(queue_offsets[0])
        if first > cur and (not self.files.files or cur <= self.min_offset):
            cur = first  # an empty queue (or one whose entries all expired) starts here
        span = int(queue_offsets[-1]) - cur + 1
        if span == len(queue_offsets):
            self.append(cur, phys, sizes, tags)
            return 0
        if span < len(queue_offsets) or bool((np.diff(queue_offsets) <= 0).any()):
            raise StoreCorruptedError(
                f"consume queue {self.topic}/{self.queue_id}: queue offsets out of order "
                f"in the commitlog ({queue_offsets[:8].tolist()} ...)"
            )
        at = queue_offsets - cur
        full_phys = np.empty(span, dtype=np.int64)
        full_phys[at] = phys
        present = np.zeros(span, dtype=bool)
        present[at] = True
        # a hole takes the commitlog offset of the entry after it: offsets never decrease
        nxt = np.minimum.accumulate(np.where(present, full_phys, np.iinfo(np.int64).max)[::-1])
        full_phys = np.where(present, full_phys, nxt[::-1])
        full_sizes = np.zeros(span, dtype=np.int64)
        full_sizes[at] = sizes
        full_tags = np.full(span, HOLE_TAG, dtype=np.int64)
        full_tags[at] = tags
        holes = span - len(queue_offsets)
        log.error(
            "%s/%d: %d queue offsets in [%d, %d] have no record in the commitlog (set aside "
            "as damaged): kept as holes, never served",
            self.topic,
            self.queue_id,
            holes,
            cur,
            cur + span - 1,
        )
        self.append(cur, full_phys, full_sizes, full_tags)
        return holes

    def mark_holes(self, spans: list[tuple[int, int]]) -> int:
        """Turn entries whose record starts in one of ``spans`` (commitlog offsets
        ``[start, end)`` set aside as damaged) into holes; return how many."""
        marked = 0
        for mf in self.files.files:
            count = mf.wrote_position // UNIT
            if not count:
                continue
            entries = np.frombuffer(mf.buffer, dtype=ENTRY, count=count)
            hit = np.zeros(count, dtype=bool)
            for start, end in spans:
                hit |= (entries["offset"] >= start) & (entries["offset"] < end)
            hit &= entries["size"] != 0
            rows = np.flatnonzero(hit).tolist()
            for i in rows:
                mf.write_at(i * UNIT, _ENTRY.pack(int(entries["offset"][i]), 0, HOLE_TAG))
            del entries
            if rows:
                mf.sync(0, count * UNIT)
                marked += len(rows)
        return marked

    # -- read
    def _entries_of(self, mf: object, first: int, count: int) -> np.ndarray:
        buf = mf.buffer  # type: ignore[attr-defined]
        return np.frombuffer(buf, dtype=ENTRY, count=count, offset=first * UNIT).copy()

    def read(self, offset: int, max_count: int) -> np.ndarray:
        """Up to ``max_count`` entries from queue offset ``offset`` (within one file)."""
        byte = offset * UNIT
        mf = self.files.find(byte)
        if mf is None:
            return np.empty(0, dtype=ENTRY)
        rel = (byte - mf.from_offset) // UNIT
        count = min(max_count, mf.wrote_position // UNIT - rel)
        if count <= 0:
            return np.empty(0, dtype=ENTRY)
        try:
            return self._entries_of(mf, rel, count)
        except ValueError:  # the file was deleted under us by expiry
            return np.empty(0, dtype=ENTRY)

    def read_few(self, offset: int, max_count: int) -> list[tuple[int, int, int]]:
        """:meth:`read` of a few entries (at most ``record.SMALL_BATCH``) as
        ``(commitlog offset, size, tag code)`` tuples: a held pull's answer reads one or
        two, for which a structured array costs more than the entries."""
        byte = offset * UNIT
        mf = self.files.find(byte)
        if mf is None:
            return []
        rel = byte - mf.from_offset
        count = min(max_count, (mf.wrote_position - rel) // UNIT)
        if count <= 0:
            return []
        try:
            return list(_ENTRY.iter_unpack(mf.buffer[rel : rel + count * UNIT]))
        except ValueError:  # the file was deleted under us by expiry
            return []

    def entry(self, offset: int) -> tuple[int, int, int] | None:
        e = self.read(offset, 1)
        if not len(e):
            return None
        return int(e["offset"][0]), int(e["size"][0]), int(e["tag"][0])

    # -- upkeep
    def flush(self, least_pages: int = 0) -> int | None:
        """Flush the files with at least ``least_pages`` dirty pages (0: every file with
        unflushed entries). Returns the commitlog offset named by the first entry still
        unflushed (what a checkpoint may not claim), or None when all are durable."""
        self.files.flush(least_pages)
        for mf in self.files.files:
            if mf.wrote_position > mf.flushed_position:
                entry = self._entries_of(mf, mf.flushed_position // UNIT, 1)
                return int(entry["offset"][0])
        return None

    def delete_expired(self, commitlog_min: int) -> int:
        """Delete files whose every entry points below ``commitlog_min``."""
        count = 0
        for mf in self.files.files[:-1]:
            n = mf.wrote_position // UNIT  # its last entry names its highest offset
            if n and int(self._entries_of(mf, n - 1, 1)["offset"][0]) < commitlog_min:
                count += 1
            else:
                break
        if count:
            self.files.delete_first(count)
        self.correct_min_offset(commitlog_min)
        return count

    def close(self) -> None:
        self.files.close()
