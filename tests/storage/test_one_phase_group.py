"""A one-phase commit's group (``MessageStore.put_group``): its messages and its marker in
one append, kept whole or not at all by recovery, and dispatched whole by a slave."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from storage import InvalidMessageError, Message, MessageStore, StoreConfig, codec, transaction
from storage.recovery import open_group_at
from tests.storage.conftest import small_config


def config(path: Path) -> StoreConfig:
    """Small files, with room for every queue entry and index entry these tests write."""
    return small_config(
        path,
        consume_queue_file_entries=4096,
        index_max_entries=20_000,
        flush_disk_type="SYNC_FLUSH",
    )


def group_batch(n: int = 6, tag: str = "g") -> codec.EncodedBatch:
    return codec.encode_batch(
        [
            Message(
                "Out" if i % 2 else "Audit",
                f"{tag}{i}".encode(),
                keys=[f"{tag}-k{i}"],
                queue_id=i % 3,
            )
            for i in range(n)
        ]
    )


def marker(txn: str = "t-1", n: int = 6) -> Message:
    return transaction.commit_marker(txn, "etl-1", 3, n)


def visible(store: MessageStore, tag: str) -> list[bytes]:
    out = []
    for topic in ("Out", "Audit"):
        for qid in range(3):
            got = store.get("g", topic, qid, 0, 1000)
            out += [m.body for m in got.messages if m.body.startswith(tag.encode())]
    return sorted(out)


def sysflag(store: MessageStore, phys: int) -> int:
    return struct.unpack_from(">i", store.commitlog.read(phys, 40), 36)[0]


def test_a_group_is_stored_as_committed_messages_then_its_marker(tmp_path: Path) -> None:
    with MessageStore(config(tmp_path / "s"), start_services=False) as store:
        store.put(Message("Out", b"before", queue_id=0))
        result = store.put_group(group_batch(), marker())
        assert len(result.commitlog_offsets) == 7  # six messages and the marker
        assert visible(store, "g") == sorted(f"g{i}".encode() for i in range(6))
        for phys in result.commitlog_offsets[:6].tolist():
            assert transaction.group_role(sysflag(store, phys)) == transaction.GROUP_MEMBER
            assert sysflag(store, phys) & transaction.TRANSACTION_MASK == (
                transaction.TRANSACTION_COMMIT_TYPE
            )
        end = int(result.commitlog_offsets[6])
        assert transaction.group_role(sysflag(store, end)) == transaction.GROUP_END
        got = store.get("g", transaction.COMMIT_TOPIC, 0, 0, 10)
        assert [transaction.marker_fields(m.body) for m in got.messages] == [
            {"txn": "t-1", "tid": "etl-1", "epoch": 3, "count": 6}
        ]
        # the messages keep their keys: found by key as any message
        assert [m.body for m in store.query_by_key("Out", "g-k1")] == [b"g1"]


@pytest.mark.parametrize(
    "bad, why",
    [
        (lambda: codec.encode_batch([Message("Out", b"x", delay_level=2)]), "plain"),
        (
            lambda: codec.encode_batch(
                [Message("Out", b"x", properties={"TRAN_MSG": "true", "PGROUP": "p"})]
            ),
            "plain",
        ),
        (lambda: codec.encode_batch([Message(transaction.COMMIT_TOPIC, b"x")]), "reserved"),
        (lambda: codec.encode_batch([Message(transaction.HALF_TOPIC, b"x")]), "reserved"),
    ],
)
def test_a_group_of_anything_but_plain_messages_is_refused_and_writes_nothing(
    tmp_path: Path, bad, why: str
) -> None:
    with MessageStore(config(tmp_path / "s"), start_services=False) as store:
        store.put(Message("Out", b"before"))
        end = store.commitlog.max_offset
        with pytest.raises(InvalidMessageError, match=why):
            store.put_group(bad(), marker())
        with pytest.raises(InvalidMessageError, match="commit marker"):
            store.put_group(group_batch(), Message("Out", b"not a marker"))
        assert store.commitlog.max_offset == end


def _crash_with(tmp_path: Path, damage) -> tuple[int, int]:
    """Put plain messages then a group, damage the group's bytes with ``damage(raw, at,
    sizes)`` as a crash mid-append would leave them, and leave the abort file: (the
    group's start, the CommitLog end before it)."""
    cfg = config(tmp_path / "s")
    with MessageStore(cfg, start_services=False) as store:
        store.put_batch([Message("Out", f"p{i}".encode(), queue_id=i % 3) for i in range(9)])
        start = store.commitlog.max_offset
        result = store.put_group(group_batch(), marker())
        offsets = result.commitlog_offsets.tolist()
        sizes = [store.commitlog.size_at(o) for o in offsets]
        mf = store.commitlog.files.last()
        assert mf is not None and mf.from_offset <= start
    (tmp_path / "s" / "abort").touch()
    raw = bytearray(mf.path.read_bytes())
    damage(raw, [o - mf.from_offset for o in offsets], sizes)
    mf.path.write_bytes(bytes(raw))
    return start, offsets[-1] + sizes[-1]


def _unpatched(raw: bytearray, at: int) -> None:
    """The record at ``at`` copied but its store fields not written yet."""
    struct.pack_into(">q", raw, at + codec.OFF_PHYSICALOFFSET, 0)


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw, at, sizes: _unpatched(raw, at[-1]),  # the marker not patched yet
        lambda raw, at, sizes: [_unpatched(raw, a) for a in at[3:]],  # half the members
        lambda raw, at, sizes: raw.__setitem__(  # the marker never reached the disk
            slice(at[-1], at[-1] + sizes[-1]), bytes(sizes[-1])
        ),
    ],
    ids=["marker-unpatched", "members-unpatched", "marker-zeros"],
)
def test_recovery_drops_a_group_the_crash_cut_short_and_keeps_what_came_before(
    tmp_path: Path, damage, caplog: pytest.LogCaptureFixture
) -> None:
    start, _ = _crash_with(tmp_path, damage)
    with MessageStore(config(tmp_path / "s"), start_services=False) as store:
        assert store.abnormal_start
        assert store.commitlog.max_offset == start
        assert visible(store, "g") == []
        assert visible(store, "p") == sorted(f"p{i}".encode() for i in range(9))
        assert store.query_by_key("Out", "g-k1") == []
        assert store.max_offset(transaction.COMMIT_TOPIC, 0) == 0
        r = store.put(Message("Out", b"after", queue_id=0))
        assert r.commitlog_offset == start and r.queue_offset == 3
    assert "one-phase commit cut short" in caplog.text


