"""What a RaftNode hands its shell: roles, persistent state, proposals and ``Ready`` batches."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .messages import Message, NodeId


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True)
class HardState:
    """The node's persistent state besides the log: the shell stores it and passes it back."""

    term: int = 0
    voted_for: NodeId | None = None


@dataclass(frozen=True)
class SoftState:
    """Volatile facts the shell reacts to (e.g. registering as master or slave)."""

    role: Role
    leader_id: NodeId | None
    term: int


@dataclass(frozen=True)
class Proposal:
    """Where a proposal landed: it is acknowledged once an index in ``indexes`` is reported
    committed with this ``term``; committed with another term, it was lost."""

    term: int
    first_index: int
    last_index: int

    @property
    def indexes(self) -> range:
        return range(self.first_index, self.last_index + 1)


@dataclass(frozen=True)
class Ready:
    """Everything the node produced since the last ``ready()``, in the order to handle it.

    1. Make durable (``must_sync``) the ``hard_state`` (if not ``None``) and the
       log, which was truncated from ``log_truncated_from`` and/or appended at
       ``log_appended`` (the node already wrote them into its ``RaftLog``).
       Their order does not matter: a node booted with a log whose last term
       is above the persisted term adopts that term, with no vote.
    2. Only then send ``messages``: a vote or an acknowledgement promises state
       that must survive a crash.
    3. Then apply ``committed`` (log indexes, in order; read the entries from
       the log, skipping the leader's empty no-ops) and acknowledge the
       proposals whose indexes they cover with the proposal's term.
    """

    messages: tuple[Message, ...] = ()
    hard_state: HardState | None = None
    log_truncated_from: int | None = None
    log_appended: range = field(default_factory=lambda: range(0))
    committed: range = field(default_factory=lambda: range(0))
    soft_state: SoftState | None = None

    @property
    def must_sync(self) -> bool:
        return (
            self.hard_state is not None
            or self.log_truncated_from is not None
            or len(self.log_appended) > 0
        )

    def __bool__(self) -> bool:
        return bool(
            self.messages or self.must_sync or len(self.committed) or self.soft_state is not None
        )


class Outbox:
    """What a node produced since its last ``Ready``, and what that ``Ready`` reported.

    A ``Ready`` carries only changes: the hard state, soft state and commit
    index are compared with what was last handed out.
    """

    def __init__(self, persisted: HardState, commit: int) -> None:
        self.messages: list[Message] = []
        self.truncated_from: int | None = None
        self.appended_from: int | None = None
        self.persisted = persisted
        self.reported_soft: SoftState | None = None
        self.reported_commit = commit

    def log_appended(self, first: int) -> None:
        if self.appended_from is None:
            self.appended_from = first

    def log_truncated(self, index: int) -> None:
        if self.truncated_from is None or index < self.truncated_from:
            self.truncated_from = index
        if self.appended_from is not None and self.appended_from >= index:
            self.appended_from = None  # what was appended there is gone

    def pending(self, term: int, voted_for: NodeId | None, soft: SoftState, commit: int) -> bool:
        return bool(
            self.messages
            or self.truncated_from is not None
            or self.appended_from is not None
            or commit > self.reported_commit
            or term != self.persisted.term
            or voted_for != self.persisted.voted_for
            or soft != self.reported_soft
        )

    def take(
        self, term: int, voted_for: NodeId | None, soft: SoftState, commit: int, last_index: int
    ) -> Ready:
        """A ``Ready`` of everything unreported (the shared empty one if nothing is)."""
        if not self.pending(term, voted_for, soft, commit):
            return _NOTHING
        hard = None
        if term != self.persisted.term or voted_for != self.persisted.voted_for:
            hard = self.persisted = HardState(term, voted_for)
        changed_soft = None if soft == self.reported_soft else soft
        self.reported_soft = soft
        appended = range(0)
        if self.appended_from is not None:
            appended = range(self.appended_from, last_index + 1)
        ready = Ready(
            messages=tuple(self.messages),
            hard_state=hard,
            log_truncated_from=self.truncated_from,
            log_appended=appended,
            committed=range(self.reported_commit + 1, commit + 1),
            soft_state=changed_soft,
        )
        self.messages.clear()  # in place: a leader's Replicator appends to this list
        self.truncated_from = None
        self.appended_from = None
        self.reported_commit = commit
        return ready


_NOTHING = Ready()
