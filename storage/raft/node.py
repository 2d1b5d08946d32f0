"""RaftNode: one member of a DLedger group, as a pure state machine.

The node owns no thread, clock, socket or file. The shell drives it with
``tick()``, ``receive()``, ``propose()``, ``on_peer_dead()`` /
``start_election_now()``, ``transfer_leadership()`` and ``restart()``, then
drains ``ready()`` and follows ``Ready``'s order: persist, send, apply. The
node writes its entries into the ``RaftLog`` it was given but never assumes a
write is durable before the shell has synced it.

Rules (Raft, Ongaro & Ousterhout 2014, with the thesis's pre-vote and
check-quorum):

* Terms: a message with a higher term makes the node a follower of that term
  (except a pre-vote, and a vote request that a node in a leader's lease
  ignores); a message with a lower term is answered with the node's term (so a
  deposed leader or a stale candidate learns it) or dropped.
* Votes: one per term, persisted before the answer is sent, only to a
  candidate whose log is at least as up to date (last term, then last index);
  a pre-vote changes nothing but is granted by the same log rule.
* Replication: a follower accepts entries only after ``prev_index``/``prev_term``
  match, skips entries it already holds, truncates from the first conflicting
  entry (never a committed one) and appends the rest.
* Commit: a leader commits index N once a quorum holds it and N's entry is of
  the leader's own term (section 5.4.2); earlier entries commit with it. A
  follower's commit index follows the leader's, bounded by what it verified.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import InvalidConfigError, InvalidMessageError
from .config import RaftConfig
from .errors import NotLeaderError, RaftSafetyError
from .log import InMemoryRaftLog, RaftLog
from .messages import (
    AppendEntries,
    AppendEntriesResponse,
    Message,
    NodeId,
    RequestVote,
    RequestVoteResponse,
    TimeoutNow,
)
from .ready import HardState, Outbox, Proposal, Ready, Role, SoftState
from .replication import Replicator, accept_entries

_log = logging.getLogger("raymq.storage.raft")


class RaftNode:
    """One member of a Raft group of fixed membership ``{node_id} | peers``."""

    # Volatile state, (re)set by _reset_volatile.
    _role: Role
    _leader_id: NodeId | None
    _commit: int
    _votes: dict[NodeId, bool]
    _replicator: Replicator | None  # while leading
    _election_elapsed: int
    _timeout: int
    _lease_elapsed: int  # ticks since the leader was last heard from
    _force_campaign: bool  # the leader is known dead: campaigns ignore leases
    _campaign_force: bool  # the current campaign's force flag
    _notice_campaign_pending: bool
    _fenced: dict[NodeId, int]  # dead leader -> the term it led us in
    _broadcast_pending: bool

    def __init__(
        self,
        node_id: NodeId,
        peers: Iterable[NodeId],
        *,
        log: RaftLog | None = None,
        rng: random.Random | None = None,
        config: RaftConfig | None = None,
        hard_state: HardState | None = None,
        applied_index: int = 0,
        **options: Any,
    ) -> None:
        """``peers`` may include ``node_id``; ``hard_state`` and ``log`` are what the shell
        persisted, ``applied_index`` how far it applied; ``options`` override ``config``'s
        fields (``election_timeout_ticks=(10, 20)``, ``heartbeat_ticks=3`` ...)."""
        members = list(peers)
        if len(set(members)) != len(members):
            raise InvalidConfigError(f"peers={members!r}: a member is listed twice")
        base = config if config is not None else RaftConfig()
        try:
            self._config = dataclasses.replace(base, **options) if options else base
        except TypeError as e:
            fields = sorted(f.name for f in dataclasses.fields(RaftConfig))
            raise InvalidConfigError(
                f"unknown Raft option in {sorted(options)}; known: {fields}"
            ) from e
        self._id = node_id
        self._peers = tuple(p for p in members if p != node_id)
        self._peer_set = frozenset(self._peers)
        self._members = tuple(sorted((node_id, *self._peers)))
        self._quorum = len(self._members) // 2 + 1
        self._rng = rng if rng is not None else random.Random()
        self._log: RaftLog = log if log is not None else InMemoryRaftLog()
        hs = hard_state if hard_state is not None else HardState()
        self._term = hs.term
        self._voted_for = hs.voted_for
        self._outbox = Outbox(hs, applied_index)
        self._reset_volatile(applied_index)

    # -- the shell's inputs

    def tick(self) -> None:
        """Advance the logical clock one step."""
        if self._role is Role.LEADER:
            self._tick_leader()
            return
        self._election_elapsed += 1
        self._lease_elapsed += 1
        if self._election_elapsed >= self._timeout:
            self._campaign(force=self._force_campaign)

    def receive(self, msg: Message) -> None:
        """Handle one message from a peer (any order, any number of times)."""
        if msg.dst != self._id:
            raise ValueError(f"message for {msg.dst!r} delivered to {self._id!r}: {msg!r}")
        if msg.src not in self._peer_set:
            _log.warning("%s: dropping a message from non-member %r", self._id, msg.src)
            return
        if isinstance(msg, AppendEntries | TimeoutNow) and msg.term <= self._fenced.get(
            msg.src, -1
        ):
            return  # sent before its sender died: following it would undo the death notice
        if msg.term > self._term:
            if isinstance(msg, RequestVote):
                if self._in_lease() and not msg.force:
                    return  # a leader is alive: do not let a stray candidate depose it
                if not msg.pre_vote:
                    self._become_follower(msg.term, None)
            elif isinstance(msg, RequestVoteResponse) and msg.pre_vote and msg.granted:
                pass  # carries the term our pre-vote asked about, not a newer one
            else:
                leader = msg.src if isinstance(msg, AppendEntries | TimeoutNow) else None
                self._become_follower(msg.term, leader)
        elif msg.term < self._term:
            self._answer_stale(msg)
            return
        match msg:
            case AppendEntries():
                self._on_append_entries(msg)
            case AppendEntriesResponse():
                self._on_append_response(msg)
            case RequestVote():
                self._on_request_vote(msg)
            case RequestVoteResponse():
                self._on_vote_response(msg)
            case TimeoutNow():
                self._on_timeout_now(msg)

    def propose(self, entries: Sequence[bytes]) -> Proposal:
        """Append ``entries`` (non-empty bytes each) to the leader's log for replication.

        Raises ``NotLeaderError`` (with a leader hint) anywhere but on a leader
        that is not handing over. The proposal is acknowledged only when
        ``Ready.committed`` reports its indexes with its term.
        """
        if self._replicator is None:
            raise NotLeaderError(self._id, self._term, self._leader_id)
        if self._replicator.transfer_to is not None:
            raise NotLeaderError(
                self._id,
                self._term,
                self._replicator.transfer_to,
                "leadership is being transferred",
            )
        if not entries:
            raise InvalidMessageError("entries: a proposal needs at least one entry")
        for i, data in enumerate(entries):
            if not isinstance(data, bytes):
                raise InvalidMessageError(
                    f"entries[{i}]: expected bytes, got {type(data).__name__}"
                )
            if not data:
                raise InvalidMessageError(
                    f"entries[{i}]: empty; the empty entry is reserved for the leader's no-op"
                )
        first = self._log.last_index + 1
        self._append_own(entries)
        self._broadcast_pending = True  # sent at ready(): proposals until then share batches
        self._maybe_commit()
        return Proposal(self._term, first, self._log.last_index)

    def on_peer_dead(self, peer: NodeId) -> None:
        """The shell learned (e.g. from Ray) that ``peer`` died; if it led, elect a new leader
        now rather than after an election timeout."""
        if peer not in self._peer_set:
            return
        if self._replicator is not None:
            self._replicator.reprobe(peer, self._commit)
            return
        if peer != self._leader_id:
            return
        # Its messages still in flight must not make us follow it again; a restarted
        # incarnation can only lead a later term (it needs a new election).
        self._fenced[peer] = self._term
        self._leader_id = None
        self._force_campaign = True
        survivors = [m for m in self._members if m != peer]
        delay = survivors.index(self._id) * self._config.death_notice_stagger_ticks
        _log.info(
            "%s: leader %s of term %d died; campaigning in %d ticks",
            self._id,
            peer,
            self._term,
            delay,
        )
        if delay == 0:
            self._campaign(force=True)
        else:
            self._election_elapsed = 0
            self._timeout = delay
            self._notice_campaign_pending = True

    def start_election_now(self) -> None:
        """Campaign at once, as if the leader were known dead (no-op on a leader)."""
        if self._role is not Role.LEADER:
            self._force_campaign = True
            self._campaign(force=True)

    def transfer_leadership(self, target: NodeId) -> None:
        """Hand leadership to ``target`` once it is caught up (DLedger's preferred leader).

        Proposals are refused until the transfer completes or, after the
        election timeout's upper bound, is abandoned.
        """
        if self._replicator is None:
            raise NotLeaderError(self._id, self._term, self._leader_id)
        if target == self._id:
            return
        if target not in self._peer_set:
            raise InvalidConfigError(
                f"transfer target {target!r} is not a member of {self._members}"
            )
        _log.info("%s: transferring leadership of term %d to %s", self._id, self._term, target)
        self._replicator.transfer(target, self._commit)

    def restart(self, *, applied_index: int = 0) -> None:
        """Come back from a crash: persistent state (term, vote, log) kept, the rest lost.

        ``applied_index`` is how far the shell's durable state machine had
        applied; committed entries after it are reported again.
        """
        self._reset_volatile(applied_index)

    # -- the shell's outputs

    def ready(self) -> Ready:
        """Take what the node produced since the last call; see ``Ready`` for the order."""
        if self._broadcast_pending:
            self._broadcast_pending = False
            if self._replicator is not None:
                for peer in self._peers:
                    self._replicator.replicate(peer, self._commit)
        return self._outbox.take(
            self._term, self._voted_for, self._soft_state(), self._commit, self._log.last_index
        )

    def has_ready(self) -> bool:
        return self._broadcast_pending or self._outbox.pending(
            self._term, self._voted_for, self._soft_state(), self._commit
        )

    def _soft_state(self) -> SoftState:
        return SoftState(self._role, self._leader_id, self._term)

    # -- state

    @property
    def node_id(self) -> NodeId:
        return self._id

    @property
    def peers(self) -> tuple[NodeId, ...]:
        return self._peers

    @property
    def members(self) -> tuple[NodeId, ...]:
        return self._members

    @property
    def config(self) -> RaftConfig:
        return self._config

    @property
    def log(self) -> RaftLog:
        return self._log

    @property
    def term(self) -> int:
        return self._term

    @property
    def voted_for(self) -> NodeId | None:
        return self._voted_for

    @property
    def hard_state(self) -> HardState:
        return HardState(self._term, self._voted_for)

    @property
    def role(self) -> Role:
        return self._role

    @property
    def is_leader(self) -> bool:
        return self._role is Role.LEADER

    @property
    def leader_id(self) -> NodeId | None:
        return self._leader_id

    @property
    def commit_index(self) -> int:
        return self._commit

    def match_index(self, peer: NodeId) -> int:
        """On a leader, the last index known replicated to ``peer``."""
        return self._replicator.progress[peer].match if self._replicator is not None else 0

    def __repr__(self) -> str:
        return (
            f"RaftNode({self._id!r}, {self._role.value}, term={self._term}, "
            f"leader={self._leader_id!r}, last={self._log.last_index}, commit={self._commit})"
        )

    # -- roles

    def _reset_volatile(self, applied_index: int) -> None:
        if not 0 <= applied_index <= self._log.last_index:
            raise RaftSafetyError(
                f"{self._id}: applied_index {applied_index} is outside the log "
                f"[0, {self._log.last_index}]: committed entries were lost"
            )
        if self._log.last_term > self._term:
            # A crash between syncing the log and writing the hard state: the node
            # cannot hold entries of a term it never reached, so it reaches it now
            # (with no vote in it, as none could have been sent).
            _log.warning(
                "%s: log's last term %d is above the persisted term %d; adopting it",
                self._id,
                self._log.last_term,
                self._term,
            )
            self._term = self._log.last_term
            self._voted_for = None
        self._role = Role.FOLLOWER
        self._leader_id = None
        self._commit = applied_index
        self._votes = {}
        self._replicator = None
        self._election_elapsed = 0
        self._timeout = self._random_timeout()
        self._lease_elapsed = 0
        self._force_campaign = False
        self._campaign_force = False
        self._notice_campaign_pending = False
        self._fenced = {}
        self._broadcast_pending = False
        # Unsent messages and unsynced marks die with the process; what was persisted stays.
        self._outbox = Outbox(self._outbox.persisted, applied_index)

    def _random_timeout(self) -> int:
        lo, hi = self._config.election_timeout_ticks
        return self._rng.randint(lo, hi)

    def _reset_election_timer(self) -> None:
        self._election_elapsed = 0
        self._timeout = self._random_timeout()
        self._notice_campaign_pending = False

    def _become_follower(self, term: int, leader: NodeId | None) -> None:
        if term > self._term:
            self._term = term
            self._voted_for = None
        if self._role is Role.LEADER:
            _log.info("%s: stepping down as leader, now term %d", self._id, self._term)
        self._role = Role.FOLLOWER
        self._leader_id = leader
        self._votes = {}
        self._replicator = None
        self._reset_election_timer()
        if leader is not None:
            self._lease_elapsed = 0
            self._force_campaign = False

    def _campaign(self, *, force: bool) -> None:
        if self._config.pre_vote:
            self._start_pre_vote(force)
        else:
            self._start_election(force)

    def _start_pre_vote(self, force: bool) -> None:
        self._role = Role.PRE_CANDIDATE
        self._leader_id = None
        self._votes = {self._id: True}
        self._campaign_force = force
        self._reset_election_timer()
        _log.debug("%s: pre-vote for term %d", self._id, self._term + 1)
        self._request_votes(self._term + 1, pre_vote=True, force=force)
        self._tally()

    def _start_election(self, force: bool) -> None:
        self._term += 1
        self._voted_for = self._id
        self._role = Role.CANDIDATE
        self._leader_id = None
        self._votes = {self._id: True}
        self._reset_election_timer()
        _log.debug("%s: campaigning for term %d", self._id, self._term)
        self._request_votes(self._term, pre_vote=False, force=force)
        self._tally()

    def _request_votes(self, term: int, *, pre_vote: bool, force: bool) -> None:
        last_index, last_term = self._log.last_index, self._log.last_term
        for peer in self._peers:
            self._send(RequestVote(self._id, peer, term, last_index, last_term, pre_vote, force))

    def _tally(self) -> None:
        granted = sum(self._votes.values())
        if granted >= self._quorum:
            if self._role is Role.PRE_CANDIDATE:
                self._start_election(self._campaign_force)
            else:
                self._become_leader()
        elif len(self._votes) - granted > len(self._members) - self._quorum:
            self._become_follower(self._term, None)

    def _become_leader(self) -> None:
        self._role = Role.LEADER
        self._leader_id = self._id
        self._votes = {}
        self._force_campaign = False
        self._replicator = replicator = Replicator(
            self._id,
            self._term,
            self._peers,
            self._quorum,
            self._log,
            self._config,
            self._outbox.messages,
        )
        _log.info(
            "%s: leader of term %d (last index %d, commit %d)",
            self._id,
            self._term,
            self._log.last_index,
            self._commit,
        )
        if self._config.noop_on_election:
            self._append_own([b""])
        for peer in self._peers:
            replicator.replicate(peer, self._commit)
        self._maybe_commit()

    def _in_lease(self) -> bool:
        """Whether a leader was heard from recently enough to refuse disruptive votes."""
        if not self._config.check_quorum:
            return False
        if self._role is Role.LEADER:
            return True
        return (
            self._leader_id is not None
            and self._lease_elapsed < self._config.election_timeout_ticks[0]
        )

    def _tick_leader(self) -> None:
        assert self._replicator is not None
        if not self._replicator.tick(self._commit):
            _log.warning(
                "%s: leader of term %d heard from no quorum in %d ticks; stepping down",
                self._id,
                self._term,
                self._config.election_timeout_ticks[0],
            )
            self._become_follower(self._term, None)

    # -- messages

    def _send(self, msg: Message) -> None:
        self._outbox.messages.append(msg)

    def _answer_stale(self, msg: Message) -> None:
        """Tell a sender of an older term about the current one (so a deposed leader or a
        stale candidate steps down); stale answers and hand-overs are dropped."""
        if isinstance(msg, AppendEntries):
            self._send(
                AppendEntriesResponse(
                    self._id, msg.src, self._term, False, reject_index=msg.prev_index
                )
            )
        elif isinstance(msg, RequestVote):
            self._send(RequestVoteResponse(self._id, msg.src, self._term, False, msg.pre_vote))

    def _on_request_vote(self, m: RequestVote) -> None:
        log = self._log
        up_to_date = (m.last_log_term, m.last_log_index) >= (log.last_term, log.last_index)
        if m.pre_vote:
            can_vote = m.term > self._term
        else:  # m.term == self._term here
            can_vote = self._voted_for == m.src or (
                self._voted_for is None and self._leader_id is None
            )
        granted = can_vote and up_to_date
        if granted and not m.pre_vote:
            self._voted_for = m.src
            self._reset_election_timer()
        elif granted and self._notice_campaign_pending:
            # Another survivor of the leader's death campaigns first: let it win.
            self._reset_election_timer()
        _log.debug(
            "%s: %s %svote to %s for term %d",
            self._id,
            "granting" if granted else "refusing",
            "pre-" if m.pre_vote else "",
            m.src,
            m.term,
        )
        term = m.term if granted and m.pre_vote else self._term
        self._send(RequestVoteResponse(self._id, m.src, term, granted, m.pre_vote))

    def _on_vote_response(self, m: RequestVoteResponse) -> None:
        if m.pre_vote:
            if self._role is not Role.PRE_CANDIDATE or (m.granted and m.term != self._term + 1):
                return
        elif self._role is not Role.CANDIDATE:
            return
        self._votes[m.src] = m.granted
        self._tally()

    def _on_timeout_now(self, m: TimeoutNow) -> None:
        if self._role is Role.LEADER or m.src != self._leader_id:
            return
        _log.info("%s: leadership handed over by %s; campaigning", self._id, m.src)
        self._start_election(force=True)

    def _on_append_entries(self, m: AppendEntries) -> None:
        if self._role is Role.LEADER:
            raise RaftSafetyError(f"two leaders in term {self._term}: {self._id} and {m.src}")
        if self._role is not Role.FOLLOWER or self._leader_id != m.src:
            self._become_follower(self._term, m.src)
        else:
            self._election_elapsed = 0
            self._lease_elapsed = 0
        try:
            got = accept_entries(self._log, self._commit, m)
        except RaftSafetyError as e:
            raise RaftSafetyError(f"{self._id}: {e}") from None
        if got.truncated_from is not None:
            _log.info("%s: truncated divergent entries from %d", self._id, got.truncated_from)
            self._outbox.log_truncated(got.truncated_from)
        if got.appended_from is not None:
            self._outbox.log_appended(got.appended_from)
        if got.success and m.leader_commit > self._commit:
            self._commit = max(self._commit, min(m.leader_commit, got.match_index))
        self._send(
            AppendEntriesResponse(
                self._id,
                m.src,
                self._term,
                got.success,
                match_index=got.match_index,
                reject_index=0 if got.success else m.prev_index,
                conflict_index=got.conflict_index,
                conflict_term=got.conflict_term,
                seq=m.seq,
            )
        )

    def _on_append_response(self, m: AppendEntriesResponse) -> None:
        if self._replicator is not None and self._replicator.on_response(m, self._commit):
            self._maybe_commit()

    def _maybe_commit(self) -> None:
        if self._replicator is None:
            return
        n = self._replicator.quorum_index()
        # Only an entry of the leader's own term is committed by counting replicas
        # (section 5.4.2); it commits every entry before it.
        if n > self._commit and self._log.term_at(n) == self._term:
            self._commit = n

    def _append_own(self, entries: Sequence[bytes]) -> None:
        self._outbox.log_appended(self._log.last_index + 1)
        self._log.append(entries, self._term)
