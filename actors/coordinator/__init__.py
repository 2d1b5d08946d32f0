"""Consumer-group coordination: a group's coordinator, the group's one view of members
and queue owners, running the group's rebalance strategy, in the namespace's coordinator
host (the ``coordinators-0`` actor, which runs the coordinators of many groups)."""

from __future__ import annotations

from actors.coordinator.coordinator import GroupCoordinator
from actors.coordinator.host import CoordinatorHandle, CoordinatorHost, coordinator_for

__all__ = ["CoordinatorHandle", "CoordinatorHost", "GroupCoordinator", "coordinator_for"]
