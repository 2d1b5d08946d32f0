"""Route data: what a NameServer answers about a topic and what a broker registers.

Plain values, no Ray; the NameServer's table of them is ``actors.namesrv.route_info``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from actors.protocol.topic import TopicConfig, is_readable
from storage.errors import TopicNotFoundError


@dataclass(frozen=True)
class QueueData:
    """A topic's queues on one broker group."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@dataclass(frozen=True)
class BrokerData:
    """One broker group: addresses and Ray actor names by broker id (0 = master)."""

    cluster: str
    broker_name: str
    broker_addrs: Mapping[int, str]
    actor_names: Mapping[int, str]
    namespace: str
    node_ids: Mapping[int, str] = field(default_factory=dict)
    data_addrs: Mapping[int, str] = field(default_factory=dict)
    """Each member's data-path address (``ip:port`` of its own socket), as RocketMQ's
    ``brokerAddrs``; a member without one is reached through Ray only."""
    grpc_addrs: Mapping[int, str] = field(default_factory=dict)
    """Each member's RocketMQ 5 gRPC endpoint (``ip:port``), when it serves one."""

    def master_actor_name(self) -> str | None:
        return self.actor_names.get(0)

    def master_addr(self) -> str | None:
        return self.broker_addrs.get(0)

    def master_key(self) -> str | None:
        """Which master this is: its actor and its data-path address, both of which
        change when a slave is promoted or the broker restarts."""
        actor = self.actor_names.get(0)
        return None if actor is None else f"{actor}@{self.data_addrs.get(0, '')}"


@dataclass(frozen=True)
class TopicRouteData:
    topic: str
    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]

    def readable_brokers(self) -> list[str]:
        """The broker groups that let this topic be read (perm and read queues), by name;
        ``TopicNotFoundError`` when none does."""
        names = sorted(
            {
                qd.broker_name
                for qd in self.queue_datas
                if is_readable(qd.perm) and qd.read_queue_nums
            }
        )
        if not names:
            raise TopicNotFoundError(f"topic={self.topic!r}: no broker lets it be read")
        return names

    def broker(self, broker_name: str) -> BrokerData | None:
        for bd in self.broker_datas:
            if bd.broker_name == broker_name:
                return bd
        return None


@dataclass(frozen=True)
class BrokerRegistration:
    """What a broker tells every NameServer on start and on each heartbeat.

    ``incarnation`` changes each time the broker actor starts (or Ray restarts
    it), so a death notice about an old incarnation never removes a new one.
    """

    cluster: str
    broker_name: str
    broker_id: int
    broker_addr: str
    actor_name: str
    namespace: str
    node_id: str
    incarnation: str
    topic_configs: Mapping[str, TopicConfig]
    handle: Any = None  # the broker's ActorHandle, for Ray death notices
    master_epoch: int = 0  # with broker_id 0: the promotion epoch or Raft term it masters in
    data_addr: str = ""  # its data path's ip:port ("" while it has none)
    grpc_addr: str = ""  # its RocketMQ 5 gRPC endpoint's ip:port ("" without one)
