"""The Broker actor and the named parts it wires (RocketMQ's ``BrokerController``):
topic config, consumer offsets and fences, held pulls, send-back, metrics; ``ha/``
holds its place in a broker group (master/slave or DLedger)."""

from __future__ import annotations

from actors.broker.broker import Broker
from actors.broker.runtime import default_store_dir

__all__ = ["Broker", "default_store_dir"]
