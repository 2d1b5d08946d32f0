"""The store faults' arithmetic on a real store (no Ray): where a cut through the
CommitLog begins to lose records."""

from __future__ import annotations

from pathlib import Path

from store_faults import commitlog_end, record_end, record_start

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
