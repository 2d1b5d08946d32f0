"""The store faults' arithmetic on a real store (no Ray): where a cut through the
CommitLog begins to lose records."""

from __future__ import annotations

from pathlib import Path

from store_faults import commitlog_end, last_record_holding, record_end, record_start

from storage import Message, MessageStore, StoreConfig, codec, transaction


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


def test_the_floor_of_a_one_phase_commit_is_its_marker(tmp_path: Path) -> None:
    """A one-phase commit's last record is its marker, which holds the transaction's id
    and no body: a cut between its messages and its marker loses the whole commit
    (recovery drops a group without its marker). The fault lab's seed 1 cut there after
    a SYNC_FLUSH commit was acknowledged: its floor must reach the marker."""
    config = StoreConfig(
        store_dir=str(tmp_path / "store"), commitlog_file_size=8192, max_message_size=2048
    )
    bodies = [f"t-{i:08d}" for i in range(968, 972)]
    txn_id = "fault-txn-1.0.10.b113b9d0"
    with MessageStore(config, start_services=False) as store:
        first = store.put(Message("T", b"m-00000001"))
        group = codec.encode_batch([Message("T", b.encode()) for b in bodies])
        store.put_group(group, transaction.commit_marker(txn_id, "fault-txn-1", 0, len(bodies)))
    store_dir = tmp_path / "store"
    begin = first.commitlog_offset
    by_bodies = last_record_holding(store_dir, [b.encode() for b in bodies], begin)
    assert by_bodies < commitlog_end(store_dir)  # the marker lies past the last body
    needles = [n.encode() for n in (*bodies, txn_id)]  # what the workload reports
    assert last_record_holding(store_dir, needles, begin) == commitlog_end(store_dir)
