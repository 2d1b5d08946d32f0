"""The Broker actor and the parts it wires (RocketMQ's ``BrokerController``), grouped by
kind as RocketMQ's broker is:

* ``processor/``: one processor per kind of request (send, pull, POP, consumer
  management, admin);
* ``transaction/``: half messages, their end and check-back, one-phase commits;
* ``longpolling/``: pulls held until a message arrives;
* ``offset/``: committed offsets, offset fences, stream checkpoints;
* ``topic/``: the broker's topic configs;
* ``client/``: consumer group members and idempotent producers' ids;
* ``out/``: registration with the NameServers;
* ``ha/``: the broker's place in its group (master/slave or DLedger);
* ``grpc/``: RocketMQ 5's gRPC protocol.

The actor itself (``broker``), what its parts share (``runtime``), its socket
(``listener``), its cluster lease, metrics, memory policy and injected faults sit here.
"""

from __future__ import annotations

from actors.broker.broker import Broker
from actors.broker.runtime import default_store_dir

__all__ = ["Broker", "default_store_dir"]
