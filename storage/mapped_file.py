"""Fixed-size, preallocated, memory-mapped files and the ordered queue of them.

Invariants of a :class:`MappedFileQueue`:

* files are named by the 20-digit offset of their first byte, all have the
  same size, and each starts where the previous one ends;
* only the last file is written to; every file before it is full (its unused
  tail, if any, starts with a blank marker written by the owner);
* ``flushed_offset <= committed (written) offset`` at all times;
* a file appears whole or not at all: it is allocated under a ``.tmp`` name and
  renamed once its blocks are (``posix_fallocate``), so a full disk leaves no
  short or empty file behind; ``load`` drops a trailing empty one left by older
  versions instead of allocating it again.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from .errors import DiskFullError, StoreCorruptedError

log = logging.getLogger("raymq.storage.mapped_file")

PAGE = mmap.PAGESIZE
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14; Python 3.11's mmap module lacks the constant
_WARM_CHUNK = 1 << 20
"""What one ``madvise`` warms. The call holds the process's ``mmap_lock`` (for reading)
while it faults the chunk's pages in; a thread that maps or unmaps memory meanwhile
(Python's allocator does, for its arenas) waits for the whole chunk, and every page
fault after it waits behind that writer. With 64 MiB chunks the stall tracer caught the
broker's event loop stalled 24-40 ms at a time (p99 61 ms in that round) while a new
broker's 1 GiB file warmed, and ``benchmarks/warm_stall.py`` a mapping thread 39-75 ms
when populating ran slowly; the hold shrinks with the chunk. A thousand calls a GiB
cost nothing beside the faults themselves."""


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return None
    return libc


_libc = _load_libc()

WARM_NICE = 19
"""The warming thread's niceness. Faulting a whole file in is bulk work of the kernel's
(a 1 GiB CommitLog: 0.2-2.7 s of a core here, at a broker's start and at each roll,
~10 s once the VM's host has taken its free memory back), and the broker's loop,
its clients and its consumers must not wait behind it for a core."""


def _lower_priority() -> None:
    """This thread (only: on Linux a thread id is a ``PRIO_PROCESS`` target) at
    :data:`WARM_NICE`; elsewhere the call would take the whole process down with it."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):  # a thread may always lower its own priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WARM_NICE)


_MS_SYNC = 4 if sys.platform.startswith("linux") else 0x10  # <sys/mman.h>: Linux, BSD/macOS


def offset_to_name(offset: int) -> str:
    return f"{offset:020d}"


def _allocate(path: Path, size: int, preallocate: bool) -> int:
    """A new file of ``size`` bytes at ``path``, open read-write: allocated under a
    ``.tmp`` name and renamed, so it never exists short or empty."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _extend(fd, path, size, preallocate)
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return fd


def _extend(fd: int, path: Path, size: int, preallocate: bool) -> None:
    """Make the file ``size`` bytes, its blocks allocated when ``preallocate`` (a write
    into the mapping of an unallocated block on a full disk would kill the process)."""
    try:
        if preallocate and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
        else:
            os.ftruncate(fd, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(
                f"{path.name}: allocating {size} bytes in {path.parent}: "
                f"{exc.strerror} (the disk is full)"
            ) from exc
        raise


def drop_if_empty(path: Path, file_size: int) -> bool:
    """Delete ``path`` if it is shorter than ``file_size`` and holds only zeros (an
    allocation that failed, in versions that allocated in place); True if it did."""
    size = path.stat().st_size
    if size >= file_size:
        return False
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            if chunk.count(0) != len(chunk):
                return False
    log.warning(
        "%s: %d of %d bytes, all zero (a failed allocation): deleted", path, size, file_size
    )
    path.unlink()
    return True


def _closed_mmap() -> mmap.mmap:
    """A stand-in for a mapping closed while views of it were out: every use of it
    raises ValueError, as a closed mmap's does."""
    mm = mmap.mmap(-1, PAGE)
    mm.close()
    return mm


class MappedFile:
    """One file of ``file_size`` bytes mapped into memory."""

    def __init__(self, path: Path, file_size: int, *, create: bool, preallocate: bool = True):
        self.path = path
        self.file_size = file_size
        self.from_offset = int(path.name)
        if create and not path.exists():
            self._fd = _allocate(path, file_size, preallocate)
        else:
            self._fd = os.open(path, os.O_RDWR)
        try:
            actual = os.fstat(self._fd).st_size
            if actual < file_size:
                log.warning("%s is %d bytes, expected %d: extending", path, actual, file_size)
                _extend(self._fd, path, file_size, preallocate)
            elif actual > file_size:
                raise StoreCorruptedError(
                    f"{path} is {actual} bytes, larger than the configured {file_size}"
                )
            self._mm = mmap.mmap(self._fd, file_size, access=mmap.ACCESS_WRITE)
            anchor = ctypes.c_char.from_buffer(self._mm)
            self._address = ctypes.addressof(anchor)  # fixed for the mapping's life
            del anchor
        except BaseException:
            os.close(self._fd)
            raise
        self.wrote_position = 0
        self.flushed_position = 0
        self._warm_lock = threading.Lock()
        self._closing = False

    def warm(self) -> bool:
        """Fault every page in writable ahead of use (RocketMQ's warmMappedFile).

        Through ctypes so the GIL is released while the kernel works; a file
        that is not warmed is only slower on its first writes. It stops at the next
        chunk once :meth:`close` begins: a store closed while its 1 GiB file warmed
        waited a second or more for a warming nobody needed any more.
        """
        if _libc is None:
            return False
        with self._warm_lock:
            if self._fd < 0:
                return False
            address = self._address
            for start in range(0, self.file_size, _WARM_CHUNK):
                if self._closing:
                    return False
                length = min(_WARM_CHUNK, self.file_size - start)
                if _libc.madvise(address + start, length, _MADV_POPULATE_WRITE) != 0:
                    return False
        return True

    # -- positions
    @property
    def end_offset(self) -> int:
        return self.from_offset + self.wrote_position

    @property
    def remaining(self) -> int:
        return self.file_size - self.wrote_position

    @property
    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    # -- io
    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Write at the write position; return the file-relative position written."""
        pos = self.wrote_position
        end = pos + len(data)
        if end > self.file_size:
            raise ValueError(f"{self.path}: append of {len(data)} bytes at {pos} overflows")
        self._mm[pos:end] = data
        self.wrote_position = end
        return pos

    def stage(self, data: bytes | bytearray | memoryview) -> int:
        """Write at the write position without moving it (readers bounded by the write
        position do not see the bytes yet); :meth:`publish` moves it. Returns the
        file-relative position written."""
        pos = self.wrote_position
        end = pos + len(data)
        if end > self.file_size:
            raise ValueError(f"{self.path}: append of {len(data)} bytes at {pos} overflows")
        self._mm[pos:end] = data
        return pos

    def publish(self, end: int) -> None:
        """Move the write position to ``end``: the staged bytes before it are visible."""
        self.wrote_position = end

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        self._mm[pos : pos + len(data)] = data

    def read(self, pos: int, size: int) -> bytes:
        return self._mm[pos : pos + size]

    def view(self, pos: int, size: int) -> memoryview:
        """``size`` bytes at ``pos`` without a copy. The view keeps the mapping alive:
        :meth:`close` while one is held leaves the unmapping to the view's end, so a
        broker can hand a pull's records to Ray, which copies them once into the
        object store, with the file expiring meanwhile."""
        return memoryview(self._mm)[pos : pos + size]

    @property
    def buffer(self) -> mmap.mmap:
        """The mapping itself, for zero-copy reads by the owner (never keep views)."""
        return self._mm

    def dirty_pages(self) -> int:
        return (self.wrote_position - self.flushed_position) // PAGE

    def flush(self) -> int:
        """Make what was written durable; return the new flushed position."""
        wrote = self.wrote_position
        if wrote > self.flushed_position:
            start = (self.flushed_position // PAGE) * PAGE
            self.sync(start, wrote - start)
            self.flushed_position = wrote
        return self.flushed_position

    def sync(self, start: int = 0, length: int | None = None) -> None:
        """msync ``length`` bytes from ``start`` (page-aligned), the GIL released meanwhile.

        ``mmap.flush`` holds the GIL for the whole msync: a broker's flush of a few
        hundred MiB froze its event loop, and every pull and send with it, for a
        quarter of a second here. Through ctypes the GIL is released. (``fdatasync``
        releases it too, but writes every dirty page of the file: a warmed CommitLog
        file is dirty to its end, which cost SYNC_FLUSH puts of 1 KiB a fifth.)
        """
        if length is None:
            length = self.file_size - start
        if self._fd < 0:
            raise ValueError(f"{self.path}: flush of a closed file")
        if _libc is None:  # pragma: no cover - no C library to call
            self._mm.flush(start, length)
            return
        if _libc.msync(self._address + start, length, _MS_SYNC) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"msync of {self.path}: {os.strerror(err)}")

    def zero_from(self, pos: int, stop_after_zero_run: int | None = None) -> None:
        """Zero the bytes from ``pos`` on, so a truncated tail can never read back.

        With ``stop_after_zero_run``, stop once that many bytes in a row were
        already zero: nothing past such a run is reachable by a record chain
        (a record is shorter than the run), and it spares zeroing (and reading)
        a gigabyte of never-written file after every recovery.
        """
        if pos >= self.file_size:
            return
        step = 1 << 20
        zeros = bytes(step)
        zero_run = 0
        end = pos
        for start in range(pos, self.file_size, step):
            end = min(start + step, self.file_size)
            if self._mm[start:end] == zeros[: end - start]:
                zero_run += end - start
                if stop_after_zero_run is not None and zero_run >= stop_after_zero_run:
                    break
                continue
            zero_run = 0
            self._mm[start:end] = zeros[: end - start]
        first_page = (pos // PAGE) * PAGE
        self.sync(first_page, end - first_page)

    def mtime(self) -> float:
        return os.stat(self.path).st_mtime

    def touch(self) -> None:
        os.utime(self.path, None)

    def stop_warming(self) -> None:
        """Make a warming under way stop at its next chunk (the file is being closed)."""
        self._closing = True

    def close(self) -> None:
        self.stop_warming()
        with self._warm_lock:
            if self._fd >= 0:
                try:
                    self._mm.close()
                except BufferError:  # views are out (see view): unmapped when they go
                    self._mm = _closed_mmap()
                os.close(self._fd)
                self._fd = -1

    def destroy(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, wrote={self.wrote_position})"


class MappedFileQueue:
    """The files of one log (the CommitLog, or one ConsumeQueue) in offset order."""

    def __init__(
        self, directory: Path, file_size: int, *, preallocate: bool = True, warm_new: bool = False
    ):
        self.directory = directory
        self.file_size = file_size
        self.preallocate = preallocate
        self.warm_new = warm_new  # the CommitLog's: its big appends pay for cold pages
        self.files: list[MappedFile] = []
        # the next file, created in the background (AllocateMappedFileService), then warmed
        # there on a thread of its own: a roll waits for the creation (milliseconds), never
        # for the warming (2-3 s for a 1 GiB file: a put that waited for it stalled 2.2 s
        # at each roll of the default 1 GiB CommitLog files)
        self._next: Future[MappedFile] | None = None
        # files allocated ahead of a write (reserve), by start offset, not yet in ``files``
        self._ready: dict[int, MappedFile] = {}
        self._allocator: ThreadPoolExecutor | None = None
        self._warmer: ThreadPoolExecutor | None = None
        # with ``warm_new``, the warming of a file created with nothing prepared (its first
        # writes fault pages in: a 4 MiB put took 4.1 ms into a cold file, 2.2-2.8 ms warm)
        self.warming: Future[bool] | None = None
        # set by close, under the lock ``_warm`` takes: a write or a prepared file's
        # callback that races the close starts no warming thread again
        self._warm_guard = threading.Lock()
        self._closed = False

    def load(self) -> None:
        """Map the existing files; check names, sizes and contiguity."""
        if not self.directory.exists():
            return
        names = sorted(p for p in self.directory.iterdir() if p.is_file())
        while names and names[-1].name.isdigit() and drop_if_empty(names[-1], self.file_size):
            names.pop()
        expected: int | None = None
        for path in names:
            if len(path.name) != 20 or not path.name.isdigit():
                if path.name.endswith(".tmp"):
                    path.unlink()
                    continue
                raise StoreCorruptedError(f"{path}: not a 20-digit offset name")
            offset = int(path.name)
            if offset % self.file_size:
                raise StoreCorruptedError(
                    f"{path}: offset {offset} is not a multiple of the file size {self.file_size}"
                    " (was the store written with another file size?)"
                )
            if expected is not None and offset != expected:
                raise StoreCorruptedError(f"{path}: expected a file starting at {expected}")
            size = path.stat().st_size
            if size > self.file_size:
                raise StoreCorruptedError(
                    f"{path} is {size} bytes, the configured file size is {self.file_size}"
                )
            mf = MappedFile(path, self.file_size, create=False, preallocate=self.preallocate)
            mf.wrote_position = mf.flushed_position = self.file_size
            self.files.append(mf)
            expected = offset + self.file_size
        if self.warm_new and self.files:  # recovery writes on into the last one
            self._warm(self.files[-1])

    # -- lookup
    @property
    def min_offset(self) -> int:
        return self.files[0].from_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        return self.files[-1].end_offset if self.files else 0

    @property
    def flushed_offset(self) -> int:
        for mf in reversed(self.files):
            if mf.flushed_position:
                return mf.from_offset + mf.flushed_position
        return self.min_offset

    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def find(self, offset: int) -> MappedFile | None:
        if not self.files:
            return None
        first = self.files[0].from_offset
        idx = (offset - first) // self.file_size
        if 0 <= idx < len(self.files):
            return self.files[idx]
        return None

    def __iter__(self) -> Iterator[MappedFile]:
        return iter(list(self.files))

    def __len__(self) -> int:
        return len(self.files)

    # -- growth
    def create(self, start_offset: int) -> MappedFile:
        if start_offset % self.file_size:
            raise ValueError(f"start offset {start_offset} not aligned to {self.file_size}")
        last = self.last()
        if last is not None and start_offset != last.from_offset + self.file_size:
            raise ValueError(f"new file at {start_offset} would not follow {last.path.name}")
        mf = self._ready.pop(start_offset, None) or self._take_next(start_offset)
        if mf is None:  # nothing prepared (the first file)
            mf = self._new_file(start_offset)
            if self.warm_new:  # warm it while it is written
                self._warm(mf)
        self.files.append(mf)
        return mf

    def _background(self) -> ThreadPoolExecutor:
        if self._allocator is None:
            self._allocator = ThreadPoolExecutor(1, thread_name_prefix="raymq-allocate")
        return self._allocator

    def _warm(self, mf: MappedFile) -> None:
        """Warm ``mf`` on the warming thread (never the allocating one: a creation must
        not wait behind a warming); nothing once the queue is closed."""
        with self._warm_guard:
            if self._closed:
                return
            if self._warmer is None:
                self._warmer = ThreadPoolExecutor(
                    1, thread_name_prefix="raymq-warm", initializer=_lower_priority
                )
            self.warming = self._warmer.submit(mf.warm)

    def _warm_prepared(self, future: Future[MappedFile]) -> None:
        if future.cancelled() or future.exception() is not None:
            return  # _take_next reports it
        self._warm(future.result())

    def _new_file(self, start_offset: int) -> MappedFile:
        self.directory.mkdir(parents=True, exist_ok=True)
        return MappedFile(
            self.directory / offset_to_name(start_offset),
            self.file_size,
            create=True,
            preallocate=self.preallocate,
        )

    def prepare_next(self) -> None:
        """Create the file after the last one in the background, once, then warm it."""
        last = self.last()
        if last is None or self._next is not None:
            return
        self._next = self._background().submit(self._new_file, last.from_offset + self.file_size)
        self._next.add_done_callback(self._warm_prepared)

    def reserve(self, start_offset: int, end_offset: int) -> None:
        """Allocate now every file a write of ``[start_offset, end_offset)`` will need
        beyond the last one, so that a failed allocation (``DiskFullError``) fails the
        write before any byte of it is written. ``create`` then takes them."""
        last = self.last()
        first = (
            last.from_offset + self.file_size
            if last is not None
            else start_offset - start_offset % self.file_size
        )
        for start in range(first, end_offset, self.file_size):
            if start in self._ready:
                continue
            mf = self._take_next(start)  # prepared in the background (and warming)
            if mf is None:
                mf = self._new_file(start)
                if self.warm_new:  # warm it while it is written
                    self._warm(mf)
            self._ready[start] = mf

    def _take_next(self, start_offset: int) -> MappedFile | None:
        if self._next is None:
            return None
        future, self._next = self._next, None
        try:
            mf = future.result()
        except DiskFullError as exc:
            log.warning("preparing the next mapped file: %s", exc)
            return None
        except Exception:
            log.exception("preparing the next mapped file failed")
            return None
        if mf.from_offset == start_offset:
            return mf
        mf.destroy()
        return None

    def discard_next(self) -> None:
        """Drop the prepared files (before truncation, deletion or close)."""
        for mf in self._ready.values():
            mf.destroy()
        self._ready.clear()
        if self._next is not None:
            future, self._next = self._next, None
            try:
                future.result().destroy()
            except Exception:
                log.exception("preparing the next mapped file failed")

    def last_writable(self, start_offset: int = 0) -> MappedFile:
        """The last file if it has room, else a new one after it."""
        last = self.last()
        if last is None:
            return self.create(start_offset - start_offset % self.file_size)
        if last.is_full:
            return self.create(last.from_offset + self.file_size)
        return last

    # -- flush, truncate, delete
    def flush(self, least_pages: int = 0) -> int:
        """Flush every file with unflushed bytes (with ``least_pages``, only those with
        at least that many dirty pages); return the flushed offset."""
        for mf in self.files:
            if mf.wrote_position > mf.flushed_position and mf.dirty_pages() >= least_pages:
                mf.flush()
        return self.flushed_offset

    def dirty_pages(self) -> int:
        return sum(mf.dirty_pages() for mf in self.files if mf.wrote_position > mf.flushed_position)

    def truncate(self, offset: int, stop_after_zero_run: int | None = None) -> None:
        """Make ``offset`` the end: zero what follows in its file, delete later files."""
        self.discard_next()
        keep: list[MappedFile] = []
        for mf in self.files:
            if mf.from_offset + self.file_size <= offset:
                keep.append(mf)
            elif mf.from_offset <= offset:
                rel = offset - mf.from_offset
                mf.zero_from(rel, stop_after_zero_run)
                mf.wrote_position = rel
                mf.flushed_position = min(mf.flushed_position, rel)
                keep.append(mf)
            else:
                log.warning("deleting %s: past the truncation point %d", mf.path, offset)
                mf.destroy()
        self.files = keep

    def reset_empty(self, start_offset: int) -> None:
        """Drop every file and start over at ``start_offset`` (a queue whose data expired)."""
        self.discard_next()
        for mf in self.files:
            mf.destroy()
        self.files = []
        if start_offset:
            self.create(start_offset - start_offset % self.file_size).wrote_position = (
                start_offset % self.file_size
            )

    def delete_first(self, count: int) -> list[MappedFile]:
        """Delete up to ``count`` leading files; the last file is never deleted."""
        count = min(count, len(self.files) - 1)
        gone = self.files[:count] if count > 0 else []
        for mf in gone:
            mf.destroy()
        self.files = self.files[len(gone) :]
        return gone

    def close(self) -> None:
        with self._warm_guard:
            self._closed = True
        for mf in [*self.files, *self._ready.values()]:  # not to wait for their warming
            mf.stop_warming()
        self.discard_next()
        for pool in (self._allocator, self._warmer):
            if pool is not None:
                pool.shutdown(wait=True)
        self._allocator = self._warmer = None
        for mf in self.files:
            mf.close()
