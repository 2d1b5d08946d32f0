"""SharedFuture: futures sharing one lock, settled a batch at a time, behave as
``concurrent.futures.Future`` does for each one's waiter and callbacks."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from actors.protocol.shared_future import SharedFuture, new_lock, settle_all


def test_each_future_of_a_batch_gets_its_own_result_error_and_callbacks() -> None:
    cond = new_lock()
    a, b, c = SharedFuture(cond), SharedFuture(cond), SharedFuture(cond)
    seen: list[tuple[str, object]] = []
    a.add_done_callback(lambda f: seen.append(("a1", f.result())))
    a.add_done_callback(lambda f: seen.append(("a2", f.result())))
    b.add_done_callback(lambda f: seen.append(("b", type(f.exception()).__name__)))
    settle_all(cond, [(a, 1, None), (b, None, ValueError("b's own"))])
    assert seen == [("a1", 1), ("a2", 1), ("b", "ValueError")]
    assert a.result(0) == 1 and a.exception(0) is None
    with pytest.raises(ValueError, match="b's own"):
        b.result(0)
    assert not c.done()
    settle_all(cond, [(a, 99, None)])  # settled already: left as it was
    assert a.result(0) == 1
    late: list[object] = []
    a.add_done_callback(lambda f: late.append(f.result()))  # done: runs at once
    assert late == [1]


def test_a_waiter_is_answered_by_its_own_future_alone() -> None:
    cond = new_lock()
    mine, other = SharedFuture(cond), SharedFuture(cond)
    got: list[object] = []

    def wait() -> None:
        got.append(mine.result(30))

    t = threading.Thread(target=wait)
    t.start()
    while not mine._waiters:  # the thread is blocked on its future (the test's own wait)
        t.join(0.001)
    settle_all(cond, [(other, "not mine", None)])
    t.join(0.2)  # the other's answer must not end its wait: neither it nor a timeout
    assert t.is_alive() and got == []
    settle_all(cond, [(mine, "mine", None)])
    t.join(30)
    assert got == ["mine"] and not mine._waiters


def test_many_threads_waiting_on_one_owner_s_futures_each_get_their_own() -> None:
    """Sync sends from many threads on one connection: each waiter gets its own
    answer, whatever order the answers come in, and a waiter timed out leaves nothing
    behind."""
    cond = new_lock()
    futures = [SharedFuture(cond) for _ in range(32)]
    got: dict[int, object] = {}

    def wait(i: int) -> None:
        got[i] = futures[i].result(30)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for i in reversed(range(32)):
        futures[i].set_result(i) if i % 2 else settle_all(cond, [(futures[i], i, None)])
    for t in threads:
        t.join(30)
    assert got == {i: i for i in range(32)}
    late = SharedFuture(cond)
    with pytest.raises(TimeoutError):
        late.result(0.01)
    assert not late._waiters
    late.set_result("after")
    assert late.result(0) == "after"


def test_timeout_cancel_and_the_module_helpers() -> None:
    cond = new_lock()
    f, g = SharedFuture(cond), SharedFuture(cond)
    with pytest.raises(TimeoutError):
        f.result(0.01)
    with pytest.raises(TimeoutError):
        f.exception(0.01)
    assert f.cancel() is False and not f.cancelled()
    settle_all(cond, [(f, "f", None), (g, None, KeyError("g"))])
    done, not_done = concurrent.futures.wait([f, g], timeout=1)
    assert done == {f, g} and not not_done
    assert [x.done() for x in concurrent.futures.as_completed([f, g], timeout=1)] == [True] * 2


def test_wait_and_as_completed_block_until_other_threads_settle_futures_of_one_lock() -> None:
    """``concurrent.futures.wait`` takes each future's lock in turn (futures of one owner
    share it: reentrant) and is woken by ``set_result``/``set_exception``, which wake no
    condition, through its own waiter; a future is settled once."""
    lock = new_lock()
    f, g, h = SharedFuture(lock), SharedFuture(lock), SharedFuture(lock)
    waited: list[tuple[set[object], set[object]]] = []
    t = threading.Thread(
        target=lambda: waited.append(concurrent.futures.wait([f, g], timeout=30)),  # type: ignore[arg-type]
        daemon=True,  # a wait() that never got its locks must not hold the run's exit
    )
    t.start()
    deadline = time.monotonic() + 10
    while not f._waiters and time.monotonic() < deadline:  # wait() has put its waiters
        t.join(0.001)
    waiting = bool(f._waiters)  # asserted alone: a future's repr takes its lock
    assert waiting, "wait() never got to wait (the shared lock taken twice?)"
    f.set_result("f")
    g.set_exception(KeyError("g"))
    t.join(30)
    done, not_done = waited[0]
    assert done == {f, g} and not not_done and not h.done()
    assert f.result(0) == "f" and isinstance(g.exception(0), KeyError)
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_result("again")
    with pytest.raises(concurrent.futures.InvalidStateError):
        g.set_exception(ValueError("again"))
    assert f.result(0) == "f" and isinstance(g.exception(0), KeyError)
    first = concurrent.futures.as_completed([h, f], timeout=30)
    assert next(first) is f
    h.set_result("h")
    assert next(first) is h


def test_a_result_made_by_the_fast_constructor_is_the_dataclass_s_own() -> None:
    from actors.client.send_result import SendResult, SendStatus, _result
    from rebalance import MessageQueue

    mq = MessageQueue("T", "broker-a", 3)
    fast = _result(SendStatus.SEND_OK, "ID", "OFF", mq, 7)
    plain = SendResult(SendStatus.SEND_OK, "ID", "OFF", mq, 7)
    assert type(fast) is SendResult and fast == plain and hash(fast) == hash(plain)
    assert repr(fast) == repr(plain) and fast.queue_offset == 7
    with pytest.raises(AttributeError):  # still frozen
        fast.queue_offset = 8  # type: ignore[misc]
