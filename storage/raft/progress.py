"""Progress: what a leader knows of one follower's log, and how it sends to it.

A follower is probed (``PROBE``: one ``AppendEntries`` at a time, walking
``next`` back on refusals with the conflict hints) until one is accepted, then
replicated to (``REPLICATE``: ``next`` advances as batches are sent, up to
``max_inflight`` unacknowledged). Any refusal while replicating means a batch
was lost or reordered: back to probing from the follower's hint.

Invariants: ``match < next``; ``match`` never decreases within a term (a
follower never drops entries it acknowledged to this term's leader);
``inflight`` holds ascending last indexes of batches sent past ``match``.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field


class ReplicationState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"


@dataclass(slots=True)
class Progress:
    next: int
    match: int = 0
    state: ReplicationState = ReplicationState.PROBE
    probe_sent: bool = False
    inflight: deque[int] = field(default_factory=deque)
    active: bool = False
    """Heard from since the leader's last quorum check."""

    def probe_from(self, next_index: int) -> None:
        self.state = ReplicationState.PROBE
        self.next = max(self.match + 1, next_index)
        self.probe_sent = False
        self.inflight.clear()

    def replicate(self) -> None:
        self.state = ReplicationState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflight.clear()

    def acknowledge(self, match_index: int) -> bool:
        """Record an acknowledged ``match_index``; True if ``match`` advanced."""
        while self.inflight and self.inflight[0] <= match_index:
            self.inflight.popleft()
        if match_index <= self.match:
            return False
        self.match = match_index
        self.next = max(self.next, match_index + 1)
        return True
