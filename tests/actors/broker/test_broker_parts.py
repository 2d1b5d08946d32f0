"""The broker's parts that need no Ray: topics, offsets, consumers, held pulls, fault table."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from pathlib import Path

import pytest

from actors.broker.client.consumer_manager import ConsumerManager
from actors.broker.longpolling.pull_hold_service import PullRequestHoldService
from actors.broker.offset.consumer_offset_manager import ConsumerOffsetManager
from actors.broker.processor.subscribe import Wakeup
from actors.broker.topic.topic_config_manager import TopicConfigManager
from actors.client.fault import LatencyFaultTolerance
from actors.protocol.topic import AUTO_CREATE_TOPIC_KEY, TopicConfig
from storage.config_files import JsonConfigFile
from storage.errors import InvalidMessageError, PermissionDeniedError, TopicNotFoundError


def test_topics_persist_in_rocketmq_layout(tmp_path: Path) -> None:
    file = JsonConfigFile(tmp_path / "topics.json")
    topics = TopicConfigManager(file, "broker-a", auto_create=False, default_queue_nums=8)
    topics.put(TopicConfig("T", 2, 3, 6))
    data = json.loads((tmp_path / "topics.json").read_text())
    assert data["topicConfigTable"]["T"]["writeQueueNums"] == 3
    again = TopicConfigManager(file, "broker-a", auto_create=False, default_queue_nums=8)
    assert again.get("T") == TopicConfig("T", 2, 3, 6)
    assert again.get(AUTO_CREATE_TOPIC_KEY) is None


def test_topic_checks_for_write_and_read(tmp_path: Path) -> None:
    topics = TopicConfigManager(
        JsonConfigFile(tmp_path / "t.json"), "b", auto_create=False, default_queue_nums=8
    )
    with pytest.raises(TopicNotFoundError, match="auto_create_topic_enable is off"):
        topics.for_write("T", 0)
    topics.put(TopicConfig("R", perm=4))
    topics.put(TopicConfig("W", 2, 2, perm=2))
    with pytest.raises(PermissionDeniedError, match="writing is forbidden"):
        topics.for_write("R", 0)
    with pytest.raises(PermissionDeniedError, match="reading is forbidden"):
        topics.for_read("W", 0)
    with pytest.raises(InvalidMessageError, match="write_queue_nums=2"):
        topics.for_write("W", 2)


def test_auto_create_uses_the_smaller_queue_count(tmp_path: Path) -> None:
    topics = TopicConfigManager(
        JsonConfigFile(tmp_path / "t.json"), "b", auto_create=True, default_queue_nums=8
    )
    assert topics.get(AUTO_CREATE_TOPIC_KEY) is not None
    tc, created = topics.for_write("New", 1, auto_create_queue_nums=4)
    assert created and tc.write_queue_nums == 4
    assert topics.for_write("New", 0)[1] is False


def test_offsets_persist_as_topic_at_group(tmp_path: Path) -> None:
    file = JsonConfigFile(tmp_path / "consumerOffset.json")
    offsets = ConsumerOffsetManager(file)
    assert offsets.query("g", "T", 0) == -1
    offsets.commit("g", "T", 0, 42)
    offsets.commit("g", "T", 3, 7)
    assert offsets.persist()
    assert not offsets.persist()  # nothing changed since
    data = json.loads((tmp_path / "consumerOffset.json").read_text())
    assert data == {"offsetTable": {"T@g": {"0": 42, "3": 7}}}
    again = ConsumerOffsetManager(file)
    assert again.query_topic("g", "T") == {0: 42, 3: 7}
    assert again.topics_of("g") == ["T"]
    # the one-phase commit markers whose offsets the table holds: saved with it, never back
    again.mark_markers(5)
    again.mark_markers(3)
    assert again.persist()
    assert json.loads((tmp_path / "consumerOffset.json").read_text())["txnMarkersApplied"] == 5
    assert ConsumerOffsetManager(file).txn_markers == 5


def test_offsets_saved_from_many_threads_at_once_keep_every_commit(tmp_path: Path) -> None:
    """The periodic save and transactional commits save the offsets from the broker's I/O
    threads at once. Each commit is on disk when its save returns, whatever the other
    saves do: none fails, and none leaves an older table on disk after a newer one (two
    saves at once used to rename each other's temp file away, and the older could win)."""
    file = JsonConfigFile(tmp_path / "consumerOffset.json")
    offsets = ConsumerOffsetManager(file)
    for g in range(300):  # a table that takes a while to write
        for q in range(16):
            offsets.commit(f"g{g}", "T", q, 1)
    errors: list[BaseException] = []

    def commit_and_save(k: int) -> None:
        try:
            for i in range(30):
                offsets.commit(f"w{k}", "T", 0, i)
                offsets.persist()
                saved = json.loads((tmp_path / "consumerOffset.json").read_text())
                assert saved["offsetTable"][f"T@w{k}"]["0"] >= i
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=commit_and_save, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    again = ConsumerOffsetManager(file)
    assert [again.query(f"w{k}", "T", 0) for k in range(8)] == [29] * 8


def test_consumers_expire() -> None:
    now = [0.0]
    consumers = ConsumerManager(120.0, clock=lambda: now[0])
    consumers.touch("g", "c1")
    now[0] = 100.0
    consumers.touch("g", "c2")
    assert consumers.members("g") == ["c1", "c2"]
    now[0] = 150.0
    assert consumers.members("g") == ["c2"]


def test_held_pull_is_woken_from_another_thread() -> None:
    async def scenario() -> float:
        holds = PullRequestHoldService(asyncio.get_running_loop())
        fut = holds.register("T", 0)
        holds.on_dispatch("T", 1, 5)  # another queue: no wake-up
        threading.Timer(0.05, holds.on_dispatch, ("T", 0, 1)).start()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await holds.wait("T", 0, fut, 5.0)
        assert holds.held == 0 and holds.woken == 1
        return loop.time() - started

    assert asyncio.run(scenario()) < 2.0


def test_held_pull_is_woken_at_once_by_a_put_on_the_loop_itself() -> None:
    async def scenario() -> None:
        holds = PullRequestHoldService(asyncio.get_running_loop())
        fut = holds.register("T", 0)
        holds.on_dispatch("T", 0, 1)  # an inline put: no hand-over through the loop
        assert fut.done() and holds.woken == 1 and holds.held == 0

    asyncio.run(scenario())


def test_one_held_pull_of_several_queues_is_woken_by_any_and_leaves_them_all() -> None:
    async def scenario() -> None:
        holds = PullRequestHoldService(asyncio.get_running_loop())
        keys = [("T", 0), ("T", 1), ("U", 0)]
        fut = holds.register_many(keys)
        assert holds.held == 3  # one waiter, listed under each queue
        holds.on_dispatch("U", 1, 1)  # a queue it does not wait on
        assert not fut.done()
        holds.on_dispatch("T", 1, 1)
        await holds.wait_many(keys, fut, 5.0)
        assert fut.done() and holds.woken == 1 and holds.held == 0
        # timed out: gone from every queue too
        fut = holds.register_many(keys)
        await holds.wait_many(keys, fut, 0.01)
        assert holds.held == 0 and holds.woken == 1

    asyncio.run(scenario())


def test_a_subscription_wakeup_set_before_its_wait_is_not_missed() -> None:
    """The stream's wake-up: a dispatch between its clear and its wait (on the loop, as
    the hold service calls it) ends the wait at once; after a clear it waits again."""

    async def scenario() -> None:
        wake = Wakeup()
        wake.clear()
        wake.set()  # a dispatch before the wait
        await asyncio.wait_for(wake.wait(), 5.0)
        wake.clear()
        waiting = asyncio.ensure_future(wake.wait())
        await asyncio.sleep(0)
        assert not waiting.done()  # cleared: it waits
        holds = PullRequestHoldService(asyncio.get_running_loop())
        holds.listen(("T", 0), wake.set)
        holds.on_dispatch("T", 0, 1)  # on the loop's thread: woken at once
        await asyncio.wait_for(waiting, 5.0)
        assert wake.is_set() and holds.woken == 1

    asyncio.run(scenario())


def test_held_pull_times_out() -> None:
    async def scenario() -> None:
        holds = PullRequestHoldService(asyncio.get_running_loop())
        fut = holds.register("T", 0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await holds.wait("T", 0, fut, 0.05)
        assert loop.time() - started >= 0.05
        assert holds.held == 0 and holds.woken == 0  # timed out, not woken

    asyncio.run(scenario())


def test_a_cancelled_held_pull_leaves_nothing_behind() -> None:
    async def scenario() -> None:
        holds = PullRequestHoldService(asyncio.get_running_loop())
        fut = holds.register("T", 0)
        task = asyncio.ensure_future(holds.wait("T", 0, fut, 30.0))
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert holds.held == 0
        holds.on_dispatch("T", 0, 1)  # nobody waits: nothing to wake
        assert holds.woken == 0

    asyncio.run(scenario())


def test_latency_fault_tolerance() -> None:
    now = [0.0]
    fault = LatencyFaultTolerance(isolation_s=10.0, clock=lambda: now[0])
    fault.update("a", 0.01)
    assert fault.is_available("a")
    fault.update("a", 20.0)  # >= 15 s: out for RocketMQ 5's longest, 30 s
    assert not fault.is_available("a")
    fault.update("b", 0.0, failed=True)
    now[0] = 11.0
    assert fault.is_available("b") and not fault.is_available("a")
    assert fault.least_bad(["a"]) == "a"
    now[0] = 30.5
    assert fault.is_available("a")
    fault.update("c", 0.6)  # >= 550 ms: out for 2 s
    assert not fault.is_available("c")
    now[0] = 32.6
    assert fault.is_available("c")


def test_a_fast_answer_lifts_an_isolation_and_leaves_others_alone() -> None:
    fault = LatencyFaultTolerance(isolation_s=10.0, clock=lambda: 0.0)
    fault.update("a", 0.0, failed=True)
    fault.update("b", 0.6)  # >= 550 ms: out for 2 s
    fault.update("c", 0.3)  # under 550 ms, nothing isolated: nothing changes
    assert fault.snapshot() == {"a": 10.0, "b": 2.0}
    fault.update("a", 0.01)  # a fast answer from an isolated broker: back at once
    assert fault.is_available("a") and not fault.is_available("b")
    assert fault.snapshot() == {"b": 2.0}


def test_an_isolated_broker_is_available_again_once_its_route_names_another_master() -> None:
    now = [0.0]
    fault = LatencyFaultTolerance(isolation_s=10.0, clock=lambda: now[0])
    fault.update("a", 3.5, master="broker-a-0@10.0.0.1:4000")  # FLUSH_SLAVE_TIMEOUT's wait
    assert not fault.is_available("a", "broker-a-0@10.0.0.1:4000")
    assert not fault.is_available("a")  # no route to compare with: still out
    assert fault.is_available("a", "broker-a-1@10.0.0.2:4000")  # the slave promoted
    assert fault.is_available("a", "broker-a-0@10.0.0.1:4000")  # and the isolation is over
    fault.update("a", 0.0, failed=True, master="broker-a-0@10.0.0.1:4000")
    assert fault.is_available("a", "broker-a-0@10.0.0.1:4100")  # restarted: another port
