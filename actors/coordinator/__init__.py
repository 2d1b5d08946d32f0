"""Consumer-group coordination: the ``coordinator-<group>`` actor, the group's one view
of members and queue owners, running the group's rebalance strategy."""

from __future__ import annotations

from actors.coordinator.coordinator import GroupCoordinator, coordinator_for

__all__ = ["GroupCoordinator", "coordinator_for"]
