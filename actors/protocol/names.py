"""The names every part agrees on: the Ray namespace and the documented actor names."""

from __future__ import annotations

import zlib

DEFAULT_NAMESPACE = "raymq"
DEFAULT_CLUSTER = "DefaultCluster"
TXN_COORDINATOR_NAME = "txn-coordinator"
"""The documented Ray actor name of the transaction coordinator (``actors.coordinator.txn``)."""
COORDINATOR_HOSTS = 1
"""How many coordinator hosts the consumer groups of a namespace are spread over (each
group's host: :func:`coordinator_actor_name`)."""
COORDINATOR_HOST_PREFIX = "coordinators-"
MASTER_ID = 0
"""A broker group's master has broker id 0; slaves have ids >= 1."""


def nameserver_actor_name(index: int) -> str:
    """The documented Ray actor name of the ``index``-th NameServer."""
    return f"nameserver-{index}"


def broker_actor_name(broker_name: str, broker_id: int) -> str:
    """The documented Ray actor name of a broker: ``broker-a`` id 0 is ``broker-a-0``."""
    return f"{broker_name}-{broker_id}"


def coordinator_actor_name(group: str) -> str:
    """The documented Ray actor name of the actor that coordinates consumer group
    ``group``: the coordinator host ``coordinators-<i>`` (``actors.coordinator.host``), with
    ``i`` the CRC-32 of the group's name modulo :data:`COORDINATOR_HOSTS`, the same in every
    process. With one host per namespace, every group's is ``coordinators-0``."""
    return f"{COORDINATOR_HOST_PREFIX}{zlib.crc32(group.encode()) % COORDINATOR_HOSTS}"


def coordinator_host_names() -> list[str]:
    """The Ray actor names of every coordinator host a namespace may run."""
    return [f"{COORDINATOR_HOST_PREFIX}{i}" for i in range(COORDINATOR_HOSTS)]


def fleet_actor_name(group: str) -> str:
    """The documented Ray actor name of a consumer fleet's controller: ``fleet-<group>``
    (its members: ``fleet-<group>-m<n>``)."""
    return f"fleet-{group}"
