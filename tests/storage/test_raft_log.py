"""InMemoryRaftLog: the RaftLog contract the CommitLog-backed log will follow."""

from __future__ import annotations

import pytest

from storage.errors import OffsetOutOfRangeError
from storage.raft import Entry, InMemoryRaftLog


def test_an_empty_log_is_the_empty_prefix_of_term_zero() -> None:
    log = InMemoryRaftLog()
    assert (log.last_index, log.last_term, log.term_at(0)) == (0, 0, 0)
    assert log.entries(1, max_bytes=100, max_count=10) == []


def test_append_returns_the_new_last_index_and_records_terms() -> None:
    log = InMemoryRaftLog()
    assert log.append([b"a", b"b"], 1) == 2
    assert log.append([b"c"], 3) == 3
    assert [log.term_at(i) for i in range(4)] == [0, 1, 1, 3]
    assert (log.last_index, log.last_term) == (3, 3)
    assert list(log.view) == [Entry(1, b"a"), Entry(1, b"b"), Entry(3, b"c")]


def test_terms_never_decrease_along_the_log() -> None:
    log = InMemoryRaftLog([Entry(2, b"a")])
    with pytest.raises(ValueError, match="term 1 is below the log's last term 2"):
        log.append([b"b"], 1)


def test_term_at_past_the_end_names_the_index_and_the_bounds() -> None:
    log = InMemoryRaftLog([Entry(1, b"a")])
    with pytest.raises(OffsetOutOfRangeError, match=r"log index 2 is outside the log \[0, 1\]"):
        log.term_at(2)


def test_truncate_from_drops_the_tail_and_only_the_tail() -> None:
    log = InMemoryRaftLog([Entry(1, b"a"), Entry(1, b"b"), Entry(2, b"c")])
    log.truncate_from(4)  # nothing past the end: a no-op
    assert log.last_index == 3
    log.truncate_from(2)
    assert list(log.view) == [Entry(1, b"a")]
    with pytest.raises(OffsetOutOfRangeError):
        log.truncate_from(0)
    with pytest.raises(OffsetOutOfRangeError):
        log.truncate_from(3)


def test_entries_fill_the_byte_budget_but_always_return_one() -> None:
    log = InMemoryRaftLog([Entry(1, b"x" * 4) for _ in range(10)])
    assert len(log.entries(1, max_bytes=10, max_count=100)) == 2
    assert len(log.entries(1, max_bytes=1, max_count=100)) == 1  # one entry over budget
    assert len(log.entries(1, max_bytes=1000, max_count=3)) == 3
    assert [e.term for e in log.entries(9, max_bytes=1000, max_count=100)] == [1, 1]
    assert log.entries(11, max_bytes=1000, max_count=100) == []
    with pytest.raises(OffsetOutOfRangeError):
        log.entries(0, max_bytes=10, max_count=1)
