"""Log replication (Raft section 5.3): the leader's side and the follower's side.

Leader: a ``Replicator`` lives for one term of leadership and keeps a
``Progress`` per follower. A follower is probed (``PROBE``: one
``AppendEntries`` at a time, walking ``next`` back on refusals with the
follower's conflict hints, a whole term per round trip) until one is accepted,
then replicated to (``REPLICATE``: ``next`` advances as batches are sent, up to
``max_inflight`` unacknowledged batches of ``max_append_bytes`` /
``max_append_entries``). A refusal while replicating means a batch was lost or
overtaken: back to probing from the follower's hint. Heartbeats are empty
``AppendEntries`` at the acknowledged index, which batches still in flight
cannot make fail; batches left unanswered for an election timeout are taken as
lost, and the follower is probed again from its acknowledged index.

A follower can hold less than it acknowledged: a crash took writes it had not
synced, or its disk was lost or cut. Its refusal at or below ``match`` (or its
hint that its log ends below it) says so; the leader then forgets ``match``
(the follower is unknown again) and probes it from what it says it holds, down
to the start of the log if need be. Every ``AppendEntries`` carries a sequence
number of the leader's term that its answer repeats. Only a refusal of an append
sent after the leader learned ``match`` counts as such news: that append reached
the follower after it had acknowledged ``match`` (messages overtaking each
other, duplicates and answers to older appends never make the leader forget).

Follower: ``accept_entries`` applies one ``AppendEntries`` to the log: refuse
unless ``prev_index``/``prev_term`` match; skip entries already held (a retry,
a duplicate, an overtaken batch must never truncate newer entries); truncate
from the first entry whose term differs, which is never a committed one; append
the rest.

Invariants: ``match < next`` per follower; ``match`` decreases within a term
only to 0, when the follower shows it lost entries it had acknowledged (the
commit index never decreases: what was committed stays committed, and the
follower is sent it again); ``inflight`` holds ascending last indexes of batches
sent past ``match``.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from dataclasses import dataclass, field

from .config import RaftConfig
from .errors import RaftSafetyError
from .log import RaftLog
from .messages import AppendEntries, AppendEntriesResponse, Entry, Message, NodeId, TimeoutNow

_log = logging.getLogger("raymq.storage.raft")


class ReplicationState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"


_PROBE = ReplicationState.PROBE
_REPLICATE = ReplicationState.REPLICATE


@dataclass(slots=True)
class Progress:
    """What the leader knows of one follower's log."""

    next: int
    match: int = 0
    state: ReplicationState = ReplicationState.PROBE
    probe_sent: bool = False
    inflight: deque[int] = field(default_factory=deque)
    stalled: int = 0
    """Ticks of heartbeats without progress while batches are in flight."""
    active: bool = False
    """Heard from since the leader's last quorum check."""
    match_seq: int = 0
    """The leader's last sequence number when ``match`` last advanced: an append sent
    after it reached the follower after the follower had acknowledged ``match``."""
    lost_seq: int = 0
    """The leader's last sequence number when it learned that the follower lost entries:
    an acceptance of an append sent up to then no longer says what it holds."""

    def probe_from(self, next_index: int) -> None:
        self.state = _PROBE
        self.next = max(self.match + 1, next_index)
        self.probe_sent = False
        self.inflight.clear()
        self.stalled = 0

    def replicate(self) -> None:
        self.state = _REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflight.clear()
        self.stalled = 0

    def acknowledge(self, match_index: int, seq: int) -> bool:
        """Record an acknowledged ``match_index`` (learned when the leader's last sequence
        number is ``seq``); True if ``match`` advanced."""
        while self.inflight and self.inflight[0] <= match_index:
            self.inflight.popleft()
        if match_index <= self.match:
            return False
        self.match = match_index
        self.match_seq = seq
        self.next = max(self.next, match_index + 1)
        self.stalled = 0
        return True

    def forget(self, seq: int, next_index: int) -> None:
        """The follower lost entries it acknowledged (learned when the leader's last
        sequence number is ``seq``): nothing of its log is known to match any more; probe
        it from ``next_index``, what it says it holds."""
        self.match = 0
        self.lost_seq = seq
        self.probe_from(next_index)


