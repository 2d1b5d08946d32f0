"""IndexFile: a hash index from ``topic#key`` to CommitLog offsets.

Layout: a 40-byte header ``begin ts i8 | end ts i8 | begin offset i8 |
end offset i8 | slots used i4 | index count i4``, then ``slots`` slots of i4
(the number of the newest entry for that slot, 0 = none), then entries of 20
bytes ``key hash i4 | commitlog offset i8 | time diff s i4 | previous entry i4``,
numbered from 1. Entries of one slot form a list, newest first.

Invariants: an entry's ``previous`` is 0 or a smaller entry number of the same
slot; ``index count`` counts the entries written plus one; a put writes its
entries, then its slots, then the header, and opening a file follows any slot
left past the count by a crash back to a counted entry. An entry may point
at a record that was later truncated or expired: readers must check the record
(``MessageStore.query_by_key`` does), so a stale entry can never serve a wrong
message.
"""

from __future__ import annotations

import logging
import operator
import struct
import time
from pathlib import Path

import numpy as np

from . import record
from .errors import DiskFullError
from .mapped_file import MappedFile, drop_if_empty

log = logging.getLogger("raymq.storage.index_file")

HEADER = struct.Struct(">qqqqii")
HEADER_FIELDS = ("begin_ts", "end_ts", "begin_offset", "end_offset", "slot_count", "index_count")
"""The header's fields in ``HEADER``'s order: an :class:`IndexFile`'s attributes of those
names are read from it on open and written back by ``_write_header``."""
_header_values = operator.attrgetter(*HEADER_FIELDS)
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 40
ENTRY = np.dtype([("hash", ">i4"), ("offset", ">i8"), ("diff", ">i4"), ("prev", ">i4")])
ENTRY_SIZE = ENTRY.itemsize
_ENTRY = struct.Struct(">iqii")
_SLOT = struct.Struct(">i")
_INT_MAX = 0x7FFFFFFF


