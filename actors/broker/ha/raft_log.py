"""A ``storage.raft.RaftLog`` kept in the CommitLog: DLedger's single copy of the data.

Entry ``i`` (from 1) is the CommitLog range ``[end(i-1), end(i))`` written by
one put batch: the leader's own put (the store assigned offsets, store
timestamps and its host, and those exact bytes are what every member holds),
or bytes a follower appended at the same offsets. A leader's no-op is an empty
range. The log keeps ``(term, end)`` per entry in memory and in an index file,
``<store>/raft/index`` (a 16-byte header, then 16 bytes per entry); the bytes
themselves live only in the CommitLog, so the members' CommitLogs, their
ConsumeQueues and their message ids are identical up to the commit index.

Invariants: ``end(0)`` is the log's base offset (0 for a group that began with
empty stores); ends never decrease; ``end(last_index)`` is the CommitLog's max
offset (at open, bytes past the last entry, which no one ever acknowledged,
are cut off, and entries past the CommitLog's end are dropped); the index file
holds exactly the entries in memory once :meth:`sync` returns, and they and their
CommitLog bytes are durable (fsynced), whatever the store's flush mode.

Durability: a member acknowledges entries (a follower's ``AppendEntriesResponse``,
the leader's own count towards the quorum) only once they are durable. Under
``ASYNC_FLUSH`` the store alone would only have them in the page cache, and an
entry counted towards the commit quorum but lost by a power loss on one member
is lost to the group if the leader then crashes before it re-sent it: the two
others may elect a leader without it. So the shell syncs once per drain (one
``Ready``: every ``AppendEntries`` it took since the last one), not per entry.
"""

from __future__ import annotations

import logging
import os
import struct
from array import array
from collections.abc import Sequence
from pathlib import Path

from storage.errors import OffsetOutOfRangeError, StoreCorruptedError
from storage.raft import Entry
from storage.store import MessageStore

log = logging.getLogger("raymq.actors.broker.ha.dledger")

_HEADER = struct.Struct(">4sIq")  # magic, version, base offset
_RECORD = struct.Struct(">qq")  # term, end offset
_MAGIC = b"RMQR"
_VERSION = 1

OWN_ENTRY = b"\x00"
"""What a leader proposes for a batch it already put in its store (see ``prewritten``)."""