class Replicator:
    """A leader's state for one term: whom to send what, who holds what, and its timers
    (heartbeats, the quorum check, a leadership transfer in progress).

    Messages go to ``out`` (the node's outbox); the leader's commit index is
    passed in because every ``AppendEntries`` carries it.
    """

    def __init__(
        self,
        node_id: NodeId,
        term: int,
        peers: tuple[NodeId, ...],
        quorum: int,
        log: RaftLog,
        config: RaftConfig,
        out: list[Message],
    ) -> None:
        self._id = node_id
        self._term = term
        self._quorum = quorum
        self._log = log
        self._config = config
        self._out = out
        next_index = log.last_index + 1
        self.progress = {peer: Progress(next=next_index) for peer in peers}
        self.transfer_to: NodeId | None = None
        self._transfer_elapsed = 0
        self._heartbeat_elapsed = 0
        self._quorum_elapsed = 0
        self._seq = 0  # the last AppendEntries' sequence number

    def tick(self, commit: int) -> bool:
        """Advance the timers; False if no quorum answered for an election timeout's lower
        bound, so the leader must step down (it may be cut off from the majority)."""
        cfg = self._config
        if self.transfer_to is not None:
            self._transfer_elapsed += 1
            if self._transfer_elapsed >= cfg.election_timeout_ticks[1]:
                _log.info("%s: transfer to %s timed out", self._id, self.transfer_to)
                self.transfer_to = None
        if cfg.check_quorum:
            self._quorum_elapsed += 1
            if self._quorum_elapsed >= cfg.election_timeout_ticks[0]:
                self._quorum_elapsed = 0
                heard = 1 + sum(pr.active for pr in self.progress.values())
                for pr in self.progress.values():
                    pr.active = False
                if heard < self._quorum:
                    return False
        self._heartbeat_elapsed += 1
        if self._heartbeat_elapsed >= cfg.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            for peer in self.progress:
                self.replicate(peer, commit, heartbeat=True)
        return True

    def transfer(self, target: NodeId, commit: int) -> None:
        """Hand over to ``target``: tell it to campaign as soon as it holds the whole log."""
        self.transfer_to = target
        self._transfer_elapsed = 0
        if self.progress[target].match == self._log.last_index:
            self._out.append(TimeoutNow(self._id, target, self._term))
        else:
            self.reprobe(target, commit)

    def replicate(self, peer: NodeId, commit: int, *, heartbeat: bool = False) -> None:
        """Send ``peer`` what flow control allows; on a heartbeat, at least an empty batch."""
        pr = self.progress[peer]
        if pr.state is _PROBE:
            if not pr.probe_sent:
                self._send(peer, pr.next, commit, with_entries=True)
                pr.probe_sent = True
            elif heartbeat:  # the probe may be lost: ask again, cheaply
                self._send(peer, pr.next, commit, with_entries=False)
            return
        if heartbeat and pr.inflight:
            pr.stalled += self._config.heartbeat_ticks
            if pr.stalled >= self._config.election_timeout_ticks[0]:
                # No answer for an election timeout: the batches in flight were lost.
                pr.probe_from(pr.match + 1)
                self.replicate(peer, commit)
                return
        last = self._log.last_index
        sent = False
        while pr.next <= last and len(pr.inflight) < self._config.max_inflight:
            sent_last = self._send(peer, pr.next, commit, with_entries=True)
            pr.inflight.append(sent_last)
            pr.next = sent_last + 1
            sent = True
        if heartbeat and not sent:
            # At the acknowledged index, so batches still in flight cannot make it fail.
            self._send(peer, pr.match + 1, commit, with_entries=False)

    def on_response(self, m: AppendEntriesResponse, commit: int) -> bool:
        """Handle a follower's answer of this term; True if its match index advanced."""
        pr = self.progress[m.src]
        pr.active = True
        if m.success:
            if m.seq <= pr.lost_seq:
                return False  # sent before the follower showed it lost entries
            advanced = pr.acknowledge(m.match_index, self._seq)
            if pr.state is _PROBE and m.match_index >= pr.match:
                pr.replicate()
            if self.transfer_to == m.src and pr.match == self._log.last_index:
                self._out.append(TimeoutNow(self._id, m.src, self._term))
            self.replicate(m.src, commit)
            return advanced
        if m.seq > pr.match_seq and (
            m.reject_index <= pr.match or (m.conflict_term == 0 and m.conflict_index <= pr.match)
        ):
            # Sent after it acknowledged match, the append is refused at or below match, or
            # its log ends below it: it lost entries (a crash took unsynced writes, or its
            # disk). Trust its log as it is now and probe down to where it matches.
            _log.warning(
                "%s: %s holds less than it acknowledged (match %d; it refused %d, its hint "
                "%d of term %d): probing it from there",
                self._id,
                m.src,
                pr.match,
                m.reject_index,
                m.conflict_index,
                m.conflict_term,
            )
            pr.forget(self._seq, min(self._next_from_hint(m), m.reject_index))
            self.replicate(m.src, commit)
            return False
        if pr.state is _REPLICATE:
            if m.reject_index <= pr.match:
                return False  # refusal of a batch sent before the follower caught up
        elif m.reject_index != pr.next - 1:
            return False  # refusal of an older probe
        pr.probe_from(min(self._next_from_hint(m), m.reject_index))
        self.replicate(m.src, commit)
        return False

    def reprobe(self, peer: NodeId, commit: int) -> None:
        """Forget what is in flight to ``peer`` (it died, or must catch up now) and probe it
        again from its acknowledged index."""
        pr = self.progress[peer]
        pr.probe_from(pr.match + 1)
        self.replicate(peer, commit)

    def quorum_index(self) -> int:
        """The highest index the leader and a quorum of the group hold."""
        matches = sorted(
            [self._log.last_index, *(pr.match for pr in self.progress.values())], reverse=True
        )
        return matches[self._quorum - 1]

    def _send(self, peer: NodeId, next_index: int, commit: int, *, with_entries: bool) -> int:
        prev = next_index - 1
        entries: tuple[Entry, ...] = ()
        if with_entries and next_index <= self._log.last_index:
            cfg = self._config
            entries = tuple(
                self._log.entries(
                    next_index, max_bytes=cfg.max_append_bytes, max_count=cfg.max_append_entries
                )
            )
        self._seq += 1
        self._out.append(
            AppendEntries(
                self._id,
                peer,
                self._term,
                prev,
                self._log.term_at(prev),
                entries,
                commit,
                self._seq,
            )
        )
        return prev + len(entries)

    def _next_from_hint(self, m: AppendEntriesResponse) -> int:
        """Where to probe next: after the leader's last entry of the follower's conflicting
        term if it has one, else at the follower's first entry of that term."""
        if m.conflict_term > 0:
            lo, hi = 0, min(m.reject_index, self._log.last_index)
            while lo < hi:  # the last index whose term is <= conflict_term
                mid = (lo + hi + 1) // 2
                if self._log.term_at(mid) <= m.conflict_term:
                    lo = mid
                else:
                    hi = mid - 1
            if lo > 0 and self._log.term_at(lo) == m.conflict_term:
                return lo + 1
        return max(1, m.conflict_index)