class IndexFile:
    begin_ts = end_ts = begin_offset = end_offset = slot_count = index_count = 0  # HEADER_FIELDS

    def __init__(
        self, path: Path, slots: int, max_entries: int, *, create: bool, preallocate: bool = True
    ) -> None:
        self.slots = slots
        self.max_entries = max_entries
        self.size = HEADER_SIZE + slots * 4 + max_entries * ENTRY_SIZE
        self.file = MappedFile(path, self.size, create=create, preallocate=preallocate)
        for name, value in zip(HEADER_FIELDS, HEADER.unpack_from(self.file.buffer, 0)):
            setattr(self, name, value)
        if self.index_count <= 0:
            self.index_count = 1
        self._slot_table = np.frombuffer(
            self.file.buffer, dtype=">i4", count=slots, offset=HEADER_SIZE
        )
        self.dirty = False
        if not create:
            self._repair_stale_heads()

    @property
    def path(self) -> Path:
        return self.file.path

    @property
    def is_full(self) -> bool:
        return self.index_count >= self.max_entries

    def _entry_pos(self, number: int) -> int:
        return HEADER_SIZE + self.slots * 4 + number * ENTRY_SIZE

    def put(self, hashes: np.ndarray, offsets: np.ndarray, store_ts: int) -> int:
        """Add entries (positive key hashes, commitlog offsets); return how many fit.

        Each entry becomes the head of its slot and points at the previous head.
        Writes go entries, then slots, then the header, so a crash anywhere leaves
        every slot either as it was or pointing at an entry that was written (and
        that points back at the slot's old head): :meth:`_repair_stale_heads`
        follows those back when the file is opened again.
        """
        n = min(len(hashes), self.max_entries - self.index_count)
        if n <= 0:
            return 0
        diff = self.time_diff(store_ts, int(offsets[0]))
        if n <= record.SMALL_BATCH:
            self._link_few(hashes[:n].tolist(), offsets[:n].tolist(), diff)
        else:
            self._link_many(hashes[:n].astype(np.int64), offsets[:n].astype(np.int64), diff)
        self._added(n, store_ts, int(offsets[n - 1]))
        return n

    def put_at(self, hashes: list[int], offset: int, store_ts: int) -> int:
        """:meth:`put` of one record's keys (all at CommitLog ``offset``), in plain ints:
        a single send's, with no array made for a key or two."""
        n = min(len(hashes), self.max_entries - self.index_count)
        if n <= 0:
            return 0
        self._link_few(hashes[:n], [offset] * n, self.time_diff(store_ts, offset))
        self._added(n, store_ts, offset)
        return n

    def put_one(self, key_hash: int, offset: int, store_ts: int) -> int:
        """:meth:`put_at` of a single key (a message's unique key alone): 1 when it fit,
        0 when the file is full. The same entry, slot and header writes, in that order."""
        number = self.index_count
        if number >= self.max_entries:
            return 0
        diff = self.time_diff(store_ts, offset)
        at = HEADER_SIZE + 4 * (key_hash % self.slots)
        buf = self.file.buffer
        prev = _SLOT.unpack_from(buf, at)[0]
        if not 0 < prev < number:  # as _head: empty, or not a written entry
            prev = 0
            self.slot_count += 1
        self.file.write_at(self._entry_pos(number), _ENTRY.pack(key_hash, offset, diff, prev))
        _SLOT.pack_into(buf, at, number)
        self._added(1, store_ts, offset)
        return 1

    def time_diff(self, store_ts: int, first_offset: int) -> int:
        """The entries' time difference from the file's first (seconds); the first put
        sets that."""
        if self.begin_ts <= 0:
            self.begin_ts = store_ts
            self.begin_offset = first_offset
        return min(max((store_ts - self.begin_ts) // 1000, 0), _INT_MAX)

    def _added(self, n: int, store_ts: int, last_offset: int) -> None:
        """``n`` entries linked: count them and write the header."""
        self.index_count += n
        self.end_ts = store_ts
        self.end_offset = max(self.end_offset, last_offset)
        self._write_header()
        self.dirty = True

    def _head(self, at: int) -> int:
        """The slot's head at byte ``at``, 0 when empty or not a written entry."""
        head = _SLOT.unpack_from(self.file.buffer, at)[0]
        return head if 0 < head < self.index_count else 0

    def _link_few(self, hashes: list[int], offsets: list[int], diff: int) -> None:
        """Entries one at a time (few of them: cheaper than :meth:`_link_many`'s arrays)."""
        heads: dict[int, int] = {}  # slot position -> newest entry number of this batch
        parts = []
        number = self.index_count
        for key_hash, offset in zip(hashes, offsets):
            at = HEADER_SIZE + 4 * (key_hash % self.slots)
            prev = heads.get(at)
            if prev is None:
                prev = self._head(at)
                if prev == 0:
                    self.slot_count += 1
            heads[at] = number
            parts.append(_ENTRY.pack(key_hash, offset, diff, prev))
            number += 1
        self.file.write_at(self._entry_pos(self.index_count), b"".join(parts))
        buf = self.file.buffer
        for at, number in heads.items():
            _SLOT.pack_into(buf, at, number)

    def _link_many(self, hashes: np.ndarray, offsets: np.ndarray, diff: int) -> None:
        """Entries as arrays: sort by slot, chain each slot's run, heads from the table
        (or the same in one C pass, where ``storage._native`` is built)."""
        n = len(hashes)
        if record._native is not None:
            self.slot_count += record._native.link_index(
                self.file.buffer,
                HEADER_SIZE,
                self.slots,
                self._entry_pos(self.index_count),
                self.index_count,
                hashes,
                offsets,
                diff,
            )
            return
        slots = hashes % self.slots
        current = self._slot_table[slots].astype(np.int64)
        current[(current <= 0) | (current >= self.index_count)] = 0
        numbers = self.index_count + np.arange(n, dtype=np.int64)
        order = np.lexsort((np.arange(n), slots))
        s_sorted = slots[order]
        first = np.ones(n, dtype=bool)
        first[1:] = s_sorted[1:] != s_sorted[:-1]
        n_sorted = numbers[order]
        prev_sorted = current[order]
        prev_sorted[1:] = np.where(first[1:], prev_sorted[1:], n_sorted[:-1])
        prev = np.empty(n, dtype=np.int64)
        prev[order] = prev_sorted
        entries = np.empty(n, dtype=ENTRY)
        entries["hash"] = hashes
        entries["offset"] = offsets
        entries["diff"] = diff
        entries["prev"] = prev
        last = np.ones(n, dtype=bool)
        last[:-1] = first[1:]
        self.slot_count += int(np.count_nonzero(first & (current[order] == 0)))
        self.file.write_at(self._entry_pos(self.index_count), entries.tobytes())
        self._slot_table[s_sorted[last]] = n_sorted[last]

    def _repair_stale_heads(self) -> int:
        """Point every slot whose head is past ``index count`` (a crash came between
        the slot writes and the header's) back at its last entry the header counts:
        the stale head's entry was written first, and its ``previous`` chain leads
        there. Without this the next put to the slot would drop the whole chain
        before it. Returns how many slots were repaired."""
        table = self._slot_table
        stale = np.flatnonzero(table >= self.index_count)
        for slot in stale.tolist():
            table[slot] = self._counted(int(table[slot]), self.index_count)
        if len(stale):
            self.dirty = True
            log.warning(
                "%s: %d index slots pointed past the last header (a crash mid-put); "
                "followed back to their entries",
                self.path,
                len(stale),
            )
        return len(stale)

    def _counted(self, number: int, count: int) -> int:
        """``number``, or, for a head past ``count`` (a put still writing, or one a crash
        cut), the first entry down its ``previous`` links that ``count`` covers: a put
        writes an entry before the slot that points at it. 0 when there is none."""
        buf = self.file.buffer
        while number >= count:
            prev = (
                _ENTRY.unpack_from(buf, self._entry_pos(number))[3]
                if number < self.max_entries
                else number
            )
            number = prev if 0 <= prev < number else 0  # a chain only goes down
        return number

    def _write_header(self) -> None:
        self.file.write_at(0, HEADER.pack(*_header_values(self)))

    def time_matched(self, begin: int, end: int) -> bool:
        return self.begin_ts > 0 and self.begin_ts <= end and self.end_ts >= begin

    def query(self, key_hash: int, max_count: int, begin: int, end: int) -> list[int]:
        """CommitLog offsets of entries with ``key_hash`` stored in [begin, end], newest first."""
        out: list[int] = []
        # a put in another thread (SYNC_FLUSH puts, delayed deliveries) may have moved
        # the head past the count: the older entries are still down its chain
        number = self._counted(int(self._slot_table[key_hash % self.slots]), self.index_count)
        buf = self.file.buffer
        seen = 0
        while 0 < number < self.index_count and len(out) < max_count and seen < self.index_count:
            seen += 1
            h, offset, diff, prev = _ENTRY.unpack_from(buf, self._entry_pos(number))
            time_read = self.begin_ts + diff * 1000
            if h == key_hash and begin <= time_read <= end:
                out.append(offset)
            if prev >= number or time_read < begin:
                break
            number = prev
        return out

    def flush(self) -> None:
        """Sync the whole file: slot writes are scattered, the kernel skips clean pages."""
        if self.dirty:
            self.dirty = False
            self.file.sync()

    def close(self) -> None:
        del self._slot_table
        self.file.close()

    def destroy(self) -> None:
        del self._slot_table
        self.file.destroy()


class IndexService:
    """The index files of a store, rolling to a new file when one is full."""

    def __init__(
        self, directory: Path, slots: int, max_entries: int, *, preallocate: bool = True
    ) -> None:
        self.directory = directory
        self.slots = slots
        self.max_entries = max_entries
        self.preallocate = preallocate
        self.files: list[IndexFile] = []

    def load(self) -> None:
        if not self.directory.exists():
            return
        for path in sorted(p for p in self.directory.iterdir() if p.is_file()):
            if path.name.endswith(".tmp"):  # an allocation cut short
                path.unlink()
                continue
            size = HEADER_SIZE + self.slots * 4 + self.max_entries * ENTRY_SIZE
            if not path.name.isdigit() or drop_if_empty(path, size):
                continue
            self.files.append(
                IndexFile(
                    path, self.slots, self.max_entries, create=False, preallocate=self.preallocate
                )
            )

    def _new_file(self) -> IndexFile:
        self.directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        while True:
            name = (
                time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"
            )
            path = self.directory / name
            if not path.exists() and (not self.files or name > self.files[-1].path.name):
                break
            now += 0.001
        f = IndexFile(path, self.slots, self.max_entries, create=True, preallocate=self.preallocate)
        self.files.append(f)
        log.info("new index file %s", path.name)
        return f

    def put(self, hashes: np.ndarray, offsets: np.ndarray, store_ts: int) -> None:
        """Index the keys; with no room on the disk for a new file, the keys that do not
        fit are dropped with an error (the records stay stored and served: only their
        lookup by key misses them, as RocketMQ's IndexService does)."""
        pos = 0
        while pos < len(hashes):
            f = self._writable(len(hashes) - pos)
            if f is None:
                return
            pos += f.put(hashes[pos:], offsets[pos:], store_ts)

    def put_at(self, hashes: list[int], offset: int, store_ts: int) -> None:
        """:meth:`put` of one record's keys (all at CommitLog ``offset``), in plain ints."""
        if len(hashes) == 1 and self.files and self.files[-1].put_one(hashes[0], offset, store_ts):
            return  # the usual record: its unique key alone, into the last file
        pos = 0
        while pos < len(hashes):
            f = self._writable(len(hashes) - pos)
            if f is None:
                return
            pos += f.put_at(hashes[pos:], offset, store_ts)

    def _writable(self, left: int) -> IndexFile | None:
        """The file the next keys go into: the last one, or a new one when it is full.
        None when the disk has no room for a new one (``left`` keys dropped, logged)."""
        if self.files and not self.files[-1].is_full:
            return self.files[-1]
        try:
            return self._new_file()
        except DiskFullError as exc:
            log.error("%d index keys not indexed: %s", left, exc)
            return None

    def put_stamped(self, hashes: np.ndarray, offsets: np.ndarray, stamps: np.ndarray) -> None:
        """Index keys stored at different times (``stamps``: each key's store timestamp,
        ms): one :meth:`put` per timestamp, the earliest first, each key in its order.
        One stable sort then runs of equal stamps, not a mask of every key per distinct
        stamp: records stored one a millisecond (a slave catching up, a rebuild after a
        crash) have about as many stamps as keys."""
        if not len(stamps):
            return
        order = np.argsort(stamps, kind="stable")
        sorted_stamps = stamps[order]
        starts = np.flatnonzero(np.r_[True, sorted_stamps[1:] != sorted_stamps[:-1]])
        ends = np.r_[starts[1:], len(order)]
        for a, b in zip(starts.tolist(), ends.tolist()):
            run = order[a:b]
            self.put(hashes[run], offsets[run], int(sorted_stamps[a]))

    def query(self, key_hash: int, max_count: int, begin: int, end: int) -> list[int]:
        out: list[int] = []
        seen: set[int] = set()
        for f in reversed(self.files):
            if len(out) >= max_count:
                break
            if not f.time_matched(begin, end):
                continue
            for offset in f.query(key_hash, max_count, begin, end):
                if offset not in seen:
                    seen.add(offset)
                    out.append(offset)
        return out[:max_count]

    def flush(self) -> None:
        for f in self.files:
            f.flush()

    def delete_expired(self, commitlog_min: int) -> int:
        gone = 0
        while len(self.files) > 1 and self.files[0].end_offset < commitlog_min:
            self.files.pop(0).destroy()
            gone += 1
        return gone

    def close(self) -> None:
        for f in self.files:
            f.close()
