"""Timer messages (RocketMQ 5's timer wheel): delivered once, at or after their time, in
time order, across rounds of the wheel and restarts; bad times refused; a tick reads only
the due slot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from store_sizes import STORE_SIZES

from storage import Message, MessageStore
from storage.errors import InvalidMessageError, TimerRecallError
from storage.timer import ENTRY_SIZE, TIMER_TOPIC

T0 = 1_700_000_000.0
TICK_S = 0.1
# a small wheel: 64 one-second slots, times over 16 s ahead are parked and rolled
SMALL = dict(timer_wheel_slots=64, timer_roll_window_slots=16, timer_max_delay_ms=600_000)


def anon_rss() -> int:
    """This process's anonymous resident memory (heap, not mapped files), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def open_store(path: Path, make_config, clock: list[float], **overrides: object) -> MessageStore:
    cfg = make_config(path, **{**SMALL, **overrides})
    return MessageStore(cfg, clock=lambda: clock[0], start_services=False)


def at(clock: list[float], seconds: float) -> str:
    return str(int((clock[0] + seconds) * 1000))


def drain(store: MessageStore, topic: str, seen: dict[str, tuple[float, Message]], now: float):
    """Record the first time each newly arrived message of ``topic`` was seen."""
    got = store.get("g", topic, 0, len(seen), 1000).messages
    for m in got:
        assert m.msg_id not in seen, f"{m.body!r} delivered twice"
        seen[m.msg_id] = (now, m)
    return got


def run_until(store: MessageStore, clock: list[float], until: float, topic: str, seen) -> None:
    while clock[0] < until:
        clock[0] = round(clock[0] + TICK_S, 3)
        store.timer.run_once()
        drain(store, topic, seen, clock[0])


def test_each_message_is_delivered_once_at_its_time_in_time_order(
    tmp_path: Path, make_config
) -> None:
    clock = [T0]
    with open_store(tmp_path / "s", make_config, clock) as store:
        wanted = {  # body -> seconds from now (past, near, in one slot, beyond the window
            b"past": -5.0,  # and the wheel: rolled once, and twice more)
            b"near": 0.3,
            b"b": 2.55,
            b"a": 2.2,
            b"same-second": 2.9,
            b"far": 40.0,
            b"farther": 150.5,
        }
        sent = {}
        for body, delay in wanted.items():
            r = store.put(
                Message(
                    "Real",
                    body,
                    tags="T",
                    keys=[f"k-{body.decode()}"],
                    properties={"TIMER_DELIVER_MS": at(clock, delay), "mine": "1"},
                )
            )
            sent[body] = r.msg_id
        # the past one went straight to its topic; the others wait in the timer topic
        assert [m.body for m in store.get("g", "Real", 0, 0).messages] == [b"past"]
        assert store.max_offset(TIMER_TOPIC, 0) == 6
        seen: dict[str, tuple[float, Message]] = {}
        drain(store, "Real", seen, clock[0])
        run_until(store, clock, T0 + 155, "Real", seen)
        assert store.timer.rolled >= 3, "the far ones were parked and put again"
        order = [m.body for _, m in sorted(seen.values(), key=lambda tm: tm[1].queue_offset)]
        assert order == sorted(wanted, key=lambda b: wanted[b])
        for when, m in seen.values():
            due = T0 + max(wanted[m.body], 0)
            assert due <= when < due + TICK_S + 0.01, (m.body, when - due)
            assert (
                m.msg_id == sent[m.body] and m.tags == "T" and m.keys == (f"k-{m.body.decode()}",)
            )
            assert m.properties["mine"] == "1"
            assert not {"TIMER_DELIVER_MS", "REAL_TOPIC", "REAL_QID", "TIMER_ROLL_TIMES"} & set(
                m.properties
            )
        assert store.timer.pending() == 0
        run_until(store, clock, T0 + 160, "Real", seen)  # nothing comes twice


def test_delay_seconds_and_the_message_field(tmp_path: Path, make_config) -> None:
    clock = [T0]
    with open_store(tmp_path / "s", make_config, clock) as store:
        store.put(Message("R", b"sec", properties={"TIMER_DELAY_SEC": "3"}))
        store.put(Message("R", b"field", deliver_at_ms=int((T0 + 1.5) * 1000)))
        seen: dict[str, tuple[float, Message]] = {}
        run_until(store, clock, T0 + 4, "R", seen)
        when = {m.body: t for t, m in seen.values()}
        assert T0 + 1.5 <= when[b"field"] < T0 + 1.6 and T0 + 3 <= when[b"sec"] < T0 + 3.1


