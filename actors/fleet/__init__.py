"""Elastic consumer fleets: a consumer group as Ray actors hosting PushConsumers, with a
control loop (``fleet-<group>``) that scales them by lag."""

from __future__ import annotations

from actors.fleet.fleet import ConsumerFleet, FleetConfig, fleet_actor_name

__all__ = ["ConsumerFleet", "FleetConfig", "fleet_actor_name"]
