"""The push consumer's parts that need no Ray: the per-queue buffer and its committed
offset, the settings, broadcasting offsets on disk, session timeouts, retry copies."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from actors import ConsumeFromWhere, MessageModel, PushConsumerConfig
from actors.broker.client.consumer_manager import ConsumerManager
from actors.broker.processor.send_back import send_back_copy
from actors.client.push.consume_concurrently import replaced
from actors.client.push.offset_store import LocalFileOffsetStore
from actors.client.push.process_queue import ProcessQueue
from actors.coordinator.strategies import client_id_room, client_id_with_room
from actors.protocol.wire import SENT_TO_DLQ, SENT_TO_RETRY
from rebalance import MessageQueue
from storage import Message, MessageExt, codec
from storage.errors import InvalidConfigError

MQ = MessageQueue("T", "broker-a", 0)


def stored(topic: str = "T", offset: int = 0, reconsume: int = 0, **kw: Any) -> MessageExt:
    """A message as the store returns it (encoded and decoded for real)."""
    batch = codec.encode_batch([Message(topic, b"body", **kw)], reconsume_times=reconsume)
    m = codec.decode_records(batch.data, check_crc=False)[0]
    return replaced(m, queue_offset=offset, commitlog_offset=1000 + offset)


def test_the_committed_offset_is_the_lowest_offset_not_yet_consumed() -> None:
    pq = ProcessQueue(MQ, 0)
    msgs = [stored(offset=i) for i in range(10)]
    with pq.lock:
        assert pq.add(msgs, 10) == 10
        assert pq.add(msgs[:3], 10) == 0  # a pull answered twice adds nothing
    assert pq.commit_offset() == 0
    with pq.lock:
        pq.remove(msgs[1:6])  # consumed out of order: offset 0 holds the offset back
    assert pq.commit_offset() == 0
    with pq.lock:
        pq.remove(msgs[:1])
    assert pq.commit_offset() == 6
    with pq.lock:
        pq.remove(msgs[6:])
        assert pq.buffered == 0 and pq.size_bytes == 0
    assert pq.commit_offset() == 10  # all consumed: the pull position
    assert [m.queue_offset for m in pq.ready] == list(range(10))


def test_wait_idle_returns_when_the_last_running_task_ends_and_times_out_while_one_runs() -> None:
    """A rebalance dropping a queue waits for its consume tasks (``wait_idle``): the end
    of the last one wakes it; a task still running holds it to its timeout."""
    pq = ProcessQueue(MQ, 0)
    assert pq.wait_idle(0)  # no task: idle at once
    with pq.lock:
        pq.tasks_started(2)
    assert not pq.wait_idle(0.01)
    woken: list[bool] = []
    waiter = threading.Thread(target=lambda: woken.append(pq.wait_idle(30)))
    waiter.start()
    while not pq._idle_waiters:  # the waiter is in its wait (the test's own step)
        waiter.join(0.001)
    with pq.lock:
        pq.task_ended()  # one of two: it waits on
    waiter.join(0.05)
    assert waiter.is_alive() and woken == []
    with pq.lock:
        pq.task_ended()
    waiter.join(30)
    assert woken == [True] and pq._idle_waiters == 0


def test_flow_control_threshold_counts_messages_and_bytes() -> None:
    pq = ProcessQueue(MQ, 0)
    with pq.lock:
        pq.add([stored(offset=i) for i in range(5)], 5)
        assert not pq.over_threshold(5, 1 << 20)
        assert pq.over_threshold(4, 1 << 20)
        assert pq.over_threshold(100, 10)


def test_config_accepts_rocketmq_spellings_and_names_bad_fields() -> None:
    cfg = PushConsumerConfig(model="broadcasting", consume_from="CONSUME_FROM_FIRST_OFFSET")
    assert cfg.model is MessageModel.BROADCASTING and not cfg.clustering
    assert cfg.consume_from is ConsumeFromWhere.FIRST
    assert PushConsumerConfig(heartbeat_interval_s=0.3).session_timeout == 3.0
    assert PushConsumerConfig().session_timeout == 30.0
    for bad, field in (
        ({"model": "FANOUT"}, "model"),
        ({"consume_threads": 0}, "consume_threads"),
        ({"pull_batch_size": 1.5}, "pull_batch_size"),
        ({"max_reconsume_times": -1}, "max_reconsume_times"),
        ({"pull_suspend_s": 0}, "pull_suspend_s"),
        ({"instance_name": "a/b"}, "instance_name"),
        ({"session_timeout_s": 1.0, "heartbeat_interval_s": 2.0}, "session_timeout_s"),
        ({"consume_on_io_thread": "yes"}, "consume_on_io_thread"),
        ({"consume_on_io_thread": True, "orderly": True}, "consume_on_io_thread"),
        ({"consume_on_io_thread": True, "delivery": "pull"}, "consume_on_io_thread"),
        ({"consume_on_io_thread": True, "data_path": "ray"}, "consume_on_io_thread"),
    ):
        with pytest.raises(InvalidConfigError, match=field):
            PushConsumerConfig(**bad)  # type: ignore[arg-type]


def test_strategy_settings_are_checked_and_a_room_travels_in_the_client_id() -> None:
    with pytest.raises(InvalidConfigError, match="needs machine_room"):
        PushConsumerConfig(rebalance_strategy="machine_room_nearby")
    with pytest.raises(InvalidConfigError, match="needs machine_room"):
        PushConsumerConfig(rebalance_strategy="machine_room", coordinated=False)
    with pytest.raises(InvalidConfigError, match="machine_room"):
        PushConsumerConfig(machine_room="r 1")
    with pytest.raises(InvalidConfigError, match="queues"):
        PushConsumerConfig(rebalance_strategy="config", coordinated=False)
    PushConsumerConfig(rebalance_strategy="config", rebalance_options={"queues": [MQ]})
    PushConsumerConfig(model="BROADCASTING", rebalance_strategy="machine_room")  # unused there
    cid = client_id_with_room("host@1@DEFAULT@abcd1234", "r1")
    assert client_id_room(cid) == "r1"
    assert client_id_room("host@1@DEFAULT@abcd1234") is None
    assert client_id_with_room("host@1@DEFAULT@abcd1234", None) == "host@1@DEFAULT@abcd1234"


def test_broadcasting_offsets_survive_a_restart_and_are_never_shared(tmp_path: Path) -> None:
    store = LocalFileOffsetStore(tmp_path, "g", "i1")
    assert store.read(MQ) == -1
    store.commit({MQ: 42}, wait=False)
    with pytest.raises(InvalidConfigError, match="instance_name"):
        LocalFileOffsetStore(tmp_path, "g", "i1")
    other = LocalFileOffsetStore(tmp_path, "g", "i2")
    assert other.read(MQ) == -1
    other.close()
    store.close()
    again = LocalFileOffsetStore(tmp_path, "g", "i1")
    assert again.read(MQ) == 42
    again.close()


def test_a_session_timeout_drops_a_silent_consumer_sooner() -> None:
    now = [0.0]
    cm = ConsumerManager(120.0, clock=lambda: now[0])
    cm.touch("g", "quick", frozenset({"T"}), ttl_s=3.0)
    cm.touch("g", "slow", frozenset({"T"}))
    now[0] = 2.0
    cm.touch("g", "quick")  # a pull: keeps the session timeout it asked for
    assert cm.members("g") == ["quick", "slow"]
    now[0] = 5.5
    assert cm.members("g") == ["slow"]
    now[0] = 121.0
    assert cm.members("g") == []
    cm.touch("g", "c", ttl_s=1000.0)  # never longer than the broker's own limit
    now[0] = 241.5
    assert cm.members("g") == []


def test_retry_copies_keep_the_id_and_count_the_attempts() -> None:
    original = stored(tags="A", keys=["k"], properties={"p": "v"})
    copy, born, where = send_back_copy(original, "g", max_reconsume_times=16, levels=18)
    assert where == SENT_TO_RETRY and copy.topic == "%RETRY%g" and copy.delay_level == 3
    assert born == (original.born_timestamp, original.born_host, 1)
    assert copy.properties is not None
    assert copy.properties["UNIQ_KEY"] == original.msg_id
    assert copy.properties["ORIGIN_MESSAGE_ID"] == original.msg_id
    assert (copy.properties["RETRY_TOPIC"], copy.properties["p"]) == ("T", "v")
    assert (copy.tags, tuple(copy.keys)) == ("A", ("k",))

    again = stored("%RETRY%g", reconsume=5, properties=copy.properties)
    copy2, _, _ = send_back_copy(again, "g", max_reconsume_times=16, levels=6)
    assert copy2.delay_level == 6  # 3 + 5 would pass the last level
    assert copy2.properties is not None and copy2.properties["RETRY_TOPIC"] == "T"

    dead = stored("%RETRY%g", reconsume=16, properties=copy.properties)
    copy3, born3, where3 = send_back_copy(dead, "g", max_reconsume_times=16, levels=18)
    assert (where3, copy3.topic, copy3.delay_level, born3[2]) == (SENT_TO_DLQ, "%DLQ%g", 0, 17)
