"""The messages RaftNodes exchange: plain values the actor shell ships as they are.

Every message names its sender (``src``), its receiver (``dst``) and the
sender's term. They are frozen and picklable, so Ray can carry them (and a
simulated network can drop, delay, duplicate and reorder them) without the
state machine ever noticing a difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

NodeId = str


class Entry(NamedTuple):
    """One log entry: the term of the leader that created it and opaque bytes.

    A NamedTuple rather than a dataclass because entries are the hot path:
    thousands ride in one ``AppendEntries`` and tuples compare and pickle in C.
    An empty ``data`` is the no-op a new leader appends; the shell skips it.
    """

    term: int
    data: bytes


@dataclass(frozen=True, slots=True)
class RequestVote:
    """A candidate asks for a vote (or, with ``pre_vote``, whether it could win one).

    A pre-vote carries the term the candidate *would* take (its term + 1) and
    changes nobody's term or vote. ``force`` says the candidate knows the leader
    is gone (a death notice or a leadership transfer): voters then grant it
    even if they heard from a leader recently.
    """

    src: NodeId
    dst: NodeId
    term: int
    last_log_index: int
    last_log_term: int
    pre_vote: bool = False
    force: bool = False


@dataclass(frozen=True, slots=True)
class RequestVoteResponse:
    """A vote (or pre-vote) granted or refused; ``term`` is the voter's, or the asked one if a
    pre-vote was granted."""

    src: NodeId
    dst: NodeId
    term: int
    granted: bool
    pre_vote: bool = False


@dataclass(frozen=True, slots=True)
class AppendEntries:
    """The leader's batch of entries following ``prev_index``; with no entries, a heartbeat.

    ``seq`` numbers the leader's appends of its term in the order it sent them; the answer
    repeats it, so the leader can tell an answer to an older append (overtaken by what it
    learned since) from news.
    """

    src: NodeId
    dst: NodeId
    term: int
    prev_index: int
    prev_term: int
    entries: tuple[Entry, ...]
    leader_commit: int
    seq: int = 0

    @property
    def last_index(self) -> int:
        return self.prev_index + len(self.entries)


@dataclass(frozen=True, slots=True)
class AppendEntriesResponse:
    """A follower's answer to one ``AppendEntries``.

    On success ``match_index`` is the last index now known to match the
    leader's log. On a refusal ``reject_index`` repeats the refused
    ``prev_index`` and the conflict hints let the leader skip a whole term per
    round trip: ``conflict_term`` is the follower's term at ``reject_index`` (0
    when its log is shorter) and ``conflict_index`` the first index it holds of
    that term (its last index + 1 when shorter). A refusal at or below what the
    follower acknowledged before tells the leader the follower lost entries (a
    crash that took unsynced writes, a lost disk): it probes it from what it holds.
    ``seq`` is the answered append's.
    """

    src: NodeId
    dst: NodeId
    term: int
    success: bool
    match_index: int = 0
    reject_index: int = 0
    conflict_index: int = 0
    conflict_term: int = 0
    seq: int = 0


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """The leader hands over: the receiver, fully caught up, campaigns at once."""

    src: NodeId
    dst: NodeId
    term: int


Message = RequestVote | RequestVoteResponse | AppendEntries | AppendEntriesResponse | TimeoutNow
