"""RayMQ on Ray: NameServer and Broker actors, the Producer and PullConsumer clients,
admin operations, and starting or attaching to a cluster.

Actors are detached and named in a Ray namespace (default ``raymq``):
``nameserver-<i>``, ``<broker name>-<broker id>`` (``broker-a-0``) and
``coordinators-0`` (the coordinator host, which runs every consumer group's
:class:`GroupCoordinator`: :func:`coordinator_actor_name`); a
:class:`ConsumerFleet`'s control loop is ``fleet-<group>``, its members
``fleet-<group>-m<n>``.
"""

import importlib as _importlib
import typing as _typing

from actors import _compat

if _typing.TYPE_CHECKING:
    from actors.aio import (
        AsyncAdmin,
        AsyncConsumer,
        AsyncHalf,
        AsyncLiteConsumer,
        AsyncLiteProducer,
        AsyncProducer,
        AsyncSimpleConsumer,
        AsyncTransaction,
        AsyncTransactionalProducer,
    )
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
    from actors.coordinator.coordinator import GroupCoordinator
    from actors.coordinator.host import coordinator_for
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

# A name is imported from its room when first used (PEP 562): a Ray worker that hosts a
# NameServer imports the NameServer's modules, not the console's web server, the
# broker's store or the clients. Each actor's process starts that much sooner.
_EXPORTS: dict[str, str] = {
    "AsyncAdmin": "actors.aio",
    "AsyncConsumer": "actors.aio",
    "AsyncHalf": "actors.aio",
    "AsyncLiteConsumer": "actors.aio",
    "AsyncLiteProducer": "actors.aio",
    "AsyncProducer": "actors.aio",
    "AsyncSimpleConsumer": "actors.aio",
    "AsyncTransaction": "actors.aio",
    "AsyncTransactionalProducer": "actors.aio",
    "Broker": "actors.broker.broker",
    "Admin": "actors.client",
    "BatchSendResult": "actors.client",
    "ConsumeFromWhere": "actors.client",
    "ConsumeStatus": "actors.client",
    "LocalTransactionState": "actors.client",
    "MessageModel": "actors.client",
    "Producer": "actors.client",
    "ProducerBusyError": "actors.client",
    "PullConsumer": "actors.client",
    "PullResult": "actors.client",
    "PullStatus": "actors.client",
    "PushConsumer": "actors.client",
    "PushConsumerConfig": "actors.client",
    "SendResult": "actors.client",
    "SendStatus": "actors.client",
    "SimpleConsumer": "actors.client",
    "Transaction": "actors.client",
    "TransactionalProducer": "actors.client",
    "TransactionProducer": "actors.client",
    "TransactionSendResult": "actors.client",
    "TransactionState": "actors.client",
    "Cluster": "actors.cluster",
    "connect": "actors.cluster",
    "start_cluster": "actors.cluster",
    "BrokerConfig": "actors.config",
    "BrokerSpec": "actors.config",
    "ClusterConfig": "actors.config",
    "ConsumerConfig": "actors.config",
    "CoordinatorConfig": "actors.config",
    "NameServerConfig": "actors.config",
    "ProducerConfig": "actors.config",
    "GroupCoordinator": "actors.coordinator.coordinator",
    "coordinator_for": "actors.coordinator.host",
    "TransactionCoordinator": "actors.coordinator.txn",
    "TransactionStateError": "actors.coordinator.txn",
    "transaction_coordinator": "actors.coordinator.txn",
    "ConsumerFleet": "actors.fleet.fleet",
    "FleetConfig": "actors.fleet.fleet",
    "fleet_actor_name": "actors.fleet.fleet",
    "NameServer": "actors.namesrv",
    "discover_nameservers": "actors.namesrv",
    "DEFAULT_NAMESPACE": "actors.protocol",
    "PERM_READ": "actors.protocol",
    "PERM_WRITE": "actors.protocol",
    "BrokerData": "actors.protocol",
    "OffsetFencedError": "actors.protocol",
    "PromotionRefusedError": "actors.protocol",
    "QueueData": "actors.protocol",
    "TopicConfig": "actors.protocol",
    "TopicRouteData": "actors.protocol",
    "broker_actor_name": "actors.protocol",
    "coordinator_actor_name": "actors.protocol",
    "nameserver_actor_name": "actors.protocol",
}


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'actors' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


_compat.install()  # the 0.1 flat paths (actors.client.producer, ...) for one more release

__all__ = [
    "DEFAULT_NAMESPACE",
    "PERM_READ",
    "PERM_WRITE",
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncHalf",
    "AsyncLiteConsumer",
    "AsyncLiteProducer",
    "AsyncProducer",
    "AsyncSimpleConsumer",
    "AsyncTransaction",
    "AsyncTransactionalProducer",
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
