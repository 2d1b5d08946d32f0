"""The replicated log's storage interface and its in-memory implementation.

Indexes start at 1; index 0 is the empty prefix with term 0. Invariants of
every ``RaftLog``: entries are contiguous from 1 to ``last_index``; terms never
decrease along the log (each leader appends in its own term, which is above
every term it holds), which lets the node binary-search terms; ``last_term`` is
``term_at(last_index)``. Entries are opaque bytes, for RayMQ a batch of
encoded CommitLog records each, so a log index counts batches, not messages.

The actor shell backs ``RaftLog`` with the CommitLog (RocketMQ's
DLedgerCommitLog keeps the entries' terms in its own entry headers); the node
only ever calls the six members below and never assumes that a write is
durable: the shell syncs before it sends (see the package docstring).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..errors import OffsetOutOfRangeError
from .messages import Entry


class RaftLog(Protocol):
    """What a ``RaftNode`` needs from its log."""

    @property
    def last_index(self) -> int: ...

    @property
    def last_term(self) -> int: ...

    def term_at(self, index: int) -> int:
        """The term of entry ``index`` (0 for index 0); raises if past the end."""
        ...

    def append(self, entries: Sequence[bytes], term: int) -> int:
        """Append ``entries`` of ``term`` after the last one; return the new last index."""
        ...

    def truncate_from(self, index: int) -> None:
        """Drop entries ``index`` .. ``last_index`` (a divergent, uncommitted tail)."""
        ...

    def entries(self, start: int, *, max_bytes: int, max_count: int) -> list[Entry]:
        """Entries from ``start`` while they fit ``max_bytes`` (at least one) and ``max_count``."""
        ...


class InMemoryRaftLog:
    """A ``RaftLog`` in a Python list: for tests, the simulator and single-process use."""

    def __init__(self, entries: Sequence[Entry] = ()) -> None:
        self._entries: list[Entry] = []
        for term, data in entries:
            self.append([data], term)

    @property
    def last_index(self) -> int:
        return len(self._entries)

    @property
    def last_term(self) -> int:
        return self._entries[-1].term if self._entries else 0

    @property
    def view(self) -> Sequence[Entry]:
        """All entries, index ``i`` at position ``i - 1``; read only (not a copy)."""
        return self._entries

    def term_at(self, index: int) -> int:
        if index == 0:
            return 0
        if not 0 < index <= len(self._entries):
            raise OffsetOutOfRangeError(
                f"log index {index} is outside the log [0, {len(self._entries)}]"
            )
        return self._entries[index - 1].term

    def append(self, entries: Sequence[bytes], term: int) -> int:
        if term < self.last_term:
            raise ValueError(f"term {term} is below the log's last term {self.last_term}")
        self._entries.extend(Entry(term, data) for data in entries)
        return len(self._entries)

    def truncate_from(self, index: int) -> None:
        if not 0 < index <= len(self._entries) + 1:
            raise OffsetOutOfRangeError(
                f"truncate index {index} is outside [1, {len(self._entries) + 1}]"
            )
        del self._entries[index - 1 :]

    def entries(self, start: int, *, max_bytes: int, max_count: int) -> list[Entry]:
        if start < 1:
            raise OffsetOutOfRangeError(f"entries start {start} is below 1")
        out: list[Entry] = []
        size = 0
        for entry in self._entries[start - 1 : start - 1 + max_count]:
            size += len(entry.data)
            if out and size > max_bytes:
                break
            out.append(entry)
        return out

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"InMemoryRaftLog(last_index={self.last_index}, last_term={self.last_term})"
