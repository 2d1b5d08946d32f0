"""The store's background services: each a small thread with one loop.

``FlushRealTimeService`` (ASYNC_FLUSH), ``FlushConsumeQueueService``
(ConsumeQueues, index, checkpoint) and ``CleanCommitLogService`` (expiry), as
RocketMQ names them. Each logs failures and keeps going; none holds the put
lock for longer than it takes to read an offset.

They take the store as :class:`ServicedStore`, the part of it they use, so this
module sits below the facade that starts them.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from .commitlog import CommitLog
from .config import StoreConfig

log = logging.getLogger("raymq.storage.services")


class ServicedStore(Protocol):
    """What the services use of a store (``MessageStore`` has it)."""

    @property
    def config(self) -> StoreConfig: ...

    @property
    def commitlog(self) -> CommitLog: ...

    def checkpoint_now(self) -> None: ...

    def clean_expired_files(self) -> int: ...


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
    """Flush ConsumeQueues and the index, then record the checkpoint."""

    name = "flush-consumequeue"

    def __init__(self, store: ServicedStore) -> None:
        cfg = store.config
        super().__init__(cfg.flush_interval_consume_queue_ms / 1000)
        self.store = store

    def run_once(self) -> None:
        self.store.checkpoint_now()


class CleanCommitLogService(ServiceThread):
    """Delete expired CommitLog files (and the ConsumeQueue/index files they orphan)."""

    name = "clean-commitlog"

    def __init__(self, store: ServicedStore) -> None:
        super().__init__(store.config.clean_resource_interval_ms / 1000)
        self.store = store

    def run_once(self) -> None:
        self.store.clean_expired_files()
