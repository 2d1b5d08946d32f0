"""Errors of the Raft core, in RayMQ's one hierarchy."""

from __future__ import annotations

from ..errors import RayMQError
from .messages import NodeId


class RaftError(RayMQError):
    """Base of the errors the Raft core raises."""


class NotLeaderError(RaftError):
    """A proposal (or transfer) reached a node that is not the group's leader.

    ``leader_hint`` is the node this one believes leads (``None`` when it does
    not know, e.g. during an election); retry there.
    """

    def __init__(
        self, node_id: NodeId, term: int, leader_hint: NodeId | None, why: str = ""
    ) -> None:
        self.node_id = node_id
        self.term = term
        self.leader_hint = leader_hint
        hint = f"leader hint: {leader_hint}" if leader_hint is not None else "leader unknown"
        reason = f" ({why})" if why else ""
        super().__init__(f"node {node_id} is not the leader at term {term}{reason}; {hint}")


class RaftSafetyError(RaftError):
    """Raft's guarantees were broken: a bug, or persistent state that was lost or altered."""
