"""CommitLog: one append-only log of records for every topic.

Invariants: records are contiguous from ``min_offset`` to ``max_offset``; a
record never straddles two files (a file's unused tail starts with a blank
marker); each record's PHYSICALOFFSET field equals its offset in the log;
``flushed_offset <= max_offset``. Appends happen under the store's put lock;
reads take no lock and copy what they return. Recovery may have replaced damaged
bytes by a filler record of ``storage.quarantine.QUARANTINE_TOPIC``: a record
like any other to whoever walks the log, served by no queue.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import logging
import mmap
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import overload

import numpy as np

from . import codec, record
from ._crc import crc32
from .errors import OffsetOutOfRangeError, StoreCorruptedError
from .mapped_file import MappedFile, MappedFileQueue
from .message import MessageExt

log = logging.getLogger("raymq.storage.commitlog")

_SIZE_MAGIC = struct.Struct(">iI")
_BLANK = struct.Struct(">iI")
_I32 = struct.Struct(">i")
_QUEUE_ID = struct.Struct(">i")  # at OFF_QUEUEID
_OFFSETS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET: adjacent
_STORED = struct.Struct(">q8s")  # STORETIMESTAMP, STOREHOST: adjacent
assert codec.OFF_PHYSICALOFFSET == codec.OFF_QUEUEOFFSET + 8
assert codec.OFF_STOREHOST == codec.OFF_STORETIMESTAMP + 8


def _patch_record(
    buf: mmap.mmap, pos: int, queue_id: int, queue_offset: int, phys: int, ts: int, host: bytes
) -> None:
    """Write one record's store fields (the scalar twin of the vectorised patches)."""
    _QUEUE_ID.pack_into(buf, pos + codec.OFF_QUEUEID, queue_id)
    _OFFSETS.pack_into(buf, pos + codec.OFF_QUEUEOFFSET, queue_offset, phys)
    _STORED.pack_into(buf, pos + codec.OFF_STORETIMESTAMP, ts, host)


