"""RaftConfig: the Raft core's tunables, in ticks of the shell's logical clock.

The node has no clock: the shell calls ``tick()`` on a timer and picks the
tick's length (say 100 ms, with DLedger-like defaults of a 300 ms heartbeat and
a 1-2 s election timeout).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidConfigError


@dataclass(frozen=True)
class RaftConfig:
    """Timeouts in ticks, replication budgets in bytes, entries and messages."""

    election_timeout_ticks: tuple[int, int] = (10, 20)
    """A follower campaigns after a random number of silent ticks in this closed range."""
    heartbeat_ticks: int = 3
    """The leader sends every follower an ``AppendEntries`` at least this often."""
    pre_vote: bool = True
    """Ask "could I win?" before bumping the term, so a node cut off cannot disrupt."""
    check_quorum: bool = True
    """A leader that hears from no quorum for ``election_timeout_ticks[0]`` ticks steps down,
    and nodes that heard from a leader that recently ignore vote requests (leader lease)."""
    max_append_bytes: int = 1 << 20
    """Byte budget of one ``AppendEntries`` (at least one entry is always sent)."""
    max_append_entries: int = 1024
    """Entry budget of one ``AppendEntries``."""
    max_inflight: int = 4
    """``AppendEntries`` with entries a leader keeps unacknowledged per follower."""
    noop_on_election: bool = True
    """A new leader appends an empty entry, so earlier terms' entries commit at once."""
    death_notice_stagger_ticks: int = 1
    """After a death notice of the leader, the k-th surviving member (by id) waits k times
    this before campaigning, so survivors told at once do not split the vote."""

    def __post_init__(self) -> None:
        lo, hi = self.election_timeout_ticks
        if not 1 <= lo <= hi:
            raise InvalidConfigError(
                f"election_timeout_ticks={self.election_timeout_ticks!r}: need 1 <= lo <= hi"
            )
        if not 1 <= self.heartbeat_ticks < lo:
            raise InvalidConfigError(
                f"heartbeat_ticks={self.heartbeat_ticks}: need 1 <= heartbeat_ticks < {lo} "
                "(the election timeout's lower bound)"
            )
        for name in ("max_append_bytes", "max_append_entries", "max_inflight"):
            if getattr(self, name) < 1:
                raise InvalidConfigError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.death_notice_stagger_ticks < 0:
            raise InvalidConfigError(
                f"death_notice_stagger_ticks={self.death_notice_stagger_ticks}: must be >= 0"
            )
