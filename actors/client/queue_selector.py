"""Which queue a send goes to (RocketMQ's ``TopicPublishInfo`` and ``MQFaultStrategy``).

A topic's route comes from the NameServers (cached by the client instance's NameServer client,
refreshed on demand). Its write queues are those of brokers with a live master
whose perm allows writing; a route with none raises ``PermissionDeniedError``
(brokers live, none writeable) or ``BrokerUnavailableError`` (no live broker).

A topic no broker holds yet, in a cluster with the ``AUTO_CREATE_TOPIC_KEY``
template route, gets a synthetic route: ``default_topic_queue_nums`` queues (at
most the template's) on every template broker. A send on it carries that queue
count (``auto_n``) so the broker creates the topic as it stores; once such a
call is made the synthetic route is dropped (:meth:`QueueSelector.created`) and
the next send asks for the real one.

Selection: with a ``sharding_key`` the same key always maps to the same queue
(while the topic's queues stay the same). Otherwise queues are taken round
robin per topic, skipping ``avoid`` (the broker a retry just failed on) and
brokers the latency fault tolerance holds unavailable; when every broker is
unavailable the one that becomes available first is taken.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import NamedTuple, Protocol

from actors.client.fault import LatencyFaultTolerance
from actors.config.client import ProducerConfig
from actors.protocol.route import QueueData, TopicRouteData
from actors.protocol.topic import AUTO_CREATE_TOPIC_KEY, PERM_READ, PERM_WRITE, is_writeable
from rebalance import MessageQueue
from storage import codec
from storage.errors import BrokerUnavailableError, PermissionDeniedError


class RouteSource(Protocol):
    """Where routes come from: the producer's :class:`~actors.client.instance.ClientView`."""

    def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData | None: ...

    def require_route(self, topic: str, *, refresh: bool = False) -> TopicRouteData: ...

    def invalidate(self, topic: str) -> None: ...


class Selection(NamedTuple):
    """Where one send goes: the queue, the route it was picked from, and the queue count
    the broker creates the topic with (0 unless the route is synthetic)."""

    mq: MessageQueue
    route: TopicRouteData
    auto_n: int


class QueueSelector:
    """Routes, write queues and the choice of a queue for each send; see the module doc."""

    def __init__(
        self, ns: RouteSource, fault: LatencyFaultTolerance, config: ProducerConfig
    ) -> None:
        self.ns = ns
        self.fault = fault
        self.config = config
        self._counters: dict[str, Iterator[int]] = {}
        self._queue_cache: dict[int, tuple[TopicRouteData, list[MessageQueue]]] = {}
        self._master_cache: dict[int, tuple[TopicRouteData, dict[str, str | None]]] = {}
        self._selected_from: dict[str, TopicRouteData] = {}  # each topic's last route used
        self._synthetic: dict[str, tuple[TopicRouteData, int]] = {}

    def route(self, topic: str, refresh: bool = False) -> tuple[TopicRouteData, int]:
        """The topic's route and, for a topic the brokers will auto-create, its queue count."""
        route = self.ns.route(topic, refresh=refresh)
        if route is not None and route.queue_datas:
            self._synthetic.pop(topic, None)
            return route, 0
        synthetic = self._synthetic.get(topic)
        if synthetic is not None and not refresh:
            return synthetic
        template = self.ns.route(AUTO_CREATE_TOPIC_KEY, refresh=refresh)
        if template is None or not template.queue_datas:
            # the topic's own route again: it raises TopicNotFoundError, or a broker
            # took the topic up while the template was asked for
            self._synthetic.pop(topic, None)
            return self.ns.require_route(topic, refresh=True), 0
        n = self.config.default_topic_queue_nums
        qds = tuple(
            QueueData(
                q.broker_name,
                min(n, q.write_queue_nums),
                min(n, q.write_queue_nums),
                PERM_READ | PERM_WRITE,
            )
            for q in template.queue_datas
        )
        synthetic = (TopicRouteData(topic, qds, template.broker_datas), n)
        self._synthetic[topic] = synthetic
        return synthetic

    def write_queues(self, route: TopicRouteData) -> list[MessageQueue]:
        """The route's queues a send may go to (see the module doc); cached per route."""
        cached = self._queue_cache.get(id(route))
        if cached is not None and cached[0] is route:
            return cached[1]
        live = {bd.broker_name for bd in route.broker_datas if bd.master_actor_name()}
        queues = [
            MessageQueue(route.topic, qd.broker_name, q)
            for qd in route.queue_datas
            if is_writeable(qd.perm) and qd.broker_name in live
            for q in range(qd.write_queue_nums)
        ]
        if not queues:
            if any(qd.broker_name in live for qd in route.queue_datas):
                raise PermissionDeniedError(
                    f"topic={route.topic!r}: no broker allows writing (perm forbids write)"
                )
            raise BrokerUnavailableError(f"topic={route.topic!r}: no live broker holds it")
        if len(self._queue_cache) > 1024:
            self._queue_cache.clear()
        self._queue_cache[id(route)] = (route, queues)
        return queues

    def master_in(self, route: TopicRouteData, broker_name: str) -> str | None:
        """``broker_name``'s master as ``route`` names it (``BrokerData.master_key``)."""
        cached = self._master_cache.get(id(route))
        if cached is None or cached[0] is not route:
            if len(self._master_cache) > 1024:
                self._master_cache.clear()
            keys = {bd.broker_name: bd.master_key() for bd in route.broker_datas}
            cached = self._master_cache[id(route)] = (route, keys)
        return cached[1].get(broker_name)

    def master_of(self, topic: str, broker_name: str) -> str | None:
        """``broker_name``'s master as the route the last send to ``topic`` was chosen
        from names it (the master a send just made went to); no call is made."""
        route = self._selected_from.get(topic)
        return None if route is None else self.master_in(route, broker_name)

    def select(
        self, topic: str, avoid: str | None, sharding_key: str | None, refresh: bool = False
    ) -> Selection:
        """The queue for the next send to ``topic``, not on broker ``avoid`` if another
        will do; ``refresh`` re-reads the route first (a retry)."""
        route, auto_n = self.route(topic, refresh)
        queues = self.write_queues(route)
        self._selected_from[topic] = route
        if sharding_key is not None:
            return Selection(
                queues[codec.index_key_hash(codec.java_hash(sharding_key)) % len(queues)],
                route,
                auto_n,
            )
        counter = self._counters.get(topic)
        if counter is None:
            counter = self._counters.setdefault(topic, itertools.count())
        start = next(counter)
        n = len(queues)
        if self.config.send_latency_fault_enable:
            for i in range(n):
                mq = queues[(start + i) % n]
                if mq.broker_name != avoid and self.fault.is_available(
                    mq.broker_name, self.master_in(route, mq.broker_name)
                ):
                    return Selection(mq, route, auto_n)
            others = sorted({q.broker_name for q in queues if q.broker_name != avoid})
            best = self.fault.least_bad(others or ([avoid] if avoid else []))
            for i in range(n):
                mq = queues[(start + i) % n]
                if mq.broker_name == best:
                    return Selection(mq, route, auto_n)
        for i in range(n):
            mq = queues[(start + i) % n]
            if mq.broker_name != avoid:
                return Selection(mq, route, auto_n)
        return Selection(queues[start % n], route, auto_n)

    def created(self, topic: str) -> None:
        """A send that auto-creates ``topic`` went out: next time ask for the real route."""
        self._synthetic.pop(topic, None)
        self.ns.invalidate(topic)

    def invalidate(self, topic: str) -> None:
        """A send to ``topic`` failed on the way: re-read its route next time."""
        self.ns.invalidate(topic)
