"""A lite store in a Raft group (real store on a temp dir, no Ray): a batch written
through the group's log is indexed only once committed, a tail cut off before its
commit never reaches the lite index, the quota counts proposals in flight, and consumer
state records apply once committed, in the log's order."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_sizes import small_config

from storage import GetStatus, Message, MessageStore
from storage.errors import InvalidMessageError
from storage.lite import LiteConfig, LiteStore, LiteTopicQuotaExceededError, encode_state


class Commit:
    """The group's committed CommitLog offset, as the Raft shell would move it."""

    def __init__(self) -> None:
        self.end = 0

    def __call__(self) -> int:
        return self.end


def open_member(path: Path, commit: Commit) -> tuple[MessageStore, LiteStore]:
    store = MessageStore(small_config(path), start_services=False)
    lite = LiteStore(store, LiteConfig(index_file_entries=64), committed=commit)
    lite.declare_parent("Chat", quota=3, ttl_ms=3_600_000)
    return store, lite


def bodies(lite: LiteStore, topic: str, offset: int = 0) -> list[bytes]:
    return [m.body for m in lite.get("Chat", topic, offset, 1000).messages]


def test_a_proposal_is_indexed_once_committed_and_answers_its_offsets(tmp_path: Path) -> None:
    commit = Commit()
    store, lite = open_member(tmp_path / "s", commit)
    try:
        first = lite.prepare("Chat", [("a", Message("Chat", b"a0")), ("b", Message("Chat", b"b0"))])
        result = store.put_encoded(first.batch)  # the leader's put, proposed as one entry
        assert lite.catch_up() == 0  # written, not committed: not indexed, not readable
        assert lite.get("Chat", "a", 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
        assert not lite.behind()
        commit.end = store.commitlog.max_offset
        assert lite.behind()
        done = lite.settle(first, result.commitlog_offsets)
        assert done.lite_offsets.tolist() == [0, 0]
        assert bodies(lite, "a") == [b"a0"]
        # a later batch to a lite topic among others: its offsets follow
        items = [("a", Message("Chat", b"a%d" % i)) for i in range(1, 70)]
        second = lite.prepare("Chat", items + [("b", Message("Chat", b"b1"))])
        result = store.put_encoded(second.batch)
        commit.end = store.commitlog.max_offset
        done = lite.settle(second, result.commitlog_offsets)
        assert done.lite_offsets.tolist() == list(range(1, 70)) + [1]
        assert bodies(lite, "a", 60) == [b"a%d" % i for i in range(60, 70)]
    finally:
        lite.close()
        store.close()


def test_an_uncommitted_tail_cut_off_never_reaches_the_lite_index(tmp_path: Path) -> None:
    commit = Commit()
    store, lite = open_member(tmp_path / "s", commit)
    try:
        kept = lite.prepare("Chat", [("a", Message("Chat", b"kept"))])
        result = store.put_encoded(kept.batch)
        commit.end = store.commitlog.max_offset
        lite.settle(kept, result.commitlog_offsets)
        lost = lite.prepare("Chat", [("a", Message("Chat", b"lost")), ("c", Message("Chat", b"x"))])
        store.put_encoded(lost.batch)
        lite.catch_up()  # the upkeep's turn: nothing past the committed end
        store.truncate_commitlog(commit.end)  # a new leader's log says so
        lite.release(lost)
        # the next leader's entry at the same offsets
        again = lite.prepare("Chat", [("a", Message("Chat", b"again"))])
        result = store.put_encoded(again.batch)
        commit.end = store.commitlog.max_offset
        assert lite.settle(again, result.commitlog_offsets).lite_offsets.tolist() == [1]
        assert bodies(lite, "a") == [b"kept", b"again"]
        assert not lite.exists("Chat", "c")
        assert lite.count("Chat") == 1
    finally:
        lite.close()
        store.close()


def test_the_quota_counts_new_lite_topics_of_proposals_in_flight(tmp_path: Path) -> None:
    commit = Commit()
    store, lite = open_member(tmp_path / "s", commit)  # quota 3
    try:
        one = lite.prepare("Chat", [("a", Message("Chat", b"1")), ("b", Message("Chat", b"2"))])
        two = lite.prepare("Chat", [("b", Message("Chat", b"3")), ("c", Message("Chat", b"4"))])
        with pytest.raises(LiteTopicQuotaExceededError):
            lite.prepare("Chat", [("d", Message("Chat", b"5"))])
        lite.release(two)  # not committed: its places go back
        lite.release(two)  # twice changes nothing
        three = lite.prepare("Chat", [("d", Message("Chat", b"6"))])
        with pytest.raises(LiteTopicQuotaExceededError):
            lite.prepare("Chat", [("e", Message("Chat", b"7"))])
        for proposal in (one, three):
            result = store.put_encoded(proposal.batch)
            commit.end = store.commitlog.max_offset
            lite.settle(proposal, result.commitlog_offsets)
        assert lite.count("Chat") == 3
        assert sorted(lite.lite_topics("Chat")) == ["a", "b", "d"]
        with pytest.raises(LiteTopicQuotaExceededError):
            lite.prepare("Chat", [("e", Message("Chat", b"8"))])
        lite.prepare("Chat", [("a", Message("Chat", b"9"))])  # an existing one: still taken
    finally:
        lite.close()
        store.close()


def test_a_member_restarted_indexes_nothing_past_what_it_knows_committed(tmp_path: Path) -> None:
    commit = Commit()
    store, lite = open_member(tmp_path / "s", commit)
    kept = lite.prepare("Chat", [("a", Message("Chat", b"kept"))])
    result = store.put_encoded(kept.batch)
    commit.end = store.commitlog.max_offset
    lite.settle(kept, result.commitlog_offsets)
    store.put_encoded(lite.prepare("Chat", [("a", Message("Chat", b"maybe"))]).batch)
    lite.close()
    store.close()
    store, lite = open_member(tmp_path / "s", commit)  # it knows the commit up to "kept"
    try:
        assert bodies(lite, "a") == [b"kept"]
        commit.end = store.commitlog.max_offset  # the group commits the rest
        lite.catch_up()
        assert bodies(lite, "a") == [b"kept", b"maybe"]
    finally:
        lite.close()
        store.close()


def test_consumer_state_records_apply_once_committed_in_log_order(tmp_path: Path) -> None:
    commit = Commit()
    store, lite = open_member(tmp_path / "s", commit)
    seen: list[str] = []
    lite.state_listener = lambda op: seen.append(op["op"])
    size = store.config.max_message_size
    sent = lite.prepare("Chat", [("a", Message("Chat", b"a%d" % i)) for i in range(4)])
    result = store.put_encoded(sent.batch)
    commit.end = store.commitlog.max_offset
    lite.settle(sent, result.commitlog_offsets)
    changes = [
        {
            "op": "subscribe",
            "group": "g",
            "parent": "Chat",
            "client": "c1",
            "names": ["a", "b"],
            "action": "add",
        },
        {"op": "commit", "group": "g", "parent": "Chat", "lite": "a", "offset": 2},
        {"op": "delete", "parent": "Chat", "lite": "b"},
        {"op": "commit", "group": "g", "parent": "Chat", "lite": "a", "offset": 3},
        {"op": "commit", "group": "g", "parent": "Chat", "lite": "b", "offset": 0},
    ]
    try:
        for op in changes:
            with pytest.raises(InvalidMessageError):  # a producer may not write them
                store.put_encoded(encode_state(op, size))
            store._put_encoded(encode_state(op, size))  # the Raft leader's own proposal
        lite.catch_up()  # not committed yet: nothing applied
        assert (seen, lite.committed_offset("g", "Chat", "a")) == ([], -1)
        commit.end = store.commitlog.max_offset
        lite.catch_up()
        assert seen == ["subscribe", "commit", "delete", "commit", "commit"]
        assert lite.committed_offset("g", "Chat", "a") == 3
        assert not lite.exists("Chat", "b")  # created by the subscription, then deleted
        lite.catch_up()  # applied once
        assert len(seen) == 5
        with pytest.raises(InvalidMessageError):
            encode_state({"op": "commit", "group": "g", "parent": "Chat"}, size)
    finally:
        lite.close()
        store.close()
    store, lite = open_member(tmp_path / "s", commit)  # a restart keeps what was applied
    try:
        assert lite.committed_offset("g", "Chat", "a") == 3
        assert sorted(lite.lite_topics("Chat")) == ["a"]
    finally:
        lite.close()
        store.close()
