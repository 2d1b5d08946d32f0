"""What client and broker say to each other: the one vocabulary both sides import.

Topic configs and perms, route data, the wire forms of sends and pulls, fencing
tokens, the names of actors, and how a call to an actor is made and fails. Plain
values and functions, no actors: ``client`` and ``broker`` never import each other,
they both import this."""

from __future__ import annotations

from actors.protocol.errors import PromotionRefusedError
from actors.protocol.fencing import FencingToken, OffsetFencedError
from actors.protocol.names import (
    DEFAULT_NAMESPACE,
    broker_actor_name,
    coordinator_actor_name,
    nameserver_actor_name,
)
from actors.protocol.route import BrokerData, BrokerRegistration, QueueData, TopicRouteData
from actors.protocol.topic import PERM_READ, PERM_WRITE, SYSTEM_TOPICS, TopicConfig
from actors.protocol.wire import (
    OUT_OF_BAND_BYTES,
    AckWire,
    PullAnswer,
    PullWire,
    SendAck,
    pull_from_wire,
    pull_request_from_wire,
    pull_request_to_wire,
    pull_to_wire,
    pulls_from_wire,
    pulls_to_wire,
)

__all__ = [
    "AckWire",
    "BrokerData",
    "BrokerRegistration",
    "DEFAULT_NAMESPACE",
    "FencingToken",
    "OUT_OF_BAND_BYTES",
    "OffsetFencedError",
    "PERM_READ",
    "PERM_WRITE",
    "PromotionRefusedError",
    "PullAnswer",
    "PullWire",
    "QueueData",
    "SYSTEM_TOPICS",
    "SendAck",
    "TopicConfig",
    "TopicRouteData",
    "broker_actor_name",
    "coordinator_actor_name",
    "nameserver_actor_name",
    "pull_from_wire",
    "pull_request_from_wire",
    "pull_request_to_wire",
    "pull_to_wire",
    "pulls_from_wire",
    "pulls_to_wire",
]
