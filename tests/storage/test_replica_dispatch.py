"""A replica's ConsumeQueue and index entries, built from the master's CommitLog
bytes, are exactly the master's own, whatever the chunking and whether each chunk
is dispatched at once or appended first and dispatched later."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from storage import Message, MessageStore, OffsetOutOfRangeError, StoreConfig
from storage.schedule import SCHEDULE_TOPIC
from tests.storage.conftest import small_config


def config(path: Path) -> StoreConfig:
    """Small files, with room for every queue entry and index entry these tests write."""
    return small_config(path, consume_queue_file_entries=4096, index_max_entries=20_000)


def fill(master: MessageStore, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(40):
        master.put_batch(
            [
                Message(
                    rng.choice(["A", "B-topic", "C"]),
                    rng.randbytes(rng.randint(1, 3000)),
                    tags=rng.choice([None, "t1", "t2", "ta gs"]),
                    keys=rng.choice([(), f"k{i}", [f"k{i}", f"x{j}"]]),
                    queue_id=j % 3,
                    delay_level=1 if j == 5 and i % 4 == 0 else 0,
                )
                for j in range(8)
            ]
        )


def replicate(master: MessageStore, slave: MessageStore, chunk: int, later: bool) -> None:
    """Copy the master's CommitLog; with ``later`` dispatch only every third chunk."""
    n = 0
    while True:
        data = master.read_commitlog(slave.commitlog.max_offset, chunk)
        if not data:
            slave.dispatch_replicated()
            return
        slave.append_commitlog(slave.commitlog.max_offset, data, dispatch=not later)
        n += 1
        if later and n % 3 == 0:
            slave.dispatch_replicated()


@pytest.mark.parametrize("chunk", [97, 5000, 1 << 20])
def test_replica_entries_equal_the_masters(tmp_path: Path, chunk: int) -> None:
    with (
        MessageStore(config(tmp_path / "m"), start_services=False) as master,
        MessageStore(config(tmp_path / "now"), start_services=False) as now,
        MessageStore(config(tmp_path / "later"), start_services=False) as later,
    ):
        fill(master, chunk)
        replicate(master, now, chunk, later=False)
        replicate(master, later, chunk, later=True)
        assert len(master.commitlog.files) > 3
        assert later.dispatched_offset == now.dispatched_offset == master.commitlog.max_offset
        assert later.queues() == now.queues() == master.queues()
        assert (SCHEDULE_TOPIC, 0) in later.queues()
        for topic, qid in master.queues():
            for tags in (None, "t1", "ta gs"):
                want = master.get_raw("g", topic, qid, 0, 10_000, tags)
                for store in (later, now):
                    got = store.get_raw("g", topic, qid, 0, 10_000, tags)
                    assert (got.status, got.count, got.data, got.next_offset) == (
                        want.status,
                        want.count,
                        want.data,
                        want.next_offset,
                    )
        for key in ("k3", "x2", "k39"):
            for topic in ("A", "B-topic", "C"):
                want = [m.commitlog_offset for m in master.query_by_key(topic, key)]
                assert [m.commitlog_offset for m in later.query_by_key(topic, key)] == want
        uniq = master.message_at(0).msg_id
        assert later.message_by_id(uniq, master.message_at(0).topic).commitlog_offset == 0


def test_append_checks_where_a_chunk_goes(tmp_path: Path) -> None:
    with (
        MessageStore(config(tmp_path / "m"), start_services=False) as master,
        MessageStore(config(tmp_path / "s"), start_services=False) as slave,
    ):
        master.put(Message("A", b"x"))
        with pytest.raises(OffsetOutOfRangeError, match="does not follow"):
            slave.append_commitlog(5, master.read_commitlog(0, 100), dispatch=False)
        assert slave.append_commitlog(0, b"") == 0
        assert slave.commitlog.max_offset == 0
