"""The consume threads: a pool that runs ``task(arg)`` calls, started as needed up to
its size, with no future per call.

``concurrent.futures.ThreadPoolExecutor.submit`` made a ``Future`` (with its
``Condition``), a work item and a pass through a Python ``Semaphore`` for every
consume task: an eighth of a PushConsumer's CPU per message at 1,000 single
messages a second. Consume tasks need none of it: their outcome goes back through
the process queue, not through a future. So this pool keeps the executor's behaviour
(a thread is started only when none is idle, up to ``max_threads``; tasks wait their
turn in order; ``shutdown`` drops the tasks not started) on a ``queue.SimpleQueue``
and a count of idle threads under one lock.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("raymq.actors.push_consumer")


class ConsumePool:
    def __init__(self, max_threads: int, name: str) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads={max_threads}: must be at least 1")
        self._max = max_threads
        self._name = name
        self._tasks: queue.SimpleQueue[tuple[Callable[[Any], Any], Any] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a task that no submit has counted on yet
        self._closed = False

    def submit(self, task: Callable[[Any], Any], arg: Any) -> None:
        """Run ``task(arg)`` on a pool thread; ``RuntimeError`` once shut down."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the consume pool is shut down")
            if self._idle:
                self._idle -= 1  # an idle thread takes it
            elif len(self._threads) < self._max:
                thread = threading.Thread(
                    target=self._work,
                    name=f"{self._name}_{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()
            self._tasks.put((task, arg))

    def shutdown(self) -> None:
        """Start no task from here on: those waiting are dropped, the running ones end
        with their call (not waited for)."""
        with self._lock:
            self._closed = True
            threads = len(self._threads)
        while True:
            try:
                self._tasks.get_nowait()
            except queue.Empty:
                break
        for _ in range(threads):
            self._tasks.put(None)

    @property
    def threads(self) -> int:
        """How many threads it started."""
        return len(self._threads)

    def _work(self) -> None:
        tasks = self._tasks
        while True:
            item = tasks.get()
            if item is None:
                return
            task, arg = item
            try:
                task(arg)
            except BaseException:  # noqa: BLE001 - a task's error must not end the thread
                log.exception("consume task %r failed", task)
            with self._lock:
                if self._closed:
                    return
                self._idle += 1
