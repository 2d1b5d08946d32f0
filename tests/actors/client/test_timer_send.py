"""Timer messages through a real broker: ``send(..., delay_s=...)``, ``send_async`` and
``Message(deliver_at_ms=...)`` arrive no earlier than their time and within about a
second after it, with the id the producer was given."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from raymq_testkit import SMALL_STORE, unique_namespace, wait_until

import actors
from actors import ConsumeStatus, PushConsumer
from storage import Message
from storage.errors import InvalidMessageError


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = actors.start_cluster(
        namespace=unique_namespace("timer"),
        nameservers=1,
        brokers=1,
        store_root=str(tmp_path_factory.mktemp("timer")),
        broker_options={
            "store": {**SMALL_STORE, "timer_wheel_slots": 3600, "timer_roll_window_slots": 600},
            "heartbeat_interval_s": 1.0,
        },
        topics=[actors.TopicConfig("Timed", 1, 1)],
    )
    yield c
    c.shutdown()


def test_timer_messages_arrive_at_their_time_within_a_second(cluster: actors.Cluster) -> None:
    lock = threading.Lock()
    arrivals: dict[str, tuple[float, Any]] = {}

    def listener(messages: list[Any]) -> ConsumeStatus:
        now = time.time()
        with lock:
            for m in messages:
                arrivals.setdefault(m.msg_id, (now, m))
        return ConsumeStatus.SUCCESS

    consumer = PushConsumer(
        "g-timer",
        "Timed",
        listener=listener,
        namespace=cluster.namespace,
        consume_from="FIRST",
        rebalance_interval_s=0.3,
        heartbeat_interval_s=0.3,
        persist_offset_interval_s=0.2,
        pull_suspend_s=1.0,
        pull_retry_delay_s=0.1,
    ).start()
    producer = cluster.producer("p-timer", send_timeout_s=5.0)
    try:
        with pytest.raises(InvalidMessageError, match="delay_s"):
            producer.send(Message("Timed", b"bad"), delay_s=-1)
        now = time.time()
        due: dict[str, tuple[float, bytes]] = {}
        r = producer.send(Message("Timed", b"in-1.5s"), delay_s=1.5)
        due[r.msg_id] = (now + 1.5, b"in-1.5s")
        at = int((now + 2.5) * 1000)
        r = producer.send(Message("Timed", b"at-2.5s", deliver_at_ms=at))
        due[r.msg_id] = (at / 1000, b"at-2.5s")
        r = producer.send_async(Message("Timed", b"async-2s"), delay_s=2.0).result(10)
        due[r.msg_id] = (now + 2.0, b"async-2s")
        r = producer.send(Message("Timed", b"past", deliver_at_ms=int(now * 1000) - 60_000))
        due[r.msg_id] = (now, b"past")
        wait_until(lambda: len(arrivals) >= len(due), timeout_s=15, what="every timer message")
        for msg_id, (when, body) in due.items():
            seen, m = arrivals[msg_id]
            assert m.body == body
            assert "TIMER_DELIVER_MS" not in m.properties
            assert when <= seen <= when + 1.0, (body, seen - when)
    finally:
        consumer.shutdown()
        producer.close()
