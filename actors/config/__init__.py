"""Configuration of the cluster's parts: one frozen dataclass per component, RocketMQ's
defaults, each in the file of the room that reads it."""

from actors.config.broker import BROKER_ROLES, BrokerConfig
from actors.config.client import ConsumerConfig, ProducerConfig
from actors.config.cluster import BrokerSpec, ClusterConfig
from actors.config.console import ConsoleConfig
from actors.config.coordinator import CoordinatorConfig
from actors.config.namesrv import NameServerConfig
from actors.config.options import with_options
from actors.protocol.names import (
    DEFAULT_CLUSTER,
    DEFAULT_NAMESPACE,
    MASTER_ID,
    broker_actor_name,
    coordinator_actor_name,
    nameserver_actor_name,
)

__all__ = [
    "BROKER_ROLES",
    "DEFAULT_CLUSTER",
    "DEFAULT_NAMESPACE",
    "MASTER_ID",
    "BrokerConfig",
    "BrokerSpec",
    "ClusterConfig",
    "ConsoleConfig",
    "ConsumerConfig",
    "CoordinatorConfig",
    "NameServerConfig",
    "ProducerConfig",
    "broker_actor_name",
    "coordinator_actor_name",
    "nameserver_actor_name",
    "with_options",
]
