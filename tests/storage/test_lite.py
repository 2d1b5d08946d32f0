"""Lite topics on a real store in a temp dir (storage.lite): order, resume, TTL, quota,
names, recovery after a crash and from the CommitLog alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from store_sizes import small_config

from storage import GetStatus, InvalidMessageError, Message, MessageStore, encode_batch
from storage.lite import (
    PROP_LITE_TOPIC,
    IllegalLiteTopicError,
    LiteConfig,
    LiteStore,
    LiteTopicQuotaExceededError,
    NotALiteParentError,
)

SMALL = LiteConfig(index_file_entries=64, expire_slice=5)  # files roll every 64 messages
HOUR_MS = 3_600_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def open_lite(path: Path, clock: Clock | None = None, **overrides: object):
    store = MessageStore(
        small_config(path, **overrides), clock=clock or Clock(), start_services=False
    )
    lite = LiteStore(store, SMALL)
    lite.declare_parent("Chat", quota=50, ttl_ms=HOUR_MS)
    return store, lite


def bodies(lite: LiteStore, topic: str, offset: int = 0, count: int = 1000) -> list[bytes]:
    got = lite.get("Chat", topic, offset, count)
    return [m.body for m in got.messages]


def test_each_lite_topic_keeps_its_order_across_batches_and_files(tmp_path: Path) -> None:
    store, lite = open_lite(tmp_path / "s")
    want: dict[str, list[bytes]] = {f"s{k}": [] for k in range(5)}
    for i in range(120):  # single puts and mixed batches, interleaved
        if i % 3:
            topic = f"s{i % 5}"
            lite.put("Chat", topic, Message("Chat", f"{topic}-{i}".encode()))
            want[topic].append(f"{topic}-{i}".encode())
        else:
            items = [(f"s{(i + j) % 5}", Message("Chat", f"b{i}-{j}".encode())) for j in range(4)]
            result = lite.put_batch("Chat", items)
            for (topic, m), off in zip(items, result.lite_offsets.tolist()):
                assert off == len(want[topic])
                want[topic].append(m.body)
    assert len(lite.index.files) > 3  # the chains cross index files
    for topic, expected in want.items():
        assert lite.max_offset("Chat", topic) == len(expected)
        assert bodies(lite, topic) == expected
        got = lite.get("Chat", topic, 0, 1000)
        assert all(m.properties[PROP_LITE_TOPIC] == topic for m in got.messages)
    lite.close()
    store.close()
    store, lite = open_lite(tmp_path / "s")  # and the same after a restart
    for topic, expected in want.items():
        assert bodies(lite, topic) == expected
    lite.close()
    store.close()


def test_a_resume_from_an_offset_gets_exactly_what_follows_it(tmp_path: Path) -> None:
    store, lite = open_lite(tmp_path / "s")
    for i in range(300):
        lite.put("Chat", "tokens", Message("Chat", f"t{i}".encode()))
        if i % 2:
            lite.put("Chat", "other", Message("Chat", b"x"))
    for k in range(300):
        for count in (1, 7, 32):
            got = lite.get("Chat", "tokens", k, count)
            assert got.status is GetStatus.FOUND
            assert [m.body for m in got.messages] == [
                f"t{i}".encode() for i in range(k, min(300, k + count))
            ]
            assert got.next_offset == min(300, k + count)
    assert lite.get("Chat", "tokens", 300).status is GetStatus.OFFSET_OVERFLOW_ONE
    assert lite.get("Chat", "tokens", 301).status is GetStatus.OFFSET_OVERFLOW_BADLY
    assert lite.get("Chat", "nobody", 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    lite.close()
    store.close()


def test_a_lite_topic_expires_a_ttl_after_its_last_write_and_stays_expired(
    tmp_path: Path,
) -> None:
    clock = Clock()
    store, lite = open_lite(tmp_path / "s", clock)
    lite.put("Chat", "old", Message("Chat", b"o1"))
    lite.put("Chat", "busy", Message("Chat", b"b1"))
    assert lite.create("Chat", "quiet")  # created by a subscription: no message
    clock.now += 0.6 * HOUR_MS / 1000
    lite.put("Chat", "busy", Message("Chat", b"b2"))
    clock.now += 0.6 * HOUR_MS / 1000  # old and quiet: 1.2 h since a write; busy: 0.6 h
    assert lite.expire() == 2
    assert lite.lite_topics("Chat") == ["busy"] and lite.count("Chat") == 1
    assert lite.get("Chat", "old", 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert bodies(lite, "busy") == [b"b1", b"b2"]
    # a new lite topic takes a freed id: the old topic's entries are not its own
    lite.put("Chat", "fresh", Message("Chat", b"f1"))
    lite.put("Chat", "old", Message("Chat", b"o2"))  # created anew, from offset 0
    assert bodies(lite, "old") == [b"o2"] and bodies(lite, "fresh") == [b"f1"]
    lite.close()
    store.close()
    store, lite = open_lite(tmp_path / "s", clock)
    assert sorted(lite.lite_topics("Chat")) == ["busy", "fresh", "old"]
    assert bodies(lite, "old") == [b"o2"] and bodies(lite, "fresh") == [b"f1"]
    assert bodies(lite, "busy") == [b"b1", b"b2"]
    clock.now += 2 * HOUR_MS / 1000
    assert lite.expire() == 3 and lite.count() == 0
    lite.close()
    store.close()


def test_the_quota_of_a_parent_refuses_new_lite_topics_and_writes_nothing(
    tmp_path: Path,
) -> None:
    store, lite = open_lite(tmp_path / "s")
    lite.declare_parent("Small", quota=3)
    lite.put_batch("Small", [("a", Message("Small", b"1")), ("b", Message("Small", b"2"))])
    end = store.commitlog.max_offset
    with pytest.raises(LiteTopicQuotaExceededError, match="quota of 3"):
        lite.put_batch("Small", [("c", Message("Small", b"3")), ("d", Message("Small", b"4"))])
    assert store.commitlog.max_offset == end and lite.lite_topics("Small") == ["a", "b"]
    lite.put("Small", "c", Message("Small", b"3"))  # the third fits
    with pytest.raises(LiteTopicQuotaExceededError):
        lite.create("Small", "d")
    end = store.commitlog.max_offset
    with pytest.raises(LiteTopicQuotaExceededError, match="quota of 3"):  # one message
        lite.put("Small", "d", Message("Small", b"4"))
    assert store.commitlog.max_offset == end and not lite.exists("Small", "d")
    lite.put("Small", "a", Message("Small", b"5"))  # a full parent takes writes to its own
    assert lite.max_offset("Small", "a") == 2 and lite.count("Small") == 3
    lite.close()
    store.close()


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 129, "über", "a b", None, 7, "a\x01b"])
def test_a_bad_lite_topic_name_is_refused_clearly_and_changes_nothing(
    tmp_path: Path, bad: object
) -> None:
    store, lite = open_lite(tmp_path / "s")
    lite.put("Chat", "ok", Message("Chat", b"1"))
    end, names = store.commitlog.max_offset, (lite.root / "names").stat().st_size
    items = [("ok", Message("Chat", b"2")), (bad, Message("Chat", b"3"))]
    with pytest.raises(IllegalLiteTopicError, match="lite topic .* must be 1 to 128"):
        lite.put_batch("Chat", items)  # type: ignore[list-item]
    with pytest.raises(IllegalLiteTopicError):
        lite.create("Chat", bad)  # type: ignore[arg-type]
    assert store.commitlog.max_offset == end
    assert (lite.root / "names").stat().st_size == names
    assert lite.lite_topics("Chat") == ["ok"] and lite.max_offset("Chat", "ok") == 1
    lite.close()
    store.close()


def test_what_a_lite_put_refuses(tmp_path: Path) -> None:
    store, lite = open_lite(tmp_path / "s")
    with pytest.raises(NotALiteParentError, match="'Plain' is not a parent"):
        lite.put("Plain", "a", Message("Plain", b"1"))
    with pytest.raises(InvalidMessageError, match="has topic='Other'"):
        lite.put("Chat", "a", Message("Other", b"1"))
    with pytest.raises(InvalidMessageError, match="no delay, timer or transaction"):
        lite.put("Chat", "a", Message("Chat", b"1", delay_level=2))
    plain = encode_batch(
        [Message("Chat", b"1"), Message("Chat", b"2", properties={PROP_LITE_TOPIC: "a"})]
    )
    with pytest.raises(InvalidMessageError, match="1 of 2 records name no lite topic"):
        lite.put_encoded("Chat", plain)
    assert store.commitlog.max_offset == 0 and lite.count() == 0
    # the broker's path: a batch the producer encoded, naming its lite topics
    batch = encode_batch(
        [
            Message("Chat", f"{i}".encode(), properties={PROP_LITE_TOPIC: f"t{i % 2}"})
            for i in range(6)
        ]
    )
    assert lite.put_encoded("Chat", batch).lite_offsets.tolist() == [0, 0, 1, 1, 2, 2]
    assert bodies(lite, "t1") == [b"1", b"3", b"5"]
    lite.close()
    store.close()


def test_index_files_leave_with_the_commitlog_and_reads_say_where_data_starts(
    tmp_path: Path,
) -> None:
    store, lite = open_lite(tmp_path / "s", commitlog_file_size=32 * 1024)
    body = b"x" * 400
    for i in range(400):  # about 6 commitlog files, 7 index files
        lite.put("Chat", "long", Message("Chat", body + str(i).encode()))
    store._disk_usage = lambda: 0.99  # over disk_max_used_ratio: the oldest files go now
    assert store.clean_expired_files() > 0
    assert lite.clean_expired_files() > 0
    got = lite.get("Chat", "long", 0, 10)
    assert got.status is GetStatus.OFFSET_TOO_SMALL and got.next_offset > 0
    resumed = lite.get("Chat", "long", got.next_offset, 1000)
    assert resumed.status is GetStatus.FOUND
    assert [m.body for m in resumed.messages] == [
        body + str(i).encode() for i in range(got.next_offset, 400)
    ]
    lite.close()
    store.close()


def test_the_lite_store_is_rebuilt_from_the_commitlog_alone(tmp_path: Path) -> None:
    store, lite = open_lite(tmp_path / "s")
    for i in range(200):
        lite.put("Chat", f"s{i % 9}", Message("Chat", f"{i}".encode()))
    want = {f"s{k}": bodies(lite, f"s{k}") for k in range(9)}
    lite.close()
    store.close()
    for path in sorted((tmp_path / "s" / "lite").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    store, lite = open_lite(tmp_path / "s")
    assert {t: bodies(lite, t) for t in lite.lite_topics("Chat")} == want
    lite.close()
    store.close()


CHILD = textwrap.dedent(
    """
    import json, sys
    from storage import Message, MessageStore, StoreConfig
    from storage.lite import LiteConfig, LiteStore
    store = MessageStore(StoreConfig(**json.loads(sys.argv[1])))
    lite = LiteStore(store, LiteConfig(index_file_entries=64))
    lite.declare_parent("Chat")
    i = 0
    while True:
        items = [(f"s{(i + j) % 11}", Message("Chat", f"m{i + j}".encode())) for j in range(1 + i % 3)]
        result = lite.put_batch("Chat", items)
        for (topic, _), off in zip(items, result.lite_offsets.tolist()):
            print(json.dumps([topic, off]), flush=True)
        i += len(items)
    """
)


@pytest.mark.parametrize("index_lost", [False, True], ids=["killed", "killed-index-lost"])
def test_a_crash_under_sync_flush_keeps_every_acknowledged_lite_message(
    tmp_path: Path, index_lost: bool
) -> None:
    cfg = small_config(tmp_path / "s", flush_disk_type="SYNC_FLUSH")
    args = {
        k: getattr(cfg, k)
        for k in (
            "store_dir",
            "flush_disk_type",
            "commitlog_file_size",
            "consume_queue_file_entries",
            "index_hash_slots",
            "index_max_entries",
            "max_message_size",
            "store_host",
        )
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(args)], stdout=subprocess.PIPE, text=True
    )
    acked: list[tuple[str, int]] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        topic, off = json.loads(line)
        acked.append((topic, off))
        if len(acked) >= 600:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (tmp_path / "s" / "abort").exists()
    lite_dir = tmp_path / "s" / "lite"
    if index_lost:  # a power cut before the index reached the disk: its last file blank
        last = sorted((lite_dir / "index").iterdir())[-1]
        last.write_bytes(bytes(last.stat().st_size))
        (lite_dir / "checkpoint").unlink(missing_ok=True)
    store = MessageStore(cfg)
    assert store.abnormal_start
    lite = LiteStore(store, LiteConfig(index_file_entries=64))
    if index_lost:
        assert lite.recovered["indexed_from_commitlog"] > 0
    highest: dict[str, int] = {}
    for topic, off in acked:
        highest[topic] = max(highest.get(topic, -1), off)
    for topic, top in highest.items():
        got = lite.get("Chat", topic, 0, 10_000)
        assert got.status is GetStatus.FOUND and len(got.messages) > top
        numbers = [int(m.body[1:]) for m in got.messages]
        assert numbers == sorted(numbers)  # in the order written
    lite.close()
    store.close()


def test_the_upkeep_thread_flushes_what_was_written(tmp_path: Path) -> None:
    store, lite = open_lite(tmp_path / "s")
    lite.put("Chat", "a", Message("Chat", b"1"))
    checkpoint = lite.root / "checkpoint"
    assert not checkpoint.exists()
    lite.start()
    end = store.commitlog.max_offset
    while not checkpoint.exists() or json.loads(checkpoint.read_text())["covered"] < end:
        lite._stop.wait(0.05)  # the thread's turn comes every flush_interval_ms
    lite.close()
    store.close()


def test_a_group_s_offsets_survive_a_restart_and_not_a_new_life_of_the_topic(
    tmp_path: Path,
) -> None:
    clock = Clock()
    store, lite = open_lite(tmp_path / "s", clock)
    for i in range(5):
        lite.put("Chat", "a", Message("Chat", f"{i}".encode()))
    lite.put("Chat", "b", Message("Chat", b"0"))
    assert lite.committed_offset("g1", "Chat", "a") == -1
    lite.commit_offset("g1", "Chat", "a", 3)
    lite.commit_offset("g2", "Chat", "a", 5)
    lite.commit_offset("g2", "Chat", "b", 1)
    with pytest.raises(InvalidMessageError, match="past lite topic 'a'"):
        lite.commit_offset("g1", "Chat", "a", 6)
    lite.close()
    store.close()
    store, lite = open_lite(tmp_path / "s", clock)
    assert lite.committed_offset("g1", "Chat", "a") == 3
    assert lite.committed_offset("g2", "Chat", "a") == 5
    assert lite.committed_offset("g2", "Chat", "b") == 1
    # resume: from the committed offset, exactly what follows
    assert bodies(lite, "a", lite.committed_offset("g1", "Chat", "a")) == [b"3", b"4"]
    clock.now += 2 * HOUR_MS / 1000
    assert lite.expire() == 2
    lite.put("Chat", "b", Message("Chat", b"again"))  # created anew: no offset of before
    assert lite.committed_offset("g2", "Chat", "b") == -1
    lite.close()
    store.close()


def test_a_slave_indexes_the_lite_records_its_master_s_bytes_bring(tmp_path: Path) -> None:
    master, lite = open_lite(tmp_path / "m")
    slave_store = MessageStore(small_config(tmp_path / "sl"), start_services=False)
    slave = LiteStore(slave_store, SMALL)
    for i in range(40):
        lite.put("Chat", f"s{i % 3}", Message("Chat", f"{i}".encode()))
        if i % 10 == 9:  # the master's bytes reach the slave in chunks
            at = slave_store.commitlog.max_offset
            while at < master.commitlog.max_offset:
                at = slave_store.append_commitlog(at, master.read_commitlog(at))
            assert slave.catch_up() > 0
            assert slave.catch_up() == 0  # nothing twice
    for t in ("s0", "s1", "s2"):
        assert [m.body for m in slave.get("Chat", t, 0, 100).messages] == bodies(lite, t)
    for s in (slave, lite):
        s.close()
    slave_store.close()
    master.close()


def test_pages_of_lite_topics_follow_creates_deletes_and_expiry_in_name_order(
    tmp_path: Path,
) -> None:
    clock = Clock()
    store, lite = open_lite(tmp_path / "s", clock)
    for name in ["m", "c", "x", "a"]:
        assert lite.create("Chat", name)
    assert lite.lite_topics_page("Chat", "", 2) == (["a", "c"], 4, 4)
    # kept sorted from here on: later creates, sends and deletes show in the next page
    lite.put("Chat", "b", Message("Chat", b"b1"))
    assert lite.create("Chat", "d")
    assert lite.delete("Chat", "m")
    assert lite.lite_topics_page("Chat", "a", 3) == (["b", "c", "d"], 5, 4)
    assert lite.lite_topics_page("Chat", "d", 3) == (["x"], 5, 1)
    assert lite.lite_topics_page("Chat", "x", 3) == ([], 5, 0)
    clock.now += 0.6 * HOUR_MS / 1000
    lite.put("Chat", "c", Message("Chat", b"c1"))
    clock.now += 0.6 * HOUR_MS / 1000  # all but c: no write for 1.2 h
    assert lite.expire() == 4
    assert lite.lite_topics_page("Chat", "", 10) == (["c"], 1, 1)
    lite.close()
    store.close()
    store, lite = open_lite(tmp_path / "s", clock)
    lite.put("Chat", "a", Message("Chat", b"a2"))
    assert lite.lite_topics_page("Chat", "", 10) == (["a", "c"], 2, 2)
    assert lite.lite_topics_page("Chat", "b", 10)[0] == lite.lite_topics("Chat")[1:]
    with pytest.raises(NotALiteParentError):
        lite.lite_topics_page("Other", "", 10)
    lite.close()
    store.close()