@dataclass(frozen=True, slots=True)
class Accepted:
    """What ``accept_entries`` did to the log."""

    success: bool
    match_index: int = 0
    conflict_index: int = 0
    conflict_term: int = 0
    truncated_from: int | None = None
    appended_from: int | None = None


def accept_entries(log: RaftLog, commit: int, m: AppendEntries) -> Accepted:
    """Apply a leader's ``AppendEntries`` (of the follower's current term) to ``log``.

    ``commit`` is the follower's commit index: a leader contradicting an entry
    at or below it means Raft's guarantees were broken (``RaftSafetyError``).
    """
    prev = m.prev_index
    if prev > log.last_index:
        return Accepted(False, conflict_index=log.last_index + 1)
    if log.term_at(prev) != m.prev_term:
        if prev <= commit:
            raise RaftSafetyError(
                f"committed entry {prev} has term {log.term_at(prev)}, "
                f"leader {m.src} of term {m.term} says {m.prev_term}"
            )
        conflict_term = log.term_at(prev)
        return Accepted(
            False,
            conflict_index=_first_index_of_term(log, conflict_term, commit + 1, prev),
            conflict_term=conflict_term,
        )
    entries = m.entries
    skip = 0
    truncated_from = None
    last = log.last_index
    while skip < len(entries) and prev + 1 + skip <= last:
        index = prev + 1 + skip
        if log.term_at(index) != entries[skip].term:
            if index <= commit:
                raise RaftSafetyError(
                    f"leader {m.src} of term {m.term} conflicts with committed entry {index}"
                )
            log.truncate_from(index)
            truncated_from = index
            break
        skip += 1
    appended_from = None
    if skip < len(entries):
        appended_from = log.last_index + 1
        start = skip  # one RaftLog.append per run of equal terms
        for end in range(skip + 1, len(entries) + 1):
            if end == len(entries) or entries[end].term != entries[start].term:
                log.append([e.data for e in entries[start:end]], entries[start].term)
                start = end
    return Accepted(
        True, match_index=m.last_index, truncated_from=truncated_from, appended_from=appended_from
    )


def _first_index_of_term(log: RaftLog, term: int, lo: int, hi: int) -> int:
    """The first index in [lo, hi] whose term is ``term``, given term_at(hi) == term."""
    while lo < hi:
        mid = (lo + hi) // 2
        if log.term_at(mid) >= term:
            hi = mid
        else:
            lo = mid + 1
    return lo
