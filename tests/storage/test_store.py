"""The MessageStore contract brokers and users rely on."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from store_sizes import STORE_SIZES

from storage import (
    GetStatus,
    Message,
    MessageStore,
    OffsetOutOfRangeError,
    PutStatus,
    StoreConfig,
    StoreLockedError,
)
from storage.errors import StoreClosedError


def test_put_and_get_round_trip(store: MessageStore) -> None:
    r = store.put(Message("Orders", b"order-1", tags="Paid", keys=["o-1"], queue_id=2))
    assert r.status is PutStatus.PUT_OK and r.queue_id == 2 and r.queue_offset == 0
    got = store.get("g", "Orders", 2, 0)
    assert got.status is GetStatus.FOUND
    [m] = got.messages
    assert (m.body, m.tags, m.keys, m.msg_id) == (b"order-1", "Paid", ("o-1",), r.msg_id)
    assert got.next_offset == 1 and (got.min_offset, got.max_offset) == (0, 1)


def test_get_statuses_follow_rocketmq(store: MessageStore) -> None:
    assert store.get("g", "Nope", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    store.put_batch([Message("S", b"x") for _ in range(3)])
    assert store.get("g", "S", 0, 3).status is GetStatus.OFFSET_OVERFLOW_ONE
    over = store.get("g", "S", 0, 10)
    assert over.status is GetStatus.OFFSET_OVERFLOW_BADLY and over.next_offset == 0
    with pytest.raises(OffsetOutOfRangeError):
        store.get("g", "S", 0, -1)


def test_tag_filter(store: MessageStore) -> None:
    store.put_batch(
        [Message("F", str(i).encode(), tags="A" if i % 3 == 0 else "B") for i in range(30)]
    )
    a = store.get("g", "F", 0, 0, 100, tags="A")
    assert [int(m.body) for m in a.messages] == list(range(0, 30, 3))
    both = store.get("g", "F", 0, 0, 100, tags="A || B")
    assert len(both.messages) == 30
    none = store.get("g", "F", 0, 0, 100, tags="C")
    assert none.status is GetStatus.NO_MATCHED_MESSAGE and none.next_offset == 30


@pytest.mark.parametrize("sizes", STORE_SIZES, indirect=True)
def test_query_by_key_time_range_and_unique_key(store: MessageStore) -> None:
    clock = [1_000_000.0]
    store._clock = lambda: clock[0]
    first = store.put(Message("K", b"one", keys=["dup", "a"]))
    clock[0] += 100
    store.put(Message("K", b"two", keys=["dup"]))
    store.put(Message("Other", b"three", keys=["dup"]))
    assert sorted(m.body for m in store.query_by_key("K", "dup")) == [b"one", b"two"]
    assert [m.body for m in store.query_by_key("K", "dup", begin_ms=1_000_050_000)] == [b"two"]
    assert [m.body for m in store.query_by_key("K", "dup", end_ms=1_000_050_000)] == [b"one"]
    assert [m.body for m in store.query_by_key("K", first.msg_id)] == [b"one"]
    assert store.message_by_id(first.offset_msg_id).body == b"one"
    assert store.message_by_id(first.msg_id, topic="K").body == b"one"
    assert store.query_by_key("K", "missing") == []


def test_index_rolls_to_a_new_file_when_full(store: MessageStore, config: StoreConfig) -> None:
    for start in range(0, 600, 100):
        store.put_batch([Message("I", b"v", keys=[f"key{i}"]) for i in range(start, start + 100)])
    assert len(list((store.root / "index").iterdir())) >= 3
    for i in (0, 250, 599):
        assert [m.body for m in store.query_by_key("I", f"key{i}")] == [b"v"]


def test_offset_by_time(store: MessageStore) -> None:
    clock = [2_000_000.0]
    store._clock = lambda: clock[0]
    for _ in range(10):
        store.put_batch([Message("Tm", b"x") for _ in range(5)])
        clock[0] += 1
    assert store.offset_by_time("Tm", 0, 0) == 0
    assert store.offset_by_time("Tm", 0, 2_000_003_000) == 15
    assert store.offset_by_time("Tm", 0, 2_000_003_500) == 20
    assert store.offset_by_time("Tm", 0, 9_999_999_999_999) == 50


def test_sync_flush_concurrent_writers_share_fsyncs(tmp_path: Path, make_config) -> None:
    cfg = make_config(tmp_path / "s", flush_disk_type="SYNC_FLUSH", commitlog_file_size=1 << 20)
    with MessageStore(cfg) as s:
        errors: list[BaseException] = []

        def writer(w: int) -> None:
            try:
                for i in range(50):
                    s.put_batch(
                        [Message("W", f"{w}-{i}-{j}".encode(), queue_id=w) for j in range(4)]
                    )
                    assert s.commitlog.flushed_offset >= 0
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert s.commitlog.flushed_offset == s.commitlog.max_offset
        for w in range(8):
            bodies, offset = [], 0
            while offset < s.max_offset("W", w):
                got = s.get("g", "W", w, offset, 1000)
                bodies += [m.body for m in got.messages]
                offset = got.next_offset
            assert bodies == [f"{w}-{i}-{j}".encode() for i in range(50) for j in range(4)]


def test_second_opener_gets_a_clear_error(store: MessageStore, config: StoreConfig) -> None:
    with pytest.raises(StoreLockedError, match="in use"):
        MessageStore(config)


def test_closed_store_refuses_work(config: StoreConfig) -> None:
    s = MessageStore(config)
    s.close()
    with pytest.raises(StoreClosedError):
        s.put(Message("T", b"x"))


def test_clean_restart_keeps_everything(config: StoreConfig) -> None:
    with MessageStore(config) as s:
        sent = s.put_batch(
            [Message("R", str(i).encode(), keys=[f"k{i}"], queue_id=i % 4) for i in range(500)]
        )
    assert not (Path(config.store_dir) / "abort").exists()
    with MessageStore(config) as s:
        assert not s.abnormal_start
        for q in range(4):
            assert s.max_offset("R", q) == 125
        for r in sent[::50]:
            assert s.message_at(r.commitlog_offset).msg_id == r.msg_id
        assert s.query_by_key("R", "k321")[0].body == b"321"
        r = s.put(Message("R", b"after", queue_id=0))
        assert r.queue_offset == 125


def test_broker_conf_loads(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "# a RocketMQ broker.conf\nbrokerName=broker-a\nflushDiskType=SYNC_FLUSH\n"
        f"storePathRootDir={tmp_path / 'st'}\nfileReservedTime=48\ndeleteWhen=04;16\n"
        "mappedFileSizeCommitLog=1048576\nmappedFileSizeConsumeQueue=6000\n"
        "diskMaxUsedSpaceRatio=88\nmaxMessageSize=65536\n"
    )
    cfg = StoreConfig.from_broker_conf(conf)
    assert cfg.flush_disk_type == "SYNC_FLUSH" and cfg.file_reserved_hours == 48
    assert cfg.commitlog_file_size == 1 << 20 and cfg.consume_queue_file_entries == 300
    assert cfg.delete_when == "04;16" and cfg.disk_max_used_ratio == 0.88
    assert cfg.store_dir == str(tmp_path / "st")


def test_config_files_are_written_atomically(store: MessageStore) -> None:
    f = store.config_file("consumerOffset")
    assert f.load() == {}
    f.save({"offsetTable": {"T@g": {"0": 5}}})
    f.save({"offsetTable": {"T@g": {"0": 6}}})
    assert f.load() == {"offsetTable": {"T@g": {"0": 6}}}
    f.path.write_text("{torn")
    assert f.load() == {"offsetTable": {"T@g": {"0": 5}}}  # the backup
    assert not list(f.path.parent.glob("*.tmp"))


def test_dispatch_listener_sees_new_max_offsets(store: MessageStore) -> None:
    seen: list[tuple[str, int, int]] = []
    store.add_dispatch_listener(lambda t, q, m: seen.append((t, q, m)))
    store.put_batch([Message("L", b"x", queue_id=1)] * 3)
    assert seen == [("L", 1, 3)]


def test_async_flush_service_flushes_in_the_background(config: StoreConfig) -> None:
    with MessageStore(config) as s:
        s.put_batch([Message("A", b"y" * 1000) for _ in range(40)])
        deadline = time.monotonic() + 10
        while s.commitlog.flushed_offset < s.commitlog.max_offset and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.commitlog.flushed_offset == s.commitlog.max_offset
