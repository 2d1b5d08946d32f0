"""RayMQ on Ray: NameServer and Broker actors, the Producer and PullConsumer clients,
admin operations, and starting or attaching to a cluster.

Actors are detached and named in a Ray namespace (default ``raymq``):
``nameserver-<i>``, ``<broker name>-<broker id>`` (``broker-a-0``) and
``coordinator-<group>`` (a consumer group's :class:`GroupCoordinator`); a
:class:`ConsumerFleet`'s control loop is ``fleet-<group>``, its members
``fleet-<group>-m<n>``.
"""

from ._backpressure import ProducerBusyError
from ._fencing import OffsetFencedError
from ._replication import PromotionRefusedError
from .admin import Admin
from .broker import Broker
from .cluster import Cluster, connect, discover_nameservers, start_cluster
from .config import (
    DEFAULT_NAMESPACE,
    BrokerConfig,
    BrokerSpec,
    ClusterConfig,
    ConsumerConfig,
    CoordinatorConfig,
    NameServerConfig,
    ProducerConfig,
    broker_actor_name,
    coordinator_actor_name,
    nameserver_actor_name,
)
from .consumer import PullConsumer, PullResult, PullStatus
from .coordinator import GroupCoordinator, coordinator_for
from .fleet import ConsumerFleet, FleetConfig, fleet_actor_name
from .nameserver import NameServer
from .producer import Producer
from .push_consumer import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageModel,
    PushConsumer,
    PushConsumerConfig,
)
from .route import BrokerData, QueueData, TopicRouteData
from .send_result import BatchSendResult, SendResult, SendStatus
from .topic import PERM_READ, PERM_WRITE, TopicConfig

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
    "TopicConfig",
    "TopicRouteData",
    "broker_actor_name",
    "connect",
    "coordinator_actor_name",
    "coordinator_for",
    "discover_nameservers",
    "fleet_actor_name",
    "nameserver_actor_name",
    "start_cluster",
]
