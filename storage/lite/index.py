"""The lite queue index: one append-only sequence of fixed-size entries for every lite
topic of the store, in CommitLog order.

Entry ``e`` (a global number from 0) describes one lite message:

====== ===== ===========================================================
lid    u32   the lite topic's id (:mod:`storage.lite.names`)
gen    u32   the id's generation when written
loff   i64   the message's offset in its lite topic (0, 1, 2 ...)
phys   i64   its CommitLog offset
size   i32   its record's size (0 marks an entry never written)
ts     i64   its store time, epoch ms
prev   i64   the entry of offset ``loff - 1`` of the same lite topic, or -1
skip   i64   the entry of offset ``loff & (loff - 1)`` (``loff`` with its lowest set
             bit cleared), or -1
====== ===== ===========================================================

``prev`` and ``skip`` chain a lite topic's entries backwards from its last one (kept in
memory): seeking offset ``k`` from the last offset ``n`` takes skips while they do not
pass ``k`` and prev steps otherwise, O(log² (n - k)) entry reads, and a read of ``c``
messages then walks ``c`` prev steps. Entries sit in files of ``entries_per_file``
entries (56 bytes each), named by their first entry number; the oldest files are deleted
once every record they point at has left the CommitLog.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..errors import StoreCorruptedError

log = logging.getLogger("raymq.storage.lite.index")

ENTRY = np.dtype(
    [
        ("lid", "<u4"),
        ("gen", "<u4"),
        ("loff", "<i8"),
        ("phys", "<i8"),
        ("size", "<i4"),
        ("pad", "<i4"),
        ("ts", "<i8"),
        ("prev", "<i8"),
        ("skip", "<i8"),
    ]
)
assert ENTRY.itemsize == 56


class _File:
    __slots__ = ("path", "start", "arr", "prev", "skip", "loff", "phys", "size", "q")

    def __init__(self, path: Path, start: int, entries: int, create: bool) -> None:
        self.path = path
        self.start = start
        if create:
            with open(path, "wb") as f:
                f.truncate(entries * ENTRY.itemsize)  # sparse: pages appear as written
        self.arr = np.memmap(path, dtype=ENTRY, mode="r+", shape=(entries,))
        # column views, so one field of one entry is one array index
        self.prev = self.arr["prev"]
        self.skip = self.arr["skip"]
        self.loff = self.arr["loff"]
        self.phys = self.arr["phys"]
        self.size = self.arr["size"]
        # the file as int64 words, 7 an entry (lid | gen << 32, loff, phys, size, ts,
        # prev, skip): one word of one entry is one index, a Python int, no numpy scalar
        self.q = np.ndarray((entries * 7,), np.int64, self.arr.base, self.arr.offset).data


class LiteIndex:
    """The entry files of one store (``<store>/lite/index``)."""

    def __init__(self, directory: Path, entries_per_file: int) -> None:
        self.directory = directory
        self.per_file = entries_per_file
        directory.mkdir(parents=True, exist_ok=True)
        self.files: list[_File] = []
        self._flushed_files = 0  # files before this one are flushed and full
        expected = entries_per_file * ENTRY.itemsize
        for path in sorted(directory.iterdir()):
            if not path.name.isdigit():
                continue
            start = int(path.name)
            if path.stat().st_size != expected:
                raise StoreCorruptedError(
                    f"lite index file {path} holds {path.stat().st_size} bytes, not "
                    f"{expected} ({entries_per_file} entries of {ENTRY.itemsize}): was "
                    "lite_index_file_entries changed?"
                )
            if self.files and start != self.files[-1].start + entries_per_file:
                raise StoreCorruptedError(f"lite index file {path} does not follow the one before")
            self.files.append(_File(path, start, entries_per_file, create=False))
        self.end = self._find_end()

    def _find_end(self) -> int:
        """The entry after the last written one: the first never-written entry of the
        last file (entries are written in order)."""
        if not self.files:
            return 0
        last = self.files[-1]
        holes = np.flatnonzero(last.size == 0)
        end = last.start + (int(holes[0]) if len(holes) else self.per_file)
        if len(holes) and (last.size[int(holes[0]) :] != 0).any():
            self._zero_from(end)  # entries past a hole: a lost page (power cut); dropped
        return end

    @property
    def min_entry(self) -> int:
        """The first entry still held."""
        return self.files[0].start if self.files else self.end

    # ------------------------------------------------------------ write
    def append(self, rows: np.ndarray) -> int:
        """Write ``rows`` (``ENTRY``) as the next entries; return the first one's number."""
        first = self.end
        done = 0
        n = len(rows)
        while done < n:
            e = first + done
            f = self._file_for_write(e)
            slot = e - f.start
            k = min(n - done, self.per_file - slot)
            f.arr[slot : slot + k] = rows[done : done + k]
            done += k
        self.end = first + n
        return first

    def append_one(
        self, lid: int, gen: int, loff: int, phys: int, size: int, ts: int, prev: int, skip: int
    ) -> int:
        """:meth:`append` of one entry, written as words (the single put's path)."""
        e = self.end
        f = self.files[-1] if self.files else None
        if f is None or e >= f.start + self.per_file:
            f = self._file_for_write(e)
        w = (e - f.start) * 7
        q = f.q
        q[w] = lid | gen << 32
        q[w + 1] = loff
        q[w + 2] = phys
        q[w + 3] = size
        q[w + 4] = ts
        q[w + 5] = prev
        q[w + 6] = skip
        self.end = e + 1
        return e

    def _file_for_write(self, e: int) -> _File:
        if self.files and e < self.files[-1].start + self.per_file:
            return self.files[-1]
        start = self.files[-1].start + self.per_file if self.files else e
        path = self.directory / f"{start:020d}"
        f = _File(path, start, self.per_file, create=True)
        self.files.append(f)
        return f

    def truncate(self, end: int) -> None:
        """Drop every entry from ``end`` on (their records left the CommitLog's end)."""
        if end >= self.end:
            return
        self._zero_from(end)
        while self.files and self.files[-1].start >= end and self.files[-1].start > 0:
            f = self.files.pop()
            f.q.release()
            del f.arr
            f.path.unlink(missing_ok=True)
        self.end = end

    def _zero_from(self, end: int) -> None:
        for f in self.files:
            if f.start + self.per_file > end:
                f.arr[max(0, end - f.start) :] = np.zeros(1, dtype=ENTRY)

    # ------------------------------------------------------------ read
    def file_of(self, e: int) -> _File | None:
        if not self.files or e < 0 or e >= self.end:
            return None
        i = (e - self.files[0].start) // self.per_file
        return self.files[i] if i >= 0 else None

    def written(self) -> list[tuple[int, np.ndarray]]:
        """Each file's written entries: (first entry number, entries)."""
        out = []
        for f in self.files:
            n = min(self.per_file, self.end - f.start)
            if n > 0:
                out.append((f.start, f.arr[:n]))
        return out

    # ------------------------------------------------------------ upkeep
    def flush(self) -> None:
        """Write the entries to disk (every file not known flushed and full)."""
        for i in range(self._flushed_files, len(self.files)):
            self.files[i].arr.flush()
        full = len(self.files) - 1 if self.files else 0
        self._flushed_files = max(self._flushed_files, full)

    def delete_below(self, commitlog_min: int) -> int:
        """Delete the oldest files whose every entry points below ``commitlog_min`` (the
        file being written is kept); return how many went."""
        deleted = 0
        while len(self.files) > 1:
            f = self.files[0]
            if int(f.phys[-1]) + int(f.size[-1]) > commitlog_min:
                break
            self.files.pop(0)
            self._flushed_files = max(0, self._flushed_files - 1)
            f.q.release()
            del f.arr
            f.path.unlink(missing_ok=True)
            deleted += 1
            log.info("deleted lite index file %s (its records left the commitlog)", f.path.name)
        return deleted

    def close(self) -> None:
        self.flush()
        for f in self.files:
            f.q.release()
        self.files.clear()


def count_files(directory: Path) -> int:
    return sum(1 for p in directory.iterdir() if p.name.isdigit()) if directory.exists() else 0


__all__ = ["ENTRY", "LiteIndex", "count_files"]
