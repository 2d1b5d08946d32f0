"""Broker handles by actor name, found through the NameServers' routes.

A :class:`BrokerHandles` turns a route's broker name into the handle a client calls
(the master, or a member to read from), caching each by actor name, and forgets them
all when the NameServer client sees the brokers change (a broker started anew under
its name is another actor). ``wrap`` turns a Ray handle into what the client calls
(its connection over the broker's own socket, ``actors.protocol.data_path``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import ray

from actors.protocol.route import TopicRouteData
from storage.errors import BrokerUnavailableError

BrokerWrap = Callable[[str, Any], Any]
"""Turns a broker's Ray handle into what a client calls it through (its actor name,
the handle)."""


class Routes(Protocol):
    """Where the handles' routes come from (a :class:`~actors.namesrv.client.NameServerClient`)."""

    @property
    def namespace(self) -> str: ...

    def call(self, method: str, *args: Any) -> Any: ...

    def cached_route(self, topic: str) -> TopicRouteData | None: ...

    def on_brokers_changed(self, callback: Callable[[], Any]) -> None: ...


class BrokerHandles:
    def __init__(self, ns: Routes, wrap: BrokerWrap | None = None) -> None:
        self.ns = ns
        self._wrap = wrap
        self._handles: dict[str, Any] = {}
        self._lock = threading.Lock()
        ns.on_brokers_changed(self._handles.clear)

    def broker(self, route: TopicRouteData, broker_name: str) -> Any:
        """The master broker actor of ``broker_name`` (cached by actor name)."""
        bd = route.broker(broker_name)
        name = bd.master_actor_name() if bd is not None else None
        if bd is None or name is None:
            raise BrokerUnavailableError(f"broker {broker_name!r} has no live master in the route")
        return self.by_name(name, bd.namespace)

    def by_name(self, actor_name: str, namespace: str | None = None) -> Any:
        h = self._handles.get(actor_name)
        if h is None:
            try:
                h = ray.get_actor(actor_name, namespace=namespace or self.ns.namespace)
            except ValueError as exc:
                raise BrokerUnavailableError(f"broker actor {actor_name!r} not found") from exc
            if self._wrap is not None:
                h = self._wrap(actor_name, h)
            with self._lock:
                h = self._handles.setdefault(actor_name, h)
        return h

    def broker_for_read(self, route: TopicRouteData, broker_name: str, prefer_id: int = 0) -> Any:
        """A member of ``broker_name`` to read from: ``prefer_id`` (a broker's suggestion)
        when it is live, else the master, else the lowest live slave (the master is gone)."""
        bd = route.broker(broker_name)
        if bd is None or not bd.actor_names:
            raise BrokerUnavailableError(f"broker {broker_name!r} has no live member in the route")
        if prefer_id in bd.actor_names:
            bid = prefer_id
        elif 0 in bd.actor_names:
            bid = 0
        else:
            bid = min(bd.actor_names)
        return self.by_name(bd.actor_names[bid], bd.namespace)

    def cached(self, topic: str, broker_name: str) -> Any | None:
        """The master broker actor of ``broker_name`` for ``topic`` if neither its route
        nor its handle needs a call now (a fresh cached route, a cached handle); else
        None. For threads that must not block, such as the client I/O loop."""
        route = self.ns.cached_route(topic)
        bd = route.broker(broker_name) if route is not None else None
        name = bd.master_actor_name() if bd is not None else None
        return None if name is None else self._handles.get(name)

    def forget(self, actor_name: str) -> None:
        self._handles.pop(actor_name, None)

    def masters(self) -> dict[str, Any]:
        """Every live master broker: broker name → handle."""
        info = self.ns.call("get_cluster_info")
        out = {}
        for broker_name, entry in sorted(info["brokers"].items()):
            master = entry["members"].get(0)
            if master is not None:
                out[broker_name] = self.by_name(master["actor_name"], master["namespace"])
        return out
