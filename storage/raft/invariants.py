"""Raft's safety invariants, checked over a simulated cluster after every step.

* Election safety: at most one leader per term.
* Persistent state: a node's term never goes back, and its vote never changes
  within a term.
* State machine safety: every index reported committed by any node keeps the
  same entry, and every node's log holds the committed entries up to its own
  commit index.
* Log matching: if two logs hold an entry with the same index and term, they
  are identical up to it.
* Leader completeness: an entry committed at some term is in the log of every
  leader of that term or a later one.
* Acknowledgement: a proposal committed with its term holds what was proposed.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from .log import InMemoryRaftLog
from .messages import Entry, NodeId
from .node import RaftNode
from .ready import HardState, Proposal, Role


class SafetyViolation(AssertionError):
    """A Raft invariant failed in a simulated run (the message names seed and tick)."""


class SimLog(InMemoryRaftLog):
    """An in-memory log that remembers how far down it was truncated, for the checker."""

    def __init__(self) -> None:
        super().__init__()
        self._low_water: int | None = None
        self.version = 0
        """Counts changes, so the checker skips logs that did not change."""

    def append(self, entries: Sequence[bytes], term: int) -> int:
        self.version += 1
        return super().append(entries, term)

    def truncate_from(self, index: int) -> None:
        super().truncate_from(index)
        self.version += 1
        if self._low_water is None or index < self._low_water:
            self._low_water = index

    def take_low_water(self) -> int | None:
        """The lowest index truncated since the last call, if any."""
        low, self._low_water = self._low_water, None
        return low


class CheckedCluster(Protocol):
    """What the checker reads of a cluster (``sim.SimCluster`` has it), named here so the
    simulator builds on this module and not the other way round."""

    @property
    def ids(self) -> Sequence[NodeId]: ...

    @property
    def logs(self) -> Mapping[NodeId, SimLog]: ...

    @property
    def nodes(self) -> Mapping[NodeId, RaftNode]: ...

    @property
    def disk(self) -> Mapping[NodeId, HardState]: ...

    @property
    def alive(self) -> Collection[NodeId]: ...

    @property
    def seed(self) -> int: ...

    @property
    def now(self) -> int: ...

    def describe(self) -> str: ...


class SafetyChecker:
    """Raft's invariants over a ``SimCluster``; ``check`` after every step.

    Checks are incremental, so a run costs time linear in its length: a log
    prefix found equal to the committed entries (or to another log) stays so
    until the log is truncated below it, which ``SimLog`` reports.
    """

    def __init__(self, cluster: CheckedCluster) -> None:
        self._cluster = cluster
        self.leaders: dict[int, NodeId] = {}
        self.committed: list[Entry] = []
        """Every entry ever reported committed, index i at position i - 1."""
        self._committed_by_term: dict[int, int] = {}
        """Highest index reported committed by a node at each term: leaders of that term or
        later must hold everything up to it."""
        self._proposed: dict[tuple[int, int], bytes] = {}
        self._hard: dict[NodeId, HardState] = {}
        self._verified = dict.fromkeys(cluster.ids, 0)
        """Per node: its log's first k entries are known to be the committed ones."""
        self._pairs = list(itertools.combinations(cluster.ids, 2))
        self._agree = dict.fromkeys(self._pairs, 0)
        """Per pair of nodes: their logs' first k entries are known to be identical."""
        self._agreed_at = dict.fromkeys(self._pairs, (-1, -1))
        """Per pair: the logs' versions when last compared."""

    def on_proposed(self, proposal: Proposal, entries: list[bytes]) -> None:
        for index, data in zip(proposal.indexes, entries, strict=True):
            self._proposed[(proposal.term, index)] = data

    def on_leader(self, node_id: NodeId, term: int) -> None:
        """A node announced (in a ``Ready``'s soft state) that it leads ``term``."""
        first = self.leaders.setdefault(term, node_id)
        if first != node_id:
            self._fail(f"two leaders in term {term}: {first} and {node_id}")

    def on_committed(self, node: RaftNode, index: int) -> None:
        entry = self._cluster.logs[node.node_id].view[index - 1]
        if index <= len(self.committed):
            if self.committed[index - 1] != entry:
                self._fail(
                    f"{node.node_id} reports index {index} committed as {entry!r}, "
                    f"committed before as {self.committed[index - 1]!r}"
                )
        elif index == len(self.committed) + 1:
            self.committed.append(entry)
        else:
            self._fail(f"{node.node_id} reports index {index} committed past a gap")
        expected = self._proposed.get((entry.term, index))
        if expected is not None and expected != entry.data:
            self._fail(
                f"proposal at term {entry.term} index {index} was {expected!r}, "
                f"acknowledged as {entry.data!r}"
            )
        if index > self._committed_by_term.get(node.term, 0):
            self._committed_by_term[node.term] = index

    def check(self) -> None:
        c = self._cluster
        for i in c.ids:
            low = c.logs[i].take_low_water()
            if low is not None:
                self._verified[i] = min(self._verified[i], low - 1)
                for pair in self._pairs:
                    if i in pair:
                        self._agree[pair] = min(self._agree[pair], low - 1)
        for i in c.ids:
            node = c.nodes[i]
            hs = c.disk[i]
            old = self._hard.get(i)
            if old is not None and (
                hs.term < old.term
                or (hs.term == old.term and old.voted_for not in (None, hs.voted_for))
            ):
                self._fail(f"{i}: persistent state went from {old} to {hs}")
            self._hard[i] = hs
            self._require_committed(i, node.commit_index, "its commit index")
            if i in c.alive and node.role is Role.LEADER:
                self.on_leader(i, node.term)
                need = max(
                    (n for t, n in self._committed_by_term.items() if t <= node.term), default=0
                )
                self._require_committed(i, need, f"leadership of term {node.term}")
        for pair in self._pairs:
            la, lb = c.logs[pair[0]], c.logs[pair[1]]
            versions = (la.version, lb.version)
            if self._agreed_at[pair] == versions:
                continue
            self._agreed_at[pair] = versions
            va, vb = la.view, lb.view
            same = self._agree[pair]
            m = min(len(va), len(vb))
            while same < m and va[same] == vb[same]:
                same += 1
            self._agree[pair] = same
            k = m
            while k > same and va[k - 1].term != vb[k - 1].term:
                k -= 1
            if k > same:
                self._fail(
                    f"logs of {pair[0]} and {pair[1]} both hold term {va[k - 1].term} at "
                    f"index {k} but differ at index {same + 1}"
                )

    def _require_committed(self, node_id: NodeId, upto: int, why: str) -> None:
        known = self._verified[node_id]
        if upto <= known:
            return
        view = self._cluster.logs[node_id].view
        if upto > len(view) or view[known:upto] != self.committed[known:upto]:
            self._fail(f"{node_id}: log up to {upto} ({why}) differs from the committed entries")
        self._verified[node_id] = upto

    def _fail(self, what: str) -> None:
        c = self._cluster
        raise SafetyViolation(f"seed {c.seed}, tick {c.now}: {what}; nodes: {c.describe()}")