@pytest.mark.parametrize(
    "props",
    [
        {"TIMER_DELIVER_MS": "soon"},
        {"TIMER_DELIVER_MS": "-5"},
        {"TIMER_DELIVER_MS": "1.5e12"},
        {"TIMER_DELAY_SEC": "-1"},
        {"TIMER_DELAY_SEC": "601"},  # over timer_max_delay_ms
        {"TIMER_DELIVER_MS": str(int((T0 + 700) * 1000))},
        {"TIMER_DELIVER_MS": "9" * 30},
    ],
)
def test_bad_times_are_refused_and_nothing_is_written(
    tmp_path: Path, make_config, props: dict[str, str]
) -> None:
    clock = [T0]
    with open_store(tmp_path / "s", make_config, clock) as store:
        store.put(Message("R", b"before"))
        end = store.commitlog.max_offset
        good = Message("R", b"good", properties={"TIMER_DELAY_SEC": "5"})
        with pytest.raises(InvalidMessageError, match="TIMER_"):
            store.put_batch([good, Message("R", b"bad", properties=props)])
        assert store.commitlog.max_offset == end
        assert store.max_offset(TIMER_TOPIC, 0) == 0 and store.max_offset("R", 0) == 1


def test_the_timer_topic_and_bad_fields_are_refused(tmp_path: Path, make_config) -> None:
    clock = [T0]
    with open_store(tmp_path / "s", make_config, clock) as store:
        with pytest.raises(InvalidMessageError, match="reserved"):
            store.put(Message(TIMER_TOPIC, b"x"))
        for bad in (-1, 1.5, "123"):
            with pytest.raises(InvalidMessageError, match="deliver_at_ms"):
                store.put(Message("R", b"x", deliver_at_ms=bad))  # type: ignore[arg-type]
        assert store.commitlog.max_offset == 0


def test_pending_timers_survive_a_clean_restart(tmp_path: Path, make_config) -> None:
    clock = [T0]
    with open_store(tmp_path / "s", make_config, clock) as store:
        for i in range(20):
            store.put(
                Message("R", f"m{i}".encode(), properties={"TIMER_DELIVER_MS": at(clock, 1 + i)})
            )
        seen: dict[str, tuple[float, Message]] = {}
        run_until(store, clock, T0 + 5.05, "R", seen)
        assert len(seen) == 5
    clock[0] += 30  # down for 30 s: what fell due meanwhile comes at once, then the rest
    with open_store(tmp_path / "s", make_config, clock) as store:
        assert store.timer_wheel.clean_start
        store.timer.run_once()
        drain(store, "R", seen, clock[0])  # raises on a second copy
        run_until(store, clock, T0 + 60, "R", seen)
        bodies = sorted(int(m.body[1:]) for _, m in seen.values())
        assert bodies == list(range(20)), "none lost, none twice"
        late = [t for t, m in seen.values() if int(m.body[1:]) >= 5]
        assert all(t >= T0 + 35 for t in late) and all(t <= T0 + 35 + TICK_S for t in late[:1])


def test_a_recalled_timer_message_is_never_delivered_even_after_a_restart(
    tmp_path: Path, make_config
) -> None:
    """RecallMessage's store side: a delete marker keeps its message (and only it) from
    delivery, in its own slot, after rolling with a far one, and across a restart; a
    message whose time has come cannot be recalled, and nothing is written then."""
    clock = [T0]
    with open_store(tmp_path / "s", make_config, clock) as store:
        ids = {}
        for body, delay in ((b"keep", 2.0), (b"drop", 2.0), (b"far-drop", 40.0), (b"due", 1.0)):
            ids[body] = store.put(
                Message("R", body, properties={"TIMER_DELIVER_MS": at(clock, delay)})
            ).msg_id
        store.timer.run_once()  # enqueued: "far-drop" parked to roll
        store.timer.recall("R", ids[b"drop"], int((T0 + 2.0) * 1000))
        store.timer.recall("R", ids[b"drop"], int((T0 + 2.0) * 1000))  # again: harmless
        seen: dict[str, tuple[float, Message]] = {}
        run_until(store, clock, T0 + 1.5, "R", seen)
        assert [m.body for _, m in seen.values()] == [b"due"]
        timer_end = store.find_consume_queue(TIMER_TOPIC, 0).max_offset
        with pytest.raises(TimerRecallError, match="has come"):
            store.timer.recall("R", ids[b"due"], int((T0 + 1.0) * 1000))
        with pytest.raises(TimerRecallError):
            store.timer.recall("R", "", int((T0 + 9) * 1000))
        assert store.find_consume_queue(TIMER_TOPIC, 0).max_offset == timer_end
        store.timer.recall("R", ids[b"far-drop"], int((T0 + 40.0) * 1000))
        run_until(store, clock, T0 + 3, "R", seen)
        assert sorted(m.body for _, m in seen.values()) == [b"due", b"keep"]
        assert store.timer.recalled == 1  # "drop"; "far-drop" is not due yet
    with open_store(tmp_path / "s", make_config, clock) as store:  # the markers are kept
        run_until(store, clock, T0 + 45, "R", seen)
        assert sorted(m.body for _, m in seen.values()) == [b"due", b"keep"]
        assert store.timer.recalled == 1  # "far-drop", after its roll and the restart
        assert store.timer.pending() == 0


