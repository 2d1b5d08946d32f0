"""Delayed messages: stored in SCHEDULE_TOPIC_XXXX, delivered when due, once."""

from __future__ import annotations

from pathlib import Path

from storage import Message, MessageStore
from storage.schedule import SCHEDULE_TOPIC, level_for_delay

LEVELS = "1s 5s 10s"
T0 = 1_700_000_000.0


def open_store(path: Path, make_config, clock: list[float]) -> MessageStore:
    cfg = make_config(path, message_delay_level=LEVELS)
    return MessageStore(cfg, clock=lambda: clock[0], start_services=False)


def bodies(store: MessageStore, topic: str, queue_id: int = 0) -> list[bytes]:
    return [m.body for m in store.get("g", topic, queue_id, 0, 1000).messages]


def test_a_delayed_message_waits_in_the_schedule_topic(tmp_path: Path, make_config) -> None:
    clock = [T0]
    with open_store(tmp_path / "s", make_config, clock) as store:
        sent = store.put(
            Message("Real", b"later", tags="T", keys=["k1"], queue_id=2, delay_level=2)
        )
        assert store.max_offset("Real", 2) == 0
        [parked] = store.get("g", SCHEDULE_TOPIC, 1, 0).messages
        assert parked.properties["REAL_TOPIC"] == "Real" and parked.properties["REAL_QID"] == "2"
        clock[0] += 4.9
        assert store.schedule.run_once() == 0
        clock[0] += 0.2
        assert store.schedule.run_once() == 1
        [m] = store.get("g", "Real", 2, 0).messages
        assert (m.body, m.tags, m.keys, m.msg_id) == (b"later", "T", ("k1",), sent.msg_id)
        assert "DELAY" not in m.properties and "REAL_TOPIC" not in m.properties
        assert m.store_timestamp >= parked.store_timestamp + 5000
        assert store.schedule.run_once() == 0, "delivered once"


def test_due_order_and_levels_above_the_top_are_capped(tmp_path: Path, make_config) -> None:
    clock = [T0]
    with open_store(tmp_path / "s", make_config, clock) as store:
        store.put_batch(
            [
                Message("R", b"c", delay_level=3),
                Message("R", b"a", delay_level=1),
                Message("R", b"plain"),
                Message("R", b"z", delay_level=99),
            ]
        )
        assert bodies(store, "R") == [b"plain"]
        clock[0] += 1
        store.schedule.run_once()
        assert bodies(store, "R") == [b"plain", b"a"]
        clock[0] += 9
        store.schedule.run_once()
        assert bodies(store, "R") == [b"plain", b"a", b"c", b"z"]


def test_restart_neither_loses_nor_repeats(tmp_path: Path, make_config) -> None:
    clock = [T0]
    with open_store(tmp_path / "s", make_config, clock) as store:
        store.put_batch([Message("R", f"m{i}".encode(), delay_level=1) for i in range(10)])
        clock[0] += 2
        store.schedule.run_once()
        store.put_batch([Message("R", f"n{i}".encode(), delay_level=1) for i in range(5)])
    with open_store(tmp_path / "s", make_config, clock) as store:
        assert store.schedule.run_once() == 0, "not due yet after the restart"
        clock[0] += 2
        assert store.schedule.run_once() == 5
        assert bodies(store, "R") == [f"m{i}".encode() for i in range(10)] + [
            f"n{i}".encode() for i in range(5)
        ]


def test_crash_between_delivery_and_progress_does_not_repeat(tmp_path: Path, make_config) -> None:
    clock = [T0]
    with open_store(tmp_path / "s", make_config, clock) as store:
        store.put_batch([Message("R", f"m{i}".encode(), delay_level=1) for i in range(4)])
        progress = store.config_file("delayOffset")
        before = progress.load()
        clock[0] += 2
        store.schedule.run_once()
        progress.save(before)  # as if the process died before recording progress
    with open_store(tmp_path / "s", make_config, clock) as store:
        assert store.schedule.run_once() == 0
        assert bodies(store, "R") == [f"m{i}".encode() for i in range(4)]


def test_level_for_delay_rounds_up() -> None:
    levels = (1000, 5000, 10000)
    assert level_for_delay(0, levels) == 0
    assert level_for_delay(0.2, levels) == 1
    assert level_for_delay(1.0, levels) == 1
    assert level_for_delay(1.001, levels) == 2
    assert level_for_delay(3600, levels) == 3
