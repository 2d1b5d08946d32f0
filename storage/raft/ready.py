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

    1. Persist ``hard_state`` (if not ``None``) and sync the log (``must_sync``):
       it was truncated from ``log_truncated_from`` and/or appended at
       ``log_appended``. If the two writes cannot be atomic, persist the hard
       state first.
    2. Only then send ``messages`` (a vote or an acknowledgement promises state
       that must survive a crash).
    3. Then apply ``committed`` (log indexes, in order) and acknowledge the
       proposals they complete.
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