class CommitLog:
    def __init__(self, directory: Path, file_size: int, *, preallocate: bool = True) -> None:
        self.files = MappedFileQueue(directory, file_size, preallocate=preallocate, warm_new=True)
        self.file_size = file_size
        self._flush_lock = threading.Lock()
        self._flushed = 0  # commitlog offset known durable
        self._durable = threading.Condition()  # notified after every flush
        # recent fsync times (seconds), for whoever exports metrics to drain
        self.flush_durations: collections.deque[float] = collections.deque(maxlen=4096)
        self.flush_count = 0  # flushes that synced something, since open
        self.before_sync: Callable[[], object] | None = None
        """Tests only: called by the flushing thread before each sync (a slow disk on
        purpose, e.g. ``threading.Event().wait``); None otherwise."""

    # -- offsets
    @property
    def min_offset(self) -> int:
        return self.files.min_offset

    @property
    def max_offset(self) -> int:
        return self.files.max_offset

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    # -- append (called under the store's put lock)
    def append(
        self,
        data: bytes | memoryview,
        sizes: np.ndarray,
        queue_ids: np.ndarray,
        queue_offsets: np.ndarray,
        store_ts: int,
        store_host: bytes,
    ) -> np.ndarray:
        """Append a batch of encoded records; patch store fields; return their offsets.

        The whole placement is computed, and the files it needs allocated, before
        any byte is written, so a batch that cannot be placed changes nothing.
        """
        n = len(sizes)
        few = n <= record.SMALL_BATCH
        ends: list[int] | np.ndarray
        if few:  # Python ints and struct: numpy's per-call cost would dominate
            size_list = sizes.tolist()
            ends = list(itertools.accumulate(size_list))
            biggest = max(size_list)
        else:
            ends = np.cumsum(sizes.astype(np.int64))
            biggest = int(sizes.max())
        if biggest + codec.END_FILE_MIN_BLANK > self.file_size:
            raise StoreCorruptedError(
                f"a record of {biggest} bytes cannot fit in a {self.file_size}-byte file"
            )
        # placement: split the batch where a file ends
        segments: list[tuple[int, int, int]] = []  # (first, last_exclusive, log offset of first)
        last = self.files.last()
        cur = self.max_offset
        room = last.remaining if last is not None else 0
        i = 0
        while i < n:
            begin = int(ends[i - 1]) if i else 0
            j = bisect.bisect_right(ends, begin + room - codec.END_FILE_MIN_BLANK)
            if j <= i:  # the next record does not fit: the rest goes in a new file
                cur += room
                room = self.file_size
                continue
            segments.append((i, j, cur))
            used = int(ends[j - 1]) - begin
            cur += used
            room -= used
            i = j
        # the files it needs, allocated before a byte is written (DiskFullError if not)
        self.files.reserve(self.max_offset, cur)
        # copy each segment into its file once, patch the store fields in place, then
        # publish it (move the write position): a reader bounded by the write position
        # (replication, on the broker's loop, while a service thread puts delayed
        # messages) never sees a record before its fields are. A crash between copy and
        # patch leaves a record whose physical offset is wrong, which recovery rejects;
        # it was never acknowledged
        view = memoryview(data)
        if few:
            qids, qoffs = queue_ids.tolist(), queue_offsets.tolist()
            phys_list: list[int] = []
            for first, stop, base in segments:
                begin = ends[first - 1] if first else 0
                mf = self._file_for(base)
                rel = mf.stage(view[begin : ends[stop - 1]])
                for k in range(first, stop):
                    at = (ends[k - 1] if k else 0) - begin  # within the segment
                    phys_list.append(base + at)
                    _patch_record(
                        mf.buffer, rel + at, qids[k], qoffs[k], base + at, store_ts, store_host
                    )
                mf.publish(rel + ends[stop - 1] - begin)
            return self._after_append(np.array(phys_list, dtype=np.int64))
        starts = ends - sizes.astype(np.int64)
        phys = np.empty(n, dtype=np.int64)
        for first, stop, base in segments:
            phys[first:stop] = base + (starts[first:stop] - starts[first])
        if record._native is not None:  # one C pass per segment: copy, then patch
            sizes32 = np.ascontiguousarray(sizes, dtype=np.int32)
            qids32 = np.ascontiguousarray(queue_ids, dtype=np.int32)
            qoffs64 = np.ascontiguousarray(queue_offsets, dtype=np.int64)
            stored_raw = _STORED.pack(store_ts, store_host)
            for first, stop, base in segments:
                mf = self._file_for(base)
                segment = view[int(starts[first]) : int(ends[stop - 1])]
                rel = mf.stage(segment)
                record._native.patch_records(
                    mf.buffer,
                    rel,
                    sizes32[first:stop],
                    qids32[first:stop],
                    qoffs64[first:stop],
                    phys[first:stop],
                    stored_raw,
                )
                mf.publish(rel + len(segment))
            return self._after_append(phys)
        # the store fields as the bytes they become: (QUEUEOFFSET, PHYSICALOFFSET)
        # per record, QUEUEID per record, and (STORETIMESTAMP, STOREHOST) once
        offsets = np.empty((n, 2), dtype=">i8")
        offsets[:, 0] = queue_offsets
        offsets[:, 1] = phys
        pairs = offsets.view("V16").ravel()
        qid_bytes = np.ascontiguousarray(queue_ids, dtype=">i4").view("V4")
        stored = np.frombuffer(_STORED.pack(store_ts, store_host), dtype="V16")[0]
        for first, stop, base in segments:
            mf = self._file_for(base)
            segment = view[int(starts[first]) : int(ends[stop - 1])]
            rel = mf.stage(segment)
            local = starts[first:stop] - starts[first] + rel
            w4 = codec.windows(mf.buffer, "V4")
            w16 = codec.windows(mf.buffer, "V16")
            try:
                w4[local + codec.OFF_QUEUEID] = qid_bytes[first:stop]
                w16[local + codec.OFF_QUEUEOFFSET] = pairs[first:stop]
                w16[local + codec.OFF_STORETIMESTAMP] = stored
            finally:
                del w4, w16
            mf.publish(rel + len(segment))
        return self._after_append(phys)

    def append_one(
        self,
        data: bytes | memoryview,
        queue_id: int,
        queue_offset: int,
        store_ts: int,
        store_host: bytes,
    ) -> int:
        """:meth:`append` of a batch of one record (``data`` is that record), in plain
        ints: the same bytes, placed the same way. Returns its offset."""
        size = len(data)
        files = self.files.files
        tail = files[-1] if files else None
        if tail is not None and size <= tail.remaining - codec.END_FILE_MIN_BLANK:
            # the usual put: it fits in the last file, nothing to reserve or seal
            mf, at = tail, tail.end_offset
        else:
            if size + codec.END_FILE_MIN_BLANK > self.file_size:
                raise StoreCorruptedError(
                    f"a record of {size} bytes cannot fit in a {self.file_size}-byte file"
                )
            at = self.max_offset
            room = tail.remaining if tail is not None else 0
            if size > room - codec.END_FILE_MIN_BLANK:  # it does not fit: in a new file
                at += room
            self.files.reserve(self.max_offset, at + size)
            mf = self._file_for(at)
        rel = mf.stage(data)
        _patch_record(mf.buffer, rel, queue_id, queue_offset, at, store_ts, store_host)
        mf.publish(rel + size)
        if mf.wrote_position * 2 > self.file_size:  # as _after_append
            self.files.prepare_next()
        return at

    def _after_append(self, phys: np.ndarray) -> np.ndarray:
        """Start preparing the next file once the current one is half written."""
        last = self.files.last()
        if last is not None and last.wrote_position * 2 > self.file_size:
            self.files.prepare_next()
        return phys

    def _file_for(self, offset: int) -> MappedFile:
        """The file that must receive a write at ``offset``, sealing/rolling as needed."""
        last = self.files.last()
        if last is None:
            last = self.files.create(offset - offset % self.file_size)
            last.wrote_position = offset % self.file_size
        while last.end_offset < offset or last.is_full:
            self._seal(last)
            last = self.files.create(last.from_offset + self.file_size)
        return last

    def _seal(self, mf: MappedFile) -> None:
        """Fill a file's tail with the blank marker and mark it full."""
        rest = mf.remaining
        if rest >= codec.END_FILE_MIN_BLANK:
            mf.write_at(mf.wrote_position, _BLANK.pack(rest, codec.BLANK_MAGIC))
        mf.wrote_position = mf.file_size

    # -- flush
    def flush(self) -> int:
        """Flush everything written; return the flushed offset."""
        with self._flush_lock:
            flushed = self._flush_locked()
        with self._durable:
            self._durable.notify_all()
        return flushed

    def flush_until(self, offset: int) -> int:
        """Make ``offset`` durable: flush everything written, unless another caller's
        flush (waited for on the lock) covered ``offset`` already."""
        if self._flushed < offset:
            with self._flush_lock:
                if self._flushed < offset:
                    self._flush_locked()
            with self._durable:
                self._durable.notify_all()
        return self._flushed

    def _flush_locked(self) -> int:
        target = self.max_offset
        if target > self._flushed:
            started = time.perf_counter()
            if self.before_sync is not None:
                self.before_sync()
            self.files.flush()
            self.flush_durations.append(time.perf_counter() - started)
            self.flush_count += 1
            self._flushed = target
        return self._flushed

    def wait_flushed(self, offset: int, timeout_s: float | None) -> bool:
        """Wait until a flush made ``offset`` durable; False if ``timeout_s`` ran out first."""
        if self._flushed >= offset:
            return True
        with self._durable:
            return self._durable.wait_for(lambda: self._flushed >= offset, timeout_s)

    def dirty_pages(self) -> int:
        return self.files.dirty_pages()

    # -- read
    def read(self, offset: int, size: int) -> bytes:
        mf, rel = self._locate(offset, size)
        return mf.read(rel, size)

    def view(self, offset: int, size: int) -> memoryview:
        """:meth:`read` without a copy (:meth:`MappedFile.view`)."""
        mf, rel = self._locate(offset, size)
        return mf.view(rel, size)

    def _locate(self, offset: int, size: int) -> tuple[MappedFile, int]:
        mf = self.files.find(offset)
        if mf is None:
            raise OffsetOutOfRangeError(
                f"commitlog offset {offset} outside [{self.min_offset}, {self.max_offset})"
            )
        rel = offset - mf.from_offset
        if rel + size > mf.wrote_position:
            raise OffsetOutOfRangeError(f"commitlog offset {offset}+{size} past the written end")
        return mf, rel

    @overload
    def read_runs(self, offsets: np.ndarray, sizes: np.ndarray) -> bytes: ...
    @overload
    def read_runs(
        self, offsets: np.ndarray, sizes: np.ndarray, *, view: bool
    ) -> bytes | memoryview: ...
    def read_runs(
        self, offsets: np.ndarray, sizes: np.ndarray, *, view: bool = False
    ) -> bytes | memoryview:
        """Records at ``offsets`` back to back, reading each contiguous run in one copy;
        with ``view``, records that are one run come as a view of the file, no copy."""
        n = len(offsets)
        if n == 0:
            return b""
        offsets = offsets.astype(np.int64)
        ends = offsets + sizes.astype(np.int64)
        breaks = np.flatnonzero(offsets[1:] != ends[:-1]) + 1
        run_starts = np.concatenate(([0], breaks))
        run_ends = np.concatenate((breaks, [n]))
        parts = []
        for a, b in zip(run_starts.tolist(), run_ends.tolist()):
            start = int(offsets[a])
            stop = int(ends[b - 1])
            mf = self.files.find(start)
            if mf is not None and stop - mf.from_offset <= mf.file_size:
                if view and len(run_starts) == 1:
                    return self.view(start, stop - start)
                parts.append(self.read(start, stop - start))
            else:  # a run that crosses files (cannot, records never straddle): per record
                parts.extend(
                    self.read(int(o), int(e - o))
                    for o, e in zip(offsets[a:b].tolist(), ends[a:b].tolist())
                )
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def size_at(self, offset: int) -> int:
        raw = self.read(offset, 8)
        size, magic = _SIZE_MAGIC.unpack(raw)
        if magic != codec.MAGIC:
            raise OffsetOutOfRangeError(f"no record starts at commitlog offset {offset}")
        return size

    def message_at(self, offset: int) -> MessageExt:
        size = self.size_at(offset)
        try:
            return codec.decode_record(self.read(offset, size))[0]
        except StoreCorruptedError as exc:
            raise StoreCorruptedError(f"commitlog offset {offset}: {exc}") from exc

    def store_timestamp_at(self, offset: int) -> int:
        return int(struct.unpack(">q", self.read(offset + codec.OFF_STORETIMESTAMP, 8))[0])

    # -- recovery
    @staticmethod
    def scan_file(mf: MappedFile, check_crc: bool, start: int = 0) -> tuple[int, bool]:
        """Walk the records of ``mf`` from ``start``: (where the valid chain ends, whether
        it ends with the file's blank marker).

        A record is valid when its size and magic are right, its PHYSICALOFFSET is
        its own offset, its lengths add up and (with ``check_crc``) its body matches
        its CRC (:func:`codec.stored_record_fault`, vectorised). The chain ends at
        the first invalid record or an all-zero header. Three passes: walk the size
        chain (one unpack per record), check the headers vectorised, then the CRCs.
        """
        mv = memoryview(mf.buffer)
        try:
            limit = mf.file_size
            unpack = _I32.unpack_from
            starts: list[int] = []
            append = starts.append
            pos = start
            while pos + 8 <= limit:
                size = unpack(mv, pos)[0]
                if size < 8 or pos + size > limit:
                    break
                append(pos)
                pos += size
            if not starts:
                return start, False
            words = codec.windows(mf.buffer, ">u4")
            longs = codec.windows(mf.buffer, ">i8")
            octets = np.frombuffer(mf.buffer, dtype=np.uint8)
            st = np.array(starts, dtype=np.int64)
            sizes = np.diff(np.append(st, pos))
            magic = words[st + codec.OFF_MAGIC]
            is_blank = magic == codec.BLANK_MAGIC
            n = len(st)
            sealed = bool(is_blank[-1]) and pos == limit
            records = n - 1 if sealed else n
            ok = (magic[:records] == codec.MAGIC) & (sizes[:records] >= codec.FIXED_LEN)
            head = st[:records]
            ends = head + sizes[:records]
            tail = np.minimum(head + codec.HEADER.size, limit - 8)
            phys = longs[np.minimum(head, limit - 36) + codec.OFF_PHYSICALOFFSET]
            body_len = words[tail - 4].view(">i4").astype(np.int64)
            ok &= phys == mf.from_offset + head
            ok &= (body_len >= 0) & (head + codec.HEADER.size + body_len + 3 <= ends)
            # TOPICLEN and PROPERTIESLEN add up (read where the record holds them)
            topic_at = np.where(ok, head + codec.HEADER.size + body_len, head)
            topic_len = octets[topic_at].astype(np.int64)
            ok &= topic_at + 3 + topic_len <= ends
            prop_at = np.where(ok, topic_at + 1 + topic_len, head)
            prop_len = (octets[prop_at].astype(np.int64) << 8) | octets[prop_at + 1]
            ok &= prop_at + 2 + prop_len == ends
            bad = np.flatnonzero(~ok)
            good = int(bad[0]) if len(bad) else records
            del words, longs, octets, magic, phys
            if check_crc and good:
                body_at = (head[:good] + codec.HEADER.size).tolist()
                body_end = (head[:good] + codec.HEADER.size + body_len[:good]).tolist()
                crcs = [unpack(mv, a + 8)[0] for a in head[:good].tolist()]
                for i, (a, b, c) in enumerate(zip(body_at, body_end, crcs)):
                    if (crc32(mv[a:b]) & 0x7FFFFFFF) != c:
                        good = i
                        break
            if good < records:
                return int(head[good]), False
            if sealed:
                return int(st[-1]), True
            return pos, False
        finally:
            mv.release()

    def truncate(self, end: int, max_record_size: int) -> None:
        """Make ``end`` the log's end: zero the rest of its file, delete later files."""
        if self.files.files and end < self.files.files[0].from_offset:
            raise StoreCorruptedError(
                f"commitlog end {end} before its first file {self.files.files[0].path.name}"
            )
        self.files.truncate(end, stop_after_zero_run=max_record_size + (1 << 20))
        self._flushed = end
        for mf in self.files.files:
            mf.flushed_position = mf.wrote_position

    def close(self) -> None:
        self.files.close()
