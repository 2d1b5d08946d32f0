"""The consume threads' pool: a thread a task while none is idle, up to its size; tasks
in order; a task's error keeps its thread; shutdown drops what waits."""

from __future__ import annotations

import threading
import time

import pytest

from actors.client.push.consume_pool import ConsumePool


def test_tasks_that_block_each_get_a_thread_up_to_the_size_then_wait_in_order() -> None:
    pool = ConsumePool(3, "t")
    release = threading.Event()
    started: list[int] = []
    lock = threading.Lock()
    all_started = threading.Event()

    def task(i: int) -> None:
        with lock:
            started.append(i)
            if len(started) == 6:
                all_started.set()
        release.wait(10)

    for i in range(6):
        pool.submit(task, i)
    assert pool.threads == 3  # never more than its size
    release.set()
    assert all_started.wait(10)
    assert sorted(started[:3]) == [0, 1, 2] and sorted(started[3:]) == [3, 4, 5]
    pool.shutdown()


def test_one_thread_runs_its_tasks_in_the_order_given() -> None:
    pool = ConsumePool(1, "t")
    release, ran, done = threading.Event(), [], threading.Event()
    pool.submit(lambda _: release.wait(10), None)
    for i in range(50):
        pool.submit(ran.append, i)
    pool.submit(lambda e: e.set(), done)
    release.set()
    assert done.wait(10)
    assert ran == list(range(50))
    pool.shutdown()


def test_a_failing_task_keeps_its_thread_for_the_next(caplog: pytest.LogCaptureFixture) -> None:
    pool = ConsumePool(1, "t")

    def boom(_: object) -> None:
        raise ValueError("listener bug")

    done = threading.Event()
    with caplog.at_level("ERROR", logger="raymq.actors.push_consumer"):
        pool.submit(boom, None)
        pool.submit(lambda e: e.set(), done)
        assert done.wait(5)
    assert pool.threads == 1
    assert "listener bug" in caplog.text
    pool.shutdown()


def test_shutdown_drops_waiting_tasks_and_refuses_new_ones() -> None:
    pool = ConsumePool(1, "t")
    release, ran = threading.Event(), []
    running = threading.Event()

    def first(_: object) -> None:
        running.set()
        release.wait(10)

    pool.submit(first, None)
    assert running.wait(5)
    pool.submit(ran.append, "dropped")
    pool.shutdown()
    release.set()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(ran.append, "refused")
    thread = pool._threads[0]
    thread.join(5)
    assert not thread.is_alive() and ran == []


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ConsumePool(0, "t")


def test_tasks_one_after_another_run_on_the_thread_that_went_idle_last() -> None:
    """At a low rate one thread does the work: the pool wakes the thread idle last, not
    each in turn (the others stay asleep)."""
    pool = ConsumePool(3, "t")
    release = threading.Event()
    both = threading.Barrier(3)

    def hold(_: object) -> None:  # two threads busy at once: the pool starts two
        both.wait(10)
        release.wait(10)

    pool.submit(hold, None)
    pool.submit(hold, None)
    both.wait(10)
    release.set()
    names: list[str] = []
    for _ in range(20):
        done = threading.Event()

        def note(e: threading.Event) -> None:
            names.append(threading.current_thread().name)
            e.set()

        # each after the last one ended and its thread went idle again (no event says
        # so: the pool's idle list is looked at, for 5 s at most)
        deadline = time.monotonic() + 5
        while len(pool._idle) < 2:
            assert time.monotonic() < deadline, "a pool thread never went idle"
            threading.Event().wait(0.001)
        pool.submit(note, done)
        assert done.wait(5)
    assert pool.threads == 2
    assert len(set(names)) == 1, names  # the same thread each time
    pool.shutdown()