def test_recovery_keeps_a_whole_group(tmp_path: Path) -> None:
    _, end = _crash_with(tmp_path, lambda raw, at, sizes: None)
    with MessageStore(config(tmp_path / "s"), start_services=False) as store:
        assert store.abnormal_start and store.commitlog.max_offset == end
        assert visible(store, "g") == sorted(f"g{i}".encode() for i in range(6))
        assert store.max_offset(transaction.COMMIT_TOPIC, 0) == 1


def test_only_a_run_of_members_reaching_the_end_counts_as_cut(tmp_path: Path) -> None:
    """A member run closed by anything but its marker (bytes nobody wrote this way) is not
    a crash's cut: recovery never drops a record outside the tail's run."""
    with MessageStore(config(tmp_path / "s"), start_services=False) as store:
        result = store.put_group(group_batch(), marker())
        members = result.commitlog_offsets[:6].tolist()
        marker_at = int(result.commitlog_offsets[6])
        cl = store.commitlog
        end = cl.max_offset
        assert open_group_at(cl, 0, end) is None  # whole
        assert open_group_at(cl, 0, marker_at) == members[0]  # cut before its marker
        assert open_group_at(cl, 0, members[3]) == members[0]
        store.put(Message("Out", b"plain after"))
        # a member run closed by a plain record: not a cut tail
        assert open_group_at(cl, members[0], cl.max_offset) is None


def test_a_slave_dispatches_a_group_only_once_its_marker_arrived(tmp_path: Path) -> None:
    with (
        MessageStore(config(tmp_path / "m"), start_services=False) as master,
        MessageStore(config(tmp_path / "s"), start_services=False) as slave,
    ):
        master.put_batch([Message("Out", f"p{i}".encode(), queue_id=i % 3) for i in range(4)])
        start = master.commitlog.max_offset
        master.put_group(group_batch(), marker())
        end = master.commitlog.max_offset
        seen: list[int] = []
        while slave.commitlog.max_offset < end:
            data = master.read_commitlog(slave.commitlog.max_offset, 97)
            slave.append_commitlog(slave.commitlog.max_offset, data)
            got = visible(slave, "g")
            seen.append(len(got))
            if slave.commitlog.max_offset < end:
                assert got == []  # not one of them before the marker
                assert slave.dispatched_offset <= start
        assert seen[-1] == 6 and set(seen) == {0, 6}
        assert slave.dispatched_offset == end
        assert slave.queues() == master.queues()


def test_a_slave_promoted_with_half_a_group_cuts_it(tmp_path: Path) -> None:
    with (
        MessageStore(config(tmp_path / "m"), start_services=False) as master,
        MessageStore(config(tmp_path / "s"), start_services=False) as slave,
    ):
        master.put(Message("Out", b"p0", queue_id=0))
        start = master.commitlog.max_offset
        result = master.put_group(group_batch(), marker())
        cut = int(result.commitlog_offsets[6])  # everything but the marker arrived
        slave.append_commitlog(0, master.read_commitlog(0, cut))
        assert slave.commitlog.max_offset == cut and slave.dispatched_offset == start
        # what a promotion does: keep what is dispatched (the last whole record)
        slave.truncate_commitlog(slave.dispatched_offset)
        assert slave.commitlog.max_offset == start
        assert visible(slave, "g") == [] and visible(slave, "p") == [b"p0"]
