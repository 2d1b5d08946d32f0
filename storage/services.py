"""The store's background services: each a small thread with one loop.

``GroupCommitService`` (SYNC_FLUSH), ``FlushRealTimeService`` (ASYNC_FLUSH),
``FlushConsumeQueueService`` (ConsumeQueues, index, checkpoint) and
``CleanCommitLogService`` (expiry), as RocketMQ names them. Each logs failures
and keeps going; none holds the put lock for longer than it takes to read an
offset.

They take the store as :class:`ServicedStore`, the part of it they use, so this
module sits below the facade that starts them.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from .batch import EncodedBatch
from .commitlog import CommitLog
from .config import StoreConfig
from .consume_queue import ConsumeQueue
from .message import MessageExt

log = logging.getLogger("raymq.storage.services")

_MIN_GATHER_S = 0.001
_MAX_GATHER_S = 0.01


class ServicedStore(Protocol):
    """What the services use of a store (``MessageStore`` has it)."""

    @property
    def config(self) -> StoreConfig: ...

    @property
    def commitlog(self) -> CommitLog: ...

    def checkpoint_now(self, least_pages: int = 0) -> None: ...

    def clean_expired_files(self) -> int: ...


class DeliveryStore(Protocol):
    """What the delivery services (schedule, timer) use of a store: ``MessageStore``, or
    a DLedger leader's wrapper whose ``_put_encoded`` (the put of a batch the store itself
    encoded, past the checks for clients' batches) goes through the Raft log."""

    @property
    def config(self) -> StoreConfig: ...

    @property
    def commitlog(self) -> CommitLog: ...

    def find_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None: ...

    def query_by_key(self, topic: str, key: str, max_count: int = 64) -> list[MessageExt]: ...

    def now_ms(self) -> int: ...

    def _put_encoded(self, batch: EncodedBatch) -> object: ...


class ServiceThread:
    name = "service"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"raymq-{self.name}", daemon=True)
        self._thread.start()

    def wakeup(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.run_once()
            except Exception:
                log.exception("%s failed; will retry", self.name)

    def run_once(self) -> object:
        raise NotImplementedError


class GroupCommitService(ServiceThread):
    """SYNC_FLUSH: one thread flushes the CommitLog for every put waiting on it.

    A put appends, then waits (:meth:`wait`) for a flush to cover its end. Each
    flush syncs everything written when it starts, so it serves every put that
    appended before it. Before a flush the thread lets the puts the last flush
    released append again: it waits until as many puts wait as waited when the
    last flush ended (the writers under the current load), or for the last flush's
    duration (1 to 10 ms), whichever comes first. Under sustained load one flush
    then serves every writer, not the few that were quick to come back (RocketMQ's
    ``GroupCommitService`` swaps request lists, which batches as well only while an
    fsync is much slower than a put).
    """

    name = "group-commit"

    def __init__(self, commitlog: CommitLog) -> None:
        super().__init__(0.01)
        self.commitlog = commitlog
        self._waiters = threading.Condition()
        self._pending: list[int] = []  # end offsets of the puts waiting, not yet flushed
        self._writers = 1  # puts that wait at once under the current load
        self._last_flush_s = 0.0

    def wait(self, offset: int, timeout_s: float | None) -> bool:
        """Wait until the CommitLog is durable up to ``offset``; False when ``timeout_s``
        ran out first (the flush goes on)."""
        cl = self.commitlog
        if cl.flushed_offset >= offset:
            return True
        with self._waiters:
            self._pending.append(offset)
            self._waiters.notify_all()
        self.wakeup()
        if cl.wait_flushed(offset, timeout_s):
            return True
        with self._waiters:
            if offset in self._pending:
                self._pending.remove(offset)
        return False

    def run_once(self) -> None:
        cl = self.commitlog
        if cl.flushed_offset >= cl.max_offset:
            return
        # gather: while puts keep coming (one at least every gap), until every writer
        # waits; never longer than a few times the last flush took (1 to 10 ms)
        gap_s = max(self._last_flush_s, _MIN_GATHER_S)
        deadline = time.monotonic() + min(gap_s * 4, _MAX_GATHER_S)
        with self._waiters:
            while len(self._pending) < self._writers:
                left = deadline - time.monotonic()
                if left <= 0 or not self._waiters.wait(min(gap_s, left)):
                    self._writers = max(len(self._pending), 1)  # fewer writers now
                    break
        started = time.perf_counter()
        flushed = cl.flush()
        self._last_flush_s = time.perf_counter() - started
        with self._waiters:  # the puts served, and those that came meanwhile: the writers
            waiting = len(self._pending)
            self._pending = [o for o in self._pending if o > flushed]
            self._writers = max(waiting, self._writers, 1)


class FlushRealTimeService(ServiceThread):
    """ASYNC_FLUSH: flush the CommitLog every interval once enough pages are dirty,
    and everything at least every thorough interval."""

    name = "flush-commitlog"

    def __init__(self, store: ServicedStore) -> None:
        cfg = store.config
        super().__init__(cfg.flush_interval_commitlog_ms / 1000)
        self.store = store
        self.least_pages = cfg.flush_commitlog_least_pages
        self.thorough_s = cfg.flush_commitlog_thorough_interval_ms / 1000
        self._last_thorough = time.monotonic()

    def run_once(self) -> None:
        now = time.monotonic()
        thorough = now - self._last_thorough >= self.thorough_s
        if thorough or self.store.commitlog.dirty_pages() >= self.least_pages:
            self.store.commitlog.flush()
            if thorough:
                self._last_thorough = now


class FlushConsumeQueueService(ServiceThread):
    """Flush ConsumeQueues and the index, then record the checkpoint: every interval the
    queues with at least ``flush_consume_queue_least_pages`` dirty pages, every queue at
    least every ``flush_consume_queue_thorough_interval_ms`` (RocketMQ's)."""

    name = "flush-consumequeue"

    def __init__(self, store: ServicedStore) -> None:
        cfg = store.config
        super().__init__(cfg.flush_interval_consume_queue_ms / 1000)
        self.store = store
        self.least_pages = cfg.flush_consume_queue_least_pages
        self.thorough_s = cfg.flush_consume_queue_thorough_interval_ms / 1000
        self._last_thorough = time.monotonic()

    def run_once(self) -> None:
        now = time.monotonic()
        thorough = now - self._last_thorough >= self.thorough_s
        self.store.checkpoint_now(0 if thorough else self.least_pages)
        if thorough:
            self._last_thorough = now


class CleanCommitLogService(ServiceThread):
    """Delete expired CommitLog files (and the ConsumeQueue/index files they orphan)."""

    name = "clean-commitlog"

    def __init__(self, store: ServicedStore) -> None:
        super().__init__(store.config.clean_resource_interval_ms / 1000)
        self.store = store

    def run_once(self) -> None:
        self.store.clean_expired_files()


class DiskWatchService(ServiceThread):
    """Measures the store's disk use when a put finds the last measure stale, off the
    put's thread: ``statvfs`` on a busy disk can take milliseconds, and a broker puts
    on its event loop. Also every ``interval_s`` without puts."""

    name = "disk-watch"

    def __init__(self, store: Any, interval_s: float = 10.0) -> None:
        super().__init__(interval_s)
        self.store = store

    def run_once(self) -> None:
        self.store.measure_disk()
