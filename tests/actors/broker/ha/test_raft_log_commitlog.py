"""The CommitLog-backed Raft log: entries are CommitLog ranges, followers hold the leader's
exact bytes, truncation cuts the store, and a reopened log matches its store (no Ray)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from actors.broker.ha.raft_log import OWN_ENTRY, CommitLogRaftLog
from storage import Message, MessageStore, StoreConfig
from storage.raft import InMemoryRaftLog, RaftNode
from storage.raft.messages import AppendEntries


def config(path: Path, host: str) -> StoreConfig:
    return StoreConfig(
        store_dir=str(path),
        commitlog_file_size=64 * 1024,
        consume_queue_file_entries=256,
        index_hash_slots=97,
        index_max_entries=4000,
        max_message_size=16 * 1024,
        store_host=host,
    )


def open_member(path: Path, host: str = "10.0.0.1:10911") -> tuple[MessageStore, CommitLogRaftLog]:
    store = MessageStore(config(path, host), start_services=False)
    return store, CommitLogRaftLog(store, path / "raft")


def leader_put(
    store: MessageStore, raft_log: CommitLogRaftLog, term: int, n: int, seed: int
) -> None:
    rng = random.Random(seed)
    store.put_batch(
        [Message("R", rng.randbytes(rng.randint(1, 3000)), queue_id=i % 2) for i in range(n)]
    )
    raft_log.prewritten(store.commitlog.max_offset)
    raft_log.append([OWN_ENTRY], term)


def commitlog(store: MessageStore) -> bytes:
    return store.read_commitlog(0, 0) + b"".join(
        store.read_commitlog(o, 1 << 20)
        for o in range(0, store.commitlog.max_offset, store.commitlog.file_size)
    )


def test_followers_hold_the_leaders_bytes_across_file_boundaries(tmp_path: Path) -> None:
    lstore, leader = open_member(tmp_path / "l")
    fstore, follower = open_member(tmp_path / "f", "10.0.0.2:10911")
    try:
        for i in range(60):  # about 5 commitlog files
            leader_put(lstore, leader, 1, 5, i)
        leader.append([b""], 2)  # a no-op is an empty range
        assert leader.last_index == 61 and leader.end == lstore.commitlog.max_offset
        start = 1
        while start <= leader.last_index:
            batch = leader.entries(start, max_bytes=20_000, max_count=7)
            assert 1 <= len(batch) <= 7
            for entry in batch:
                follower.append([entry.data], entry.term)
            start += len(batch)
        assert lstore.commitlog.max_offset > 4 * lstore.commitlog.file_size
        assert commitlog(fstore) == commitlog(lstore)
        assert fstore.dispatched_offset == 0  # the shell dispatches once it acknowledged
        fstore.dispatch_replicated()
        assert [follower.term_at(i) for i in (1, 60, 61)] == [1, 1, 2]
        got = fstore.get("g", "R", 1, 0, 1000)
        assert len(got.messages) == 120  # 2 of every 5
        assert got.messages[0].store_host == "10.0.0.1:10911"  # the leader's bytes, as they are
    finally:
        for log_, store in ((leader, lstore), (follower, fstore)):
            log_.close()
            store.close()


def test_truncation_cuts_the_store_and_a_reopened_log_matches_it(tmp_path: Path) -> None:
    store, raft_log = open_member(tmp_path / "m")
    for i in range(10):
        leader_put(store, raft_log, 1, 3, i)
    raft_log.sync()
    keep = raft_log.end_of(6)
    raft_log.truncate_from(7)
    assert store.commitlog.max_offset == keep == raft_log.end
    assert store.max_offset("R", 0) == 12  # 6 batches of 3, 2 of each on queue 0
    leader_put(store, raft_log, 3, 4, 99)
    raft_log.sync()
    # bytes put but never proposed (a crash between the two) are cut at the next open
    store.put_batch([Message("R", b"never proposed")])
    raft_log.close()
    store.close()
    store, raft_log = open_member(tmp_path / "m")
    try:
        assert raft_log.last_index == 7 and raft_log.last_term == 3
        assert store.commitlog.max_offset == raft_log.end
        assert store.max_offset("R", 0) + store.max_offset("R", 1) == 22
    finally:
        raft_log.close()
        store.close()


def test_a_raft_node_runs_on_it(tmp_path: Path) -> None:
    """The node's own contract (storage.raft) holds with this log as with the in-memory one."""
    store, raft_log = open_member(tmp_path / "n")
    try:
        node = RaftNode("a", ["a", "b", "c"], log=raft_log)
        ref = RaftNode("b", ["a", "b", "c"], log=InMemoryRaftLog())
        node.start_election_now()
        for _ in range(3):  # pre-vote, vote
            for msg in node.ready().messages:
                if msg.dst == "b":
                    ref.receive(msg)
            for msg in ref.ready().messages:
                node.receive(msg)
        assert node.is_leader
        store.put_batch([Message("R", b"x")])
        raft_log.prewritten(store.commitlog.max_offset)
        proposal = node.propose([OWN_ENTRY])
        sent = [m for m in node.ready().messages if m.dst == "b" and isinstance(m, AppendEntries)]
        assert sent and sent[-1].last_index == proposal.last_index
        assert sent[-1].entries[-1].data == commitlog(store)
        with pytest.raises(ValueError):
            raft_log.append([b"old"], 0)
    finally:
        raft_log.close()
        store.close()
