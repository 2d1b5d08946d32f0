"""The names every part agrees on: the Ray namespace and the documented actor names."""

from __future__ import annotations

DEFAULT_NAMESPACE = "raymq"
DEFAULT_CLUSTER = "DefaultCluster"
TXN_COORDINATOR_NAME = "txn-coordinator"
"""The documented Ray actor name of the transaction coordinator (``actors.coordinator.txn``)."""
MASTER_ID = 0
"""A broker group's master has broker id 0; slaves have ids >= 1."""


def nameserver_actor_name(index: int) -> str:
    """The documented Ray actor name of the ``index``-th NameServer."""
    return f"nameserver-{index}"


def broker_actor_name(broker_name: str, broker_id: int) -> str:
    """The documented Ray actor name of a broker: ``broker-a`` id 0 is ``broker-a-0``."""
    return f"{broker_name}-{broker_id}"


def coordinator_actor_name(group: str) -> str:
    """The documented Ray actor name of a consumer group's coordinator: ``coordinator-<group>``."""
    return f"coordinator-{group}"


def fleet_actor_name(group: str) -> str:
    """The documented Ray actor name of a consumer fleet's controller: ``fleet-<group>``
    (its members: ``fleet-<group>-m<n>``)."""
    return f"fleet-{group}"
