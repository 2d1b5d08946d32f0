"""The clients' view of the NameServers: ask one, fail over to the next, cache routes.

Only the NameServers: the broker handles a route leads to are
:class:`actors.namesrv.brokers.BrokerHandles`'s, the connections to brokers
``actors.protocol.data_path``'s, and what a process's clients share of all three
``actors.client.instance``'s.

Cached routes live for ``route_ttl_s``, but a client also keeps one long poll
(``NameServer.wait_route_change``) pending on its current NameServer: when a
broker joins or leaves or a new master takes over, the poll returns and every
cached route is dropped, so the next call re-routes at once.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError

from actors.protocol import rpc as _rpc
from actors.protocol.names import DEFAULT_NAMESPACE
from actors.protocol.route import TopicRouteData
from storage.errors import BrokerUnavailableError, TopicNotFoundError

log = logging.getLogger("raymq.actors.client")

NS_CALL_TIMEOUT_S = 5.0
ROUTE_WATCH_S = 30.0


_WATCHERS = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="raymq-route-watch")


def _route_changed(client: weakref.ref[NameServerClient], fut: Any) -> None:
    # Ray runs this on its own I/O thread, which must not block: re-arm elsewhere.
    if client() is not None:  # a client nobody holds any more stops watching
        with contextlib.suppress(RuntimeError):  # the interpreter is exiting
            _WATCHERS.submit(_rearm, client, fut)


def _rearm(client: weakref.ref[NameServerClient], fut: Any) -> None:
    me = client()
    if me is not None:
        me._on_route_change(fut)


class NameServerClient:
    def __init__(
        self,
        nameservers: Sequence[str],
        namespace: str,
        route_ttl_s: float = 30.0,
    ) -> None:
        if not nameservers:
            raise BrokerUnavailableError("no NameServer names given")
        self.nameservers = tuple(nameservers)
        self.namespace = namespace
        self.route_ttl_s = route_ttl_s
        self._handles: dict[str, Any] = {}
        self._current = 0
        self._routes: dict[str, tuple[float, TopicRouteData]] = {}
        self._lock = threading.Lock()
        self._route_version = -1
        self._route_watch: Any = None  # the pending wait_route_change ref
        self._on_brokers_changed: list[Callable[[], Any]] = []

    def on_brokers_changed(self, callback: Callable[[], Any]) -> None:
        """Call ``callback()`` whenever the NameServers report the brokers changed (a
        broker joined or left, a new master took over): handles cached by actor name
        are stale then."""
        self._on_brokers_changed.append(callback)

    def _handle(self, name: str) -> Any:
        h = self._handles.get(name)
        if h is None:
            h = ray.get_actor(name, namespace=self.namespace)
            self._handles[name] = h
        return h

    def _call_on(self, name: str, method: str, args: tuple[Any, ...]) -> Any:
        """``method`` on NameServer ``name``. A cached handle of an actor that died is
        dropped and the name looked up again once: the NameServers of a cluster
        started anew in the namespace (this client outlived the first) are other
        actors under the same names."""
        cached = name in self._handles
        try:
            return _rpc.get(getattr(self._handle(name), method).remote(*args), NS_CALL_TIMEOUT_S)
        except RayActorError:
            if not cached:
                raise
            self._handles.pop(name, None)
        return _rpc.get(getattr(self._handle(name), method).remote(*args), NS_CALL_TIMEOUT_S)

    def call(self, method: str, *args: Any) -> Any:
        """Call ``method`` on the current NameServer, failing over through the others."""
        if method != "wait_route_change":
            self._watch_routes()  # cached broker handles go when brokers come and go
        errors = []
        n = len(self.nameservers)
        for i in range(n):
            idx = (self._current + i) % n
            name = self.nameservers[idx]
            try:
                result = self._call_on(name, method, args)
            except Exception as exc:  # noqa: BLE001 - try the next NameServer
                if not _rpc.is_retriable(exc) and not isinstance(exc, ValueError):
                    raise
                self._handles.pop(name, None)
                errors.append(f"{name}: {type(exc).__name__}")
                continue
            if idx != self._current:
                log.warning("NameServer failover: now using %s (%s)", name, "; ".join(errors))
                self._current = idx
            return result
        raise BrokerUnavailableError(
            f"no NameServer answered in namespace {self.namespace!r}: {'; '.join(errors)}"
        )

    # ------------------------------------------------------------ routes
    def _watch_routes(self) -> None:
        """Keep one ``wait_route_change`` pending on the current NameServer."""
        if self._route_watch is not None:
            return
        try:
            handle = self._handle(self.nameservers[self._current])
            if self._route_version < 0:
                self._route_version = _rpc.get(
                    handle.wait_route_change.remote(-1, 0.0), NS_CALL_TIMEOUT_S
                )
            ref = handle.wait_route_change.remote(self._route_version, ROUTE_WATCH_S)
        except Exception:  # noqa: BLE001 - routes still expire by their TTL
            return
        self._route_watch = ref
        me = weakref.ref(self)
        ref.future().add_done_callback(lambda fut: _route_changed(me, fut))

    def _on_route_change(self, fut: Any) -> None:
        try:
            version = fut.result()
        except Exception:  # noqa: BLE001 - the NameServer died: trust nothing cached
            version = None
        if version != self._route_version:
            self._routes.clear()
            for callback in self._on_brokers_changed:  # a broker started anew is a new actor
                callback()
        self._route_watch = None
        if version is not None:
            self._route_version = version
            self._watch_routes()

    def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData | None:
        self._watch_routes()
        now = time.monotonic()
        cached = self._routes.get(topic)
        if cached is not None and not refresh and now - cached[0] < self.route_ttl_s:
            return cached[1]
        route = self.call("get_route", topic)
        if route is None:
            # a NameServer Ray just restarted knows no broker until their next heartbeat
            route = self._route_from_others(topic)
        if route is None:
            self._routes.pop(topic, None)
            return None
        self._routes[topic] = (now, route)
        return route

    def _route_from_others(self, topic: str) -> TopicRouteData | None:
        for i in range(1, len(self.nameservers)):
            name = self.nameservers[(self._current + i) % len(self.nameservers)]
            try:
                route = _rpc.get(self._handle(name).get_route.remote(topic), NS_CALL_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - best effort
                self._handles.pop(name, None)
                continue
            if route is not None:
                return route
        return None

    def cached_route(self, topic: str) -> TopicRouteData | None:
        """``topic``'s cached route while fresh, else None (no call made)."""
        cached = self._routes.get(topic)
        if cached is None or time.monotonic() - cached[0] >= self.route_ttl_s:
            return None
        return cached[1]

    def require_route(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        route = self.route(topic, refresh=refresh)
        if route is None or not route.queue_datas:
            raise TopicNotFoundError(
                f"topic={topic!r}: no route on the NameServers (no broker has it)"
            )
        return route

    def invalidate(self, topic: str) -> None:
        self._routes.pop(topic, None)


NAMESERVER_PREFIX = "nameserver-"


def named_actors(namespace: str) -> list[str]:
    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == namespace
    )


def discover_nameservers(namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """Names of the NameServer actors alive in ``namespace``, in index order."""
    if not ray.is_initialized():
        raise BrokerUnavailableError("Ray is not initialized: call ray.init(address=...) first")
    names = [n for n in named_actors(namespace) if n.startswith(NAMESERVER_PREFIX)]
    if not names:
        raise BrokerUnavailableError(f"no RayMQ NameServer in Ray namespace {namespace!r}")
    return sorted(
        names,
        key=lambda n: (
            int(n[len(NAMESERVER_PREFIX) :]) if n[len(NAMESERVER_PREFIX) :].isdigit() else 1 << 30
        ),
    )
