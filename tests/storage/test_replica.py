"""A slave store built from a master's CommitLog bytes is the same store."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from store_sizes import STORE_SIZES

from storage import GetStatus, Message, MessageStore, OffsetOutOfRangeError


def replicate(master: MessageStore, slave: MessageStore, chunk: int) -> int:
    while True:
        data = master.read_commitlog(slave.commitlog.max_offset, chunk)
        if not data:
            return slave.commitlog.max_offset
        slave.append_commitlog(slave.commitlog.max_offset, data)


def all_bodies(store: MessageStore, topic: str, qid: int) -> list[bytes]:
    out, offset = [], 0
    while offset < store.max_offset(topic, qid):
        got = store.get("g", topic, qid, offset, 100)
        out += [m.body for m in got.messages]
        offset = got.next_offset
    return out


@pytest.mark.parametrize("chunk", [97, 4096, 1 << 20])
@pytest.mark.parametrize("sizes", STORE_SIZES, indirect=True)
def test_slave_is_byte_identical_and_dispatches_itself(
    tmp_path: Path, make_config, chunk: int, sizes: str
) -> None:
    rng = random.Random(chunk)
    with (
        MessageStore(make_config(tmp_path / "m", store_host="10.0.0.1:10911")) as master,
        MessageStore(make_config(tmp_path / "s", store_host="10.0.0.2:10911")) as slave,
    ):
        for i in range(30):
            master.put_batch(
                [
                    Message(
                        "R", rng.randbytes(rng.randint(1, 2000)), keys=[f"k{i}-{j}"], queue_id=j % 3
                    )
                    for j in range(10)
                ]
            )
            if i % 7 == 0:
                replicate(master, slave, chunk)
        end = replicate(master, slave, chunk)
        assert end == master.commitlog.max_offset == slave.dispatched_offset
        assert len(slave.commitlog.files) == len(master.commitlog.files)
        assert sizes == "default" or len(slave.commitlog.files) > 3  # small files rolled
        for mf_m, mf_s in zip(master.commitlog.files, slave.commitlog.files):
            assert mf_m.path.name == mf_s.path.name
            assert mf_m.read(0, mf_m.wrote_position) == mf_s.read(0, mf_s.wrote_position)
        for q in range(3):
            assert all_bodies(slave, "R", q) == all_bodies(master, "R", q)
        assert [m.body for m in slave.query_by_key("R", "k17-4")] == [
            m.body for m in master.query_by_key("R", "k17-4")
        ]


def test_a_chunk_must_follow_the_end(tmp_path: Path, make_config) -> None:
    with (
        MessageStore(make_config(tmp_path / "m")) as master,
        MessageStore(make_config(tmp_path / "s")) as slave,
    ):
        master.put(Message("R", b"x"))
        with pytest.raises(OffsetOutOfRangeError, match="does not follow"):
            slave.append_commitlog(5, master.read_commitlog(0, 100))
        assert slave.commitlog.max_offset == 0


@pytest.mark.parametrize("sizes", STORE_SIZES, indirect=True)
def test_truncate_drops_the_tail_and_its_queue_entries(tmp_path: Path, make_config) -> None:
    with MessageStore(make_config(tmp_path / "m")) as store:
        first = store.put_batch([Message("R", b"keep") for _ in range(5)])
        cut = store.commitlog.max_offset
        store.put_batch([Message("R", b"drop") for _ in range(5)])
        store.truncate_commitlog(cut)
        assert store.max_offset("R", 0) == 5
        assert store.get("g", "R", 0, 5).status is GetStatus.OFFSET_OVERFLOW_ONE
        r = store.put(Message("R", b"new"))
        assert r.queue_offset == 5 and r.commitlog_offset == cut
        assert store.message_at(first[0].commitlog_offset).body == b"keep"
