"""A broker's place in its group: master/slave replication (RocketMQ 4's HA) or a
DLedger Raft group. The Broker actor owns one :class:`Replication`, made here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.broker.ha.dledger import DLedgerReplication
from actors.broker.ha.master_slave import MasterSlaveReplication
from actors.broker.ha.replication import Replication

if TYPE_CHECKING:
    from actors.broker.runtime import BrokerRuntime

__all__ = ["DLedgerReplication", "MasterSlaveReplication", "Replication", "create_replication"]


def create_replication(broker: BrokerRuntime) -> Replication:
    """The broker's role object, by its configuration."""
    if broker.config.enable_dledger:
        return DLedgerReplication(broker)
    return MasterSlaveReplication(broker)