class CommitLogRaftLog:
    def __init__(self, store: MessageStore, directory: Path, *, fsync: bool = True) -> None:
        """``fsync=False`` only writes the index (tests that measure without the disk)."""
        self.store = store
        self.fsync = fsync
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "index"
        self._terms = array("q", [0])
        self._ends = array("q")
        self._prewritten: int | None = None
        self._synced = 0  # entries known durable in the index file
        fresh = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fresh or os.fstat(self._fd).st_size < _HEADER.size:
                self._create(store.commitlog.max_offset)
            else:
                self._load()
            self._reconcile()
        except BaseException:
            os.close(self._fd)
            raise

    # ------------------------------------------------------------ open
    def _create(self, base: int) -> None:
        if base:
            log.warning(
                "%s: starting a Raft log at commitlog offset %d; every member must start "
                "from the same store",
                self.path,
                base,
            )
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, _HEADER.pack(_MAGIC, _VERSION, base), 0)
        os.fsync(self._fd)
        self._ends = array("q", [base])

    def _load(self) -> None:
        size = os.fstat(self._fd).st_size
        raw = os.pread(self._fd, size, 0)
        magic, version, base = _HEADER.unpack_from(raw, 0)
        if magic != _MAGIC or version != _VERSION:
            raise StoreCorruptedError(f"{self.path} is not a RayMQ Raft index (version {version})")
        body = len(raw) - _HEADER.size
        whole = body - body % _RECORD.size
        if whole != body:
            log.warning("%s: dropping a torn index record at its end", self.path)
        self._ends = array("q", [base])
        # a view: raw[_HEADER.size :][:whole] copied the whole index twice
        for term, end in _RECORD.iter_unpack(memoryview(raw)[_HEADER.size : _HEADER.size + whole]):
            self._terms.append(term)
            self._ends.append(end)
        self._synced = len(self._terms) - 1

    def _reconcile(self) -> None:
        """Make the last entry end exactly at the CommitLog's end."""
        store_end = self.store.commitlog.max_offset
        keep = self.last_index
        while keep > 0 and self._ends[keep] > store_end:
            keep -= 1
        if keep < self.last_index:
            log.warning(
                "%s: the commitlog ends at %d; dropping entries %d..%d past it",
                self.path,
                store_end,
                keep + 1,
                self.last_index,
            )
            self._cut(keep + 1)
        if self.end < store_end:
            log.warning(
                "%s: cutting unproposed commitlog bytes %d..%d", self.path, self.end, store_end
            )
            self.store.truncate_commitlog(self.end)

    # ------------------------------------------------------------ RaftLog
    @property
    def last_index(self) -> int:
        return len(self._terms) - 1

    @property
    def last_term(self) -> int:
        return self._terms[-1]

    @property
    def base(self) -> int:
        return self._ends[0]

    @property
    def end(self) -> int:
        """The CommitLog offset where the last entry ends."""
        return self._ends[-1]

    def end_of(self, index: int) -> int:
        """The CommitLog offset where entry ``index`` ends (``base`` for 0)."""
        return self._ends[index]

    def term_at(self, index: int) -> int:
        if not 0 <= index <= self.last_index:
            raise OffsetOutOfRangeError(
                f"log index {index} is outside the log [0, {self.last_index}]"
            )
        return self._terms[index]

    def prewritten(self, end: int | None) -> None:
        """The next appended entry is the leader's put that already ends at ``end``
        (None: forget it, the proposal failed)."""
        self._prewritten = end

    def append(self, entries: Sequence[bytes], term: int) -> int:
        if term < self.last_term:
            raise ValueError(f"term {term} is below the log's last term {self.last_term}")
        for data in entries:
            if self._prewritten is not None:
                end, self._prewritten = self._prewritten, None
                if end < self.end or end != self.store.commitlog.max_offset:
                    raise StoreCorruptedError(
                        f"a leader's put ends at {end}, the log at {self.end}, "
                        f"the commitlog at {self.store.commitlog.max_offset}"
                    )
            elif data:
                end = self._write(data)
            else:
                end = self.end  # a no-op
            self._terms.append(term)
            self._ends.append(end)
        return self.last_index

    def _write(self, data: bytes | memoryview) -> int:
        """Append a member's bytes at the end, one piece per CommitLog file."""
        file_size = self.store.commitlog.file_size
        offset = self.end
        view = memoryview(data)
        pos = 0
        while pos < len(data):
            room = file_size - offset % file_size
            piece = view[pos : pos + room]
            offset = self.store.append_commitlog(offset, piece, dispatch=False)  # by the shell
            pos += len(piece)
        return offset

    def truncate_from(self, index: int) -> None:
        if not 0 < index <= self.last_index + 1:
            raise OffsetOutOfRangeError(
                f"truncate index {index} is outside [1, {self.last_index + 1}]"
            )
        self._cut(index)
        if self.store.commitlog.max_offset > self.end:
            self.store.truncate_commitlog(self.end)

    def _cut(self, index: int) -> None:
        del self._terms[index:]
        del self._ends[index:]
        self._synced = min(self._synced, self.last_index)
        os.ftruncate(self._fd, _HEADER.size + _RECORD.size * self.last_index)

    def entries(self, start: int, *, max_bytes: int, max_count: int) -> list[Entry]:
        if not 1 <= start <= self.last_index:
            if start == self.last_index + 1:
                return []
            raise OffsetOutOfRangeError(f"entries start {start} is outside [1, {self.last_index}]")
        stop = start
        size = self._ends[start] - self._ends[start - 1]
        last = min(self.last_index, start + max_count - 1)
        while stop < last:
            nxt = self._ends[stop + 1] - self._ends[stop]
            if size + nxt > max_bytes:
                break
            size += nxt
            stop += 1
        lo = self._ends[start - 1]
        blob = memoryview(self.read(lo, self._ends[stop] - lo))
        out = []
        for i in range(start, stop + 1):
            a, b = self._ends[i - 1] - lo, self._ends[i] - lo
            out.append(Entry(self._terms[i], blob[a:b]))  # type: ignore[arg-type]
        return out

    def read(self, offset: int, size: int) -> bytes:
        """CommitLog bytes ``[offset, offset + size)``, across files."""
        parts = []
        while size > 0:
            chunk = self.store.read_commitlog(offset, size)
            if not chunk:
                raise StoreCorruptedError(f"commitlog bytes {offset}+{size} are missing")
            parts.append(chunk)
            offset += len(chunk)
            size -= len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    # ------------------------------------------------------------ durability
    def sync(self) -> None:
        """Write entries not yet in the index file and make them durable (blocks on the
        disk: the shell calls :meth:`write_index` on its loop, :meth:`flush` off it)."""
        self.flush(self.write_index())

    def write_index(self) -> int:
        """Write entries not yet in the index file (to the page cache); return the CommitLog
        offset where the last of them ends, for :meth:`flush`."""
        last = self.last_index  # once: the log may grow while a flush runs in a thread
        first = self._synced + 1
        if first <= last:
            records = b"".join(
                _RECORD.pack(self._terms[i], self._ends[i]) for i in range(first, last + 1)
            )
            os.pwrite(self._fd, records, _HEADER.size + _RECORD.size * (first - 1))
            self._synced = last
        return self._ends[last]

    def flush(self, end: int) -> None:
        """Make the index file and the CommitLog up to ``end`` durable."""
        if self.fsync:
            self.store.commitlog.flush_until(end)
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            os.close(self._fd)
            self._fd = -1

    def __repr__(self) -> str:
        return (
            f"CommitLogRaftLog(last_index={self.last_index}, last_term={self.last_term}, "
            f"commitlog [{self.base}, {self.end}))"
        )
