"""RayMQ on Ray: NameServer and Broker actors, the Producer and PullConsumer clients,
admin operations, and starting or attaching to a cluster.

Actors are detached and named in a Ray namespace (default ``raymq``):
``nameserver-<i>``, ``<broker name>-<broker id>`` (``broker-a-0``) and
``coordinator-<group>`` (a consumer group's :class:`GroupCoordinator`); a
:class:`ConsumerFleet`'s control loop is ``fleet-<group>``, its members
``fleet-<group>-m<n>``.
"""

from actors import _compat
from actors.broker.broker import Broker
from actors.client import (
    Admin,
    BatchSendResult,
    ConsumeFromWhere,
    ConsumeStatus,
    LocalTransactionState,
    MessageModel,
    Producer,
    ProducerBusyError,
    PullConsumer,
    PullResult,
    PullStatus,
    PushConsumer,
    PushConsumerConfig,
    SendResult,
    SendStatus,
    SimpleConsumer,
    Transaction,
    TransactionalProducer,
    TransactionProducer,
    TransactionSendResult,
    TransactionState,
)
from actors.cluster import Cluster, connect, start_cluster
from actors.config import (
    BrokerConfig,
    BrokerSpec,
    ClusterConfig,
    ConsumerConfig,
    CoordinatorConfig,
    NameServerConfig,
    ProducerConfig,
)
from actors.coordinator.coordinator import GroupCoordinator, coordinator_for
from actors.coordinator.txn import (
    TransactionCoordinator,
    TransactionStateError,
    transaction_coordinator,
)
from actors.fleet.fleet import ConsumerFleet, FleetConfig, fleet_actor_name
from actors.namesrv import NameServer, discover_nameservers
from actors.protocol import (
    DEFAULT_NAMESPACE,
    PERM_READ,
    PERM_WRITE,
    BrokerData,
    OffsetFencedError,
    PromotionRefusedError,
    QueueData,
    TopicConfig,
    TopicRouteData,
    broker_actor_name,
    coordinator_actor_name,
    nameserver_actor_name,
)

_compat.install()  # the 0.1 flat paths (actors.client.producer, ...) for one more release

__all__ = [
    "DEFAULT_NAMESPACE",
    "PERM_READ",
    "PERM_WRITE",
    "Admin",
    "BatchSendResult",
    "Broker",
    "BrokerConfig",
    "BrokerData",
    "BrokerSpec",
    "Cluster",
    "ClusterConfig",
    "ConsumeFromWhere",
    "ConsumeStatus",
    "ConsumerConfig",
    "ConsumerFleet",
    "CoordinatorConfig",
    "FleetConfig",
    "GroupCoordinator",
    "LocalTransactionState",
    "MessageModel",
    "NameServer",
    "NameServerConfig",
    "OffsetFencedError",
    "Producer",
    "ProducerBusyError",
    "ProducerConfig",
    "PromotionRefusedError",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "PushConsumerConfig",
    "QueueData",
    "SendResult",
    "SendStatus",
    "SimpleConsumer",
    "TopicConfig",
    "TopicRouteData",
    "Transaction",
    "TransactionCoordinator",
    "TransactionProducer",
    "TransactionSendResult",
    "TransactionState",
    "TransactionStateError",
    "TransactionalProducer",
    "broker_actor_name",
    "connect",
    "coordinator_actor_name",
    "coordinator_for",
    "discover_nameservers",
    "fleet_actor_name",
    "nameserver_actor_name",
    "start_cluster",
    "transaction_coordinator",
]
