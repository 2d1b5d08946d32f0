"""The store faults' arithmetic on a real store (no Ray): where a cut through the
CommitLog begins to lose records."""

from __future__ import annotations

from pathlib import Path

from store_faults import commitlog_end, last_record_holding, record_end, record_start

from storage import Message, MessageStore, StoreConfig


def test_a_cut_through_a_record_loses_it_from_its_start(tmp_path: Path) -> None:
    config = StoreConfig(
        store_dir=str(tmp_path / "store"),
        commitlog_file_size=64 * 1024,
        consume_queue_file_entries=64,
        index_hash_slots=97,
        index_max_entries=400,
        max_message_size=16 * 1024,
    )
    with MessageStore(config) as store:
        starts = [r.commitlog_offset for r in store.put_batch(
            [Message("T", b"x" * (10 + i)) for i in range(5)]
        )]  # fmt: skip
    store_dir = tmp_path / "store"
    ends = [record_end(store_dir, s) for s in starts]
    assert ends[:-1] == starts[1:]  # records follow each other
    assert record_start(store_dir, starts[2]) == starts[2]  # a boundary
    assert record_start(store_dir, starts[2] + 1) == starts[2]  # inside the third
    assert record_start(store_dir, ends[2] - 1) == starts[2]
    assert record_start(store_dir, commitlog_end(store_dir)) == ends[-1]  # the end


def test_the_floor_of_a_door_without_offsets_is_the_record_holding_its_last_body(
    tmp_path: Path,
) -> None:
    """A power loss under SYNC_FLUSH cuts no record the gRPC door or a transaction
    acknowledged: their answers name no CommitLog offset, so the cut's floor is the end
    of the last record holding one of their bodies (a batch's record included)."""
    config = StoreConfig(
        store_dir=str(tmp_path / "store"), commitlog_file_size=8192, max_message_size=2048
    )
    with MessageStore(config) as store:
        first = store.put_batch([Message("T", f"m-{i:08d}".encode()) for i in range(3)])
        gate = store.put_batch([Message("T", b"g-00000465")])[0]
        later = store.put_batch([Message("T", f"m-{i:08d}".encode()) for i in range(3, 150)])
    store_dir = tmp_path / "store"
    assert later[-1].commitlog_offset >= 8192  # the records go on in a second file
    begin = first[0].commitlog_offset
    assert last_record_holding(store_dir, [b"g-00000465"], begin) == record_end(
        store_dir, gate.commitlog_offset
    )
    # bodies in other files, the latest one wins; none at or past the start: the start
    tail = later[-1].commitlog_offset
    found = last_record_holding(store_dir, [b"g-00000465", b"m-00000149"], begin)
    assert found == record_end(store_dir, tail) == commitlog_end(store_dir)
    assert last_record_holding(store_dir, [b"g-00000465"], tail) == tail
    assert last_record_holding(store_dir, [b"x-never"], begin) == begin
    assert last_record_holding(store_dir, [], begin) == begin
