"""The NameServer's route table (RocketMQ's ``RouteInfoManager``).

Pure Python, no Ray: the NameServer actor wraps it.

Invariants of :class:`RouteInfoManager`:

* a broker appears in a topic's route only while it is live: registered, not
  unregistered, not reported dead, and heard from within ``broker_expired_s``;
* a broker group's queue data for a topic is exactly what the latest
  registration of its lowest live id said (the master, id 0, when it is live;
  else a slave, so consumers can still read a group whose master is gone);
* a route holds only queue data of groups with a live member, and broker data
  only for those groups, so a client never picks a dead broker from it
  (producers write only to groups whose master, id 0, is in the route);
* id 0 is fenced by ``master_epoch`` (a promotion or a Raft term): a
  registration as master with an epoch below the group's highest is refused,
  so a deposed master can never be routed to again;
* ``version`` grows with every change a client's cached route could miss.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from actors.protocol.route import BrokerData, BrokerRegistration, QueueData, TopicRouteData
from actors.protocol.topic import TopicConfig

log = logging.getLogger("raymq.actors.protocol.route")


@dataclass
class _LiveBroker:
    registration: BrokerRegistration
    last_update: float


class RouteInfoManager:
    """Topics → queue data per broker, brokers → addresses, with liveness."""

    def __init__(self) -> None:
        self._topic_queues: dict[str, dict[str, QueueData]] = {}
        self._live: dict[tuple[str, int], _LiveBroker] = {}  # (broker_name, broker_id)
        self._epochs: dict[str, int] = {}  # broker name -> highest master epoch seen
        self.version = 0

    # ------------------------------------------------------------ registration
    def master_of(self, broker_name: str) -> tuple[str | None, int]:
        """The group's live master actor name (or None) and the highest master epoch seen."""
        live = self._live.get((broker_name, 0))
        name = live.registration.actor_name if live is not None else None
        return name, self._epochs.get(broker_name, 0)

    def accepts(self, reg: BrokerRegistration) -> bool:
        """Whether a registration may take its id: a master needs an epoch no lower than
        the group's highest, and above a live master's unless it is the same actor."""
        if reg.broker_id != 0:
            return True
        if reg.master_epoch < self._epochs.get(reg.broker_name, 0):
            return False
        live = self._live.get((reg.broker_name, 0))
        return (
            live is None
            or live.registration.actor_name == reg.actor_name
            or reg.master_epoch > live.registration.master_epoch
        )

    def register(self, reg: BrokerRegistration, now: float) -> bool:
        """Add or refresh a broker; return True when it (or its incarnation) is new.
        The caller checks :meth:`accepts` first."""
        key = (reg.broker_name, reg.broker_id)
        old = self._live.get(key)
        self._live[key] = _LiveBroker(reg, now)
        if reg.broker_id == 0:
            self._epochs[reg.broker_name] = max(
                reg.master_epoch, self._epochs.get(reg.broker_name, 0)
            )
        is_new = old is None or old.registration.incarnation != reg.incarnation
        moved = old is not None and (
            old.registration.data_addr != reg.data_addr
            or old.registration.grpc_addr != reg.grpc_addr
        )
        changed = self._refresh_topics(reg.broker_name) or moved
        if is_new or changed:
            self.version += 1
        if is_new:
            log.info(
                "broker %s id %d registered (%s, node %s, %d topics)",
                reg.broker_name,
                reg.broker_id,
                reg.broker_addr,
                reg.node_id[:12],
                len(reg.topic_configs),
            )
        return is_new

    def _refresh_topics(self, broker_name: str) -> bool:
        """Take the group's queue data from its lowest live id; True if it changed."""
        ids = [bid for name, bid in self._live if name == broker_name]
        configs = self._live[(broker_name, min(ids))].registration.topic_configs if ids else {}
        return self._replace_topics(broker_name, configs)

    def _replace_topics(self, broker_name: str, configs: Mapping[str, TopicConfig]) -> bool:
        changed = False
        for topic in list(self._topic_queues):
            if topic not in configs and broker_name in self._topic_queues[topic]:
                self._drop_queue_data(topic, broker_name)
                changed = True
        for topic, tc in configs.items():
            qd = QueueData(broker_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm)
            queues = self._topic_queues.setdefault(topic, {})
            if queues.get(broker_name) != qd:
                queues[broker_name] = qd
                changed = True
        return changed

    def _drop_queue_data(self, topic: str, broker_name: str) -> None:
        queues = self._topic_queues.get(topic)
        if queues is not None:
            queues.pop(broker_name, None)
            if not queues:
                del self._topic_queues[topic]

    def unregister(
        self,
        broker_name: str,
        broker_id: int,
        incarnation: str | None = None,
        reason: str = "unregistered",
    ) -> bool:
        """Remove a broker (only the given incarnation when one is named)."""
        key = (broker_name, broker_id)
        live = self._live.get(key)
        if live is None or (
            incarnation is not None and live.registration.incarnation != incarnation
        ):
            return False
        del self._live[key]
        self._refresh_topics(broker_name)
        self.version += 1
        log.warning("broker %s id %d removed from routes: %s", broker_name, broker_id, reason)
        return True

    def scan_expired(self, now: float, expired_s: float) -> list[tuple[str, int]]:
        """Drop brokers silent for longer than ``expired_s``; return them."""
        gone = [key for key, live in self._live.items() if now - live.last_update > expired_s]
        for name, bid in gone:
            self.unregister(name, bid, reason=f"no heartbeat for over {expired_s:g}s")
        return gone

    # ------------------------------------------------------------ queries
    def route(self, topic: str) -> TopicRouteData | None:
        queues = self._topic_queues.get(topic)
        if not queues:
            return None
        qds = tuple(sorted(queues.values(), key=lambda q: q.broker_name))
        bds = tuple(bd for bd in (self._broker_data(q.broker_name) for q in qds) if bd is not None)
        return TopicRouteData(topic, qds, bds)

    def _broker_data(self, broker_name: str) -> BrokerData | None:
        members = sorted(
            (bid, live.registration)
            for (name, bid), live in self._live.items()
            if name == broker_name
        )
        if not members:
            return None
        first = members[0][1]
        return BrokerData(
            cluster=first.cluster,
            broker_name=broker_name,
            broker_addrs={bid: r.broker_addr for bid, r in members},
            actor_names={bid: r.actor_name for bid, r in members},
            namespace=first.namespace,
            node_ids={bid: r.node_id for bid, r in members},
            data_addrs={bid: r.data_addr for bid, r in members if r.data_addr},
            grpc_addrs={bid: r.grpc_addr for bid, r in members if r.grpc_addr},
        )

    def topics(self) -> list[str]:
        return sorted(self._topic_queues)

    def brokers(self) -> list[BrokerRegistration]:
        return [live.registration for _, live in sorted(self._live.items())]

    def is_live(self, broker_name: str, broker_id: int, incarnation: str | None = None) -> bool:
        live = self._live.get((broker_name, broker_id))
        return live is not None and (
            incarnation is None or live.registration.incarnation == incarnation
        )

    def cluster_info(self, now: float) -> dict[str, Any]:
        """Clusters → broker names, and per broker its addresses, nodes and heartbeat age."""
        clusters: dict[str, set[str]] = {}
        brokers: dict[str, dict[str, Any]] = {}
        for (name, bid), live in sorted(self._live.items()):
            reg = live.registration
            clusters.setdefault(reg.cluster, set()).add(name)
            entry = brokers.setdefault(name, {"cluster": reg.cluster, "members": {}})
            entry["members"][bid] = {
                "addr": reg.broker_addr,
                "actor_name": reg.actor_name,
                "namespace": reg.namespace,
                "node_id": reg.node_id,
                "heartbeat_age_s": round(now - live.last_update, 3),
                "topics": len(reg.topic_configs),
            }
        return {"clusters": {c: sorted(n) for c, n in clusters.items()}, "brokers": brokers}
