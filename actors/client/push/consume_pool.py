"""The consume threads: a pool that runs ``task(arg)`` calls, started as needed up to
its size, with no future per call.

``concurrent.futures.ThreadPoolExecutor.submit`` made a ``Future`` (with its
``Condition``), a work item and a pass through a Python ``Semaphore`` for every
consume task: an eighth of a PushConsumer's CPU per message at 1,000 single
messages a second. Consume tasks need none of it: their outcome goes back through
the process queue, not through a future. So this pool keeps the executor's behaviour
(a thread is started only when none is idle, up to ``max_threads``; tasks wait their
turn in order; ``shutdown`` drops the tasks not started) with a lock of its own.

A task goes to the thread that went idle last, woken by its own lock: threads waiting
on one shared queue are woken in turn, so at a low rate every task ran on another
thread (another stack, cold in the caches) and each wake-up was a race between them;
here the one thread the load needs does the work and the others sleep
(``benchmarks/steady_load.py`` at 1,000 msg/s: the consumer ~20 us of CPU a message
less, and half the time its threads waited for a core).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("raymq.actors.push_consumer")

_Task = tuple[Callable[[Any], Any], Any]


class _Worker:
    """A pool thread's handover: the task it is given and the lock that wakes it."""

    __slots__ = ("task", "wake")

    def __init__(self) -> None:
        self.task: _Task | None = None
        self.wake = threading.Lock()
        self.wake.acquire()  # held while the thread has nothing to do


class ConsumePool:
    def __init__(self, max_threads: int, name: str) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads={max_threads}: must be at least 1")
        self._max = max_threads
        self._name = name
        self._lock = threading.Lock()
        self._waiting: collections.deque[_Task] = collections.deque()  # for a thread
        self._idle: list[_Worker] = []  # the last one went idle last
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, task: Callable[[Any], Any], arg: Any) -> None:
        """Run ``task(arg)`` on a pool thread; ``RuntimeError`` once shut down."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the consume pool is shut down")
            if self._idle:
                worker = self._idle.pop()
                worker.task = (task, arg)
                worker.wake.release()
                return
            if len(self._threads) >= self._max:
                self._waiting.append((task, arg))  # the next thread done takes it
                return
            worker = _Worker()
            worker.task = (task, arg)
            worker.wake.release()
            thread = threading.Thread(
                target=self._work,
                args=(worker,),
                name=f"{self._name}_{len(self._threads)}",
                daemon=True,
            )
            self._threads.append(thread)
            thread.start()

    def shutdown(self) -> None:
        """Start no task from here on: those waiting are dropped, the running ones end
        with their call (not waited for)."""
        with self._lock:
            self._closed = True
            self._waiting.clear()
            idle, self._idle = self._idle, []
        for worker in idle:  # woken with no task: they end
            worker.wake.release()

    @property
    def threads(self) -> int:
        """How many threads it started."""
        return len(self._threads)

    def _work(self, worker: _Worker) -> None:
        lock, waiting, idle = self._lock, self._waiting, self._idle
        while True:
            worker.wake.acquire()
            item, worker.task = worker.task, None
            while item is not None:
                task, arg = item
                try:
                    task(arg)
                except BaseException:  # noqa: BLE001 - a task's error must not end the thread
                    log.exception("consume task %r failed", task)
                with lock:
                    if self._closed:
                        return
                    if waiting:
                        item = waiting.popleft()
                    else:
                        item = None
                        idle.append(worker)
            if self._closed:
                return
