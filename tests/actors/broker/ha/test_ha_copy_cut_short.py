"""A master restarted behind its slave copies the slave's CommitLog tail in pieces that
need not end on a record; when the copy stops early (the slave gone or promoted), the
master keeps the whole records it got and drops the piece of the next one, so that its
first write starts where a record ends and its queues hold exactly the records copied."""

from __future__ import annotations

from pathlib import Path

from actors.broker.ha.master_restart import keep_whole_records
from storage import Message, MessageStore, StoreConfig
from storage.message import GetStatus

TOPIC = "CutShort"


def config(path: Path) -> StoreConfig:
    return StoreConfig(
        store_dir=str(path),
        commitlog_file_size=64 * 1024,
        consume_queue_file_entries=4096,
        index_hash_slots=97,
        index_max_entries=20_000,
        max_message_size=16 * 1024,
        store_host="10.0.0.1:10911",
    )


def test_a_copy_cut_inside_a_record_keeps_the_whole_records_before_it(tmp_path: Path) -> None:
    with (
        MessageStore(config(tmp_path / "slave"), start_services=False) as slave,
        MessageStore(config(tmp_path / "master"), start_services=False) as master,
    ):
        results = slave.put_batch([Message(TOPIC, b"m-%03d" % i, queue_id=0) for i in range(30)])
        starts = [r.commitlog_offset for r in results]
        tail = slave.read_commitlog(0, slave.commitlog.max_offset)
        cut = starts[20] + 7  # the copy stopped 7 bytes into the 21st record
        master.append_commitlog(0, tail[:cut], dispatch=False)
        assert master.commitlog.max_offset == cut

        assert keep_whole_records(master) == starts[20]
        assert master.commitlog.max_offset == starts[20]
        got = master.get("g", TOPIC, 0, 0, 64)
        assert [m.body for m in got.messages] == [b"m-%03d" % i for i in range(20)]

        (after,) = master.put_batch([Message(TOPIC, b"after", queue_id=0)])
        assert (after.commitlog_offset, after.queue_offset) == (starts[20], 20)
        got = master.get("g", TOPIC, 0, 20, 64)
        assert got.status is GetStatus.FOUND
        assert [m.body for m in got.messages] == [b"after"]


def test_a_copy_ending_on_a_record_drops_nothing(tmp_path: Path) -> None:
    with (
        MessageStore(config(tmp_path / "slave"), start_services=False) as slave,
        MessageStore(config(tmp_path / "master"), start_services=False) as master,
    ):
        slave.put_batch([Message(TOPIC, b"m-%03d" % i, queue_id=0) for i in range(5)])
        end = slave.commitlog.max_offset
        master.append_commitlog(0, slave.read_commitlog(0, end), dispatch=False)
        assert keep_whole_records(master) == end == master.commitlog.max_offset
        assert len(master.get("g", TOPIC, 0, 0, 64).messages) == 5