CHILD = textwrap.dedent(
    """
    import json, sys
    from storage import Message, MessageStore, StoreConfig
    cfg = StoreConfig(**json.loads(sys.argv[1]))
    clock = [float(sys.argv[2])]
    store = MessageStore(cfg, clock=lambda: clock[0], start_services=False)
    t0 = clock[0]
    for i in range(60):  # one every 100 ms from 1 s on
        store.put(Message("R", f"m{i}".encode(), keys=[f"k{i}"],
                          properties={"TIMER_DELIVER_MS": str(int((t0 + 1 + i / 10) * 1000))}))
    delivered = 0
    while clock[0] < t0 + 3.55:  # about half delivered; the checkpoint may lag behind
        clock[0] = round(clock[0] + 0.05, 3)
        delivered += store.timer.run_once()
    for i in range(60, 70):  # put, never enqueued into the wheel before the crash
        store.put(Message("R", f"m{i}".encode(),
                          properties={"TIMER_DELIVER_MS": str(int((t0 + 8) * 1000))}))
    store.commitlog.flush()
    print(delivered, flush=True)
    sys.stdin.read()
    """
)


@pytest.mark.parametrize("sizes", STORE_SIZES, indirect=True)
def test_a_killed_process_loses_no_timer_and_repeats_none(tmp_path: Path, make_config) -> None:
    cfg = make_config(tmp_path / "s", **SMALL)
    args = {
        k: getattr(cfg, k)
        for k in (
            "store_dir",
            "commitlog_file_size",
            "consume_queue_file_entries",
            "index_hash_slots",
            "index_max_entries",
            "max_message_size",
            "store_host",
            "timer_wheel_slots",
            "timer_roll_window_slots",
            "timer_max_delay_ms",
        )
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(args), str(T0)],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    delivered_before = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 20 <= delivered_before < 60
    assert (tmp_path / "s" / "abort").exists()
    clock = [T0 + 3.6]
    with MessageStore(cfg, clock=lambda: clock[0], start_services=False) as store:
        assert store.abnormal_start and not store.timer_wheel.clean_start
        assert store.max_offset("R", 0) == delivered_before
        seen: dict[str, tuple[float, Message]] = {}
        drain(store, "R", seen, clock[0])
        run_until(store, clock, T0 + 9, "R", seen)
        bodies = sorted(int(m.body[1:]) for _, m in seen.values())
        assert bodies == list(range(70)), "every timer delivered, exactly once"
        for when, m in seen.values():
            i = int(m.body[1:])
            if i >= delivered_before:
                due = T0 + (8 if i >= 60 else 1 + i / 10)
                assert due <= when < due + TICK_S + 0.01


def test_a_hundred_thousand_pending_cost_little_and_a_tick_reads_one_slot(
    tmp_path: Path, make_config
) -> None:
    clock = [T0]
    n, seconds = 100_000, 1000
    with open_store(
        tmp_path / "s",
        make_config,
        clock,
        commitlog_file_size=64 << 20,
        consume_queue_file_entries=200_000,
        index_hash_slots=200_003,
        index_max_entries=400_000,
        timer_wheel_slots=4096,
        timer_roll_window_slots=2048,
        timer_max_delay_ms=2_000_000,
    ) as store:
        base = int(T0 * 1000) + 10_000
        for start in range(0, n, 5000):
            store.put_batch(
                [
                    Message(
                        "R", b"x", properties={"TIMER_DELIVER_MS": str(base + (i % seconds) * 1000)}
                    )
                    for i in range(start, start + 5000)
                ]
            )
        before = anon_rss()
        store.timer.run_once()  # enqueue all 100k into the wheel
        assert store.timer.pending() == n
        # the process's own memory (not the files it maps) barely grows: nothing is kept
        # per pending message (100k small Python objects alone would be ~10 MB)
        grown = anon_rss() - before
        assert grown < 4 << 20, grown
        # on disk: one 40-byte log entry each, plus the touched pages of the wheel
        assert store.timer_wheel.disk_bytes() <= n * ENTRY_SIZE + 4096 * 32 + 8192
        # each tick reads only the due slot's chain: 100 entries of the 100k
        read_before = store.timer.entries_read
        clock[0] = T0 + 10.05
        assert store.timer.run_once() == n // seconds
        assert store.timer.entries_read - read_before == n // seconds
        clock[0] = T0 + 11.05
        assert store.timer.run_once() == n // seconds
        assert store.timer.entries_read - read_before == 2 * n // seconds
        assert store.timer.pending() == n - 2 * n // seconds


def test_a_timer_log_with_a_torn_last_entry_reads_back_its_whole_entries(tmp_path: Path) -> None:
    import numpy as np

    from storage.timer import ENTRY, TimerLog

    log = TimerLog(tmp_path / "timerlog", 4 * ENTRY_SIZE)  # files of 4 entries
    entries = np.zeros(6, dtype=ENTRY)
    entries.view(np.uint8)[:] = np.arange(6 * ENTRY_SIZE) % 251  # every byte told apart
    log.append(entries)
    log.flush()
    last = sorted((tmp_path / "timerlog").iterdir())[-1]
    with open(last, "ab") as f:
        f.write(b"\x07" * (ENTRY_SIZE - 1))  # a crash in the middle of an entry
    read, positions = log.read_all(log.end + ENTRY_SIZE)
    assert read.tobytes() == entries.tobytes()
    assert positions.tolist() == [ENTRY_SIZE * i for i in range(6)]
    log.close()
