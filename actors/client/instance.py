"""The client core shared by every client of a process: RocketMQ's ``MQClientInstance``.

One :class:`ClientInstance` per process and cluster (Ray session, namespace,
NameServers, data path mode and TLS CA) owns what every client needs and nobody
should set up twice: the NameServer client and its route cache (refreshed by the
NameServers' long poll, ``actors.namesrv.client``), the broker handles
(``actors.namesrv.brokers``), the connections to the brokers (each broker's own
socket, its Ray handle as the fallback: ``actors.protocol.data_path``), the
heartbeats to the brokers and the process's client id. A Producer, a consumer or an
Admin keeps only what is its own (its group, its queue selector, its offsets...).

Connections come in two pools, each one connection per broker shared by every client
of the process: :data:`SEND` (producers: calls a broker answers at once) and
:data:`READ` (consumers: pulls and pops a broker may hold, which must never keep a
send waiting behind them on a connection whose reads the broker paused).

The interface, for a client of any kind (the synchronous ones here, an asyncio one
on top):

* ``lease = acquire(namespace, nameservers, data_path=..., tls_ca=...,
  route_ttl_s=..., kind=SEND | READ)`` takes a share of the process's instance for
  that cluster (made on the first share); ``lease.instance`` is the
  :class:`ClientInstance`, ``lease.view`` the :class:`ClientView` the client calls
  (routes, and brokers over its pool); ``lease.release()`` gives the share back
  (once; ``lease.release_with(client)`` also when the client is collected). The
  last share's release stops the heartbeats and closes the connections.
  :func:`share` is both; :class:`SharedClient` is the base of the synchronous
  clients that takes it from their config.
* routes: ``view.route(topic)``, ``view.require_route(topic, refresh=...)``,
  ``view.invalidate(topic)``; NameServer calls: ``view.call(method, *args)``.
* the connection to a broker: ``view.broker(route, broker_name)`` (its master),
  ``view.broker_for_read(...)``, ``view.broker_by_name(actor_name)``,
  ``view.master_brokers()``: each a handle whose per-message requests go over the
  broker's socket (a Ray call while it opens or when it cannot);
  ``view.forget_topic_broker(topic, broker_name)`` after a failed call.
* heartbeats: ``instance.register(key, beat, interval_s)`` has the instance's
  heartbeat thread call ``beat()`` every ``interval_s``; ``unregister(key)`` stops it.
* ``instance.new_client_id(group)``: a client's own id, unique in the cluster;
  ``instance.client_id`` names the process's instance.

Routes live for the shortest ``route_ttl_s`` its clients asked for (a client asking
for none, the Admin, refreshes where it needs to).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import ray

from actors.namesrv.brokers import BrokerHandles
from actors.namesrv.client import NameServerClient, discover_nameservers
from actors.protocol.data_path import DataPath
from actors.protocol.requests import Request
from actors.protocol.route import TopicRouteData
from storage.errors import InvalidMessageError

log = logging.getLogger("raymq.actors.client.instance")

DEFAULT_ROUTE_TTL_S = 30.0


@dataclass(frozen=True)
class InstanceKey:
    """What makes two clients' instance the same one."""

    session: str | None  # the Ray session (a node id): none shared across ray.init()s
    namespace: str
    nameservers: tuple[str, ...]
    data_path: str
    tls_ca: str | None


class BrokerConnections:
    """One pool of the instance: a connection per broker (``actors.protocol.data_path``)
    and the broker handles that call through it."""

    def __init__(self, ns: NameServerClient, mode: str, tls_ca: str | None) -> None:
        self.data_path = DataPath(mode, tls_ca)
        self.handles = BrokerHandles(ns, wrap=self.data_path.wrap)

    def close(self) -> None:
        self.data_path.close()


SEND = "send"
"""The pool of sends and the other calls a broker answers at once (producers)."""
READ = "read"
"""The pool of reads a broker may hold (consumers' long polls): a connection whose
reads are paused behind held pulls never delays a send."""


class ClientInstance:
    """See the module doc. Made by :func:`acquire`, never directly by a client."""

    def __init__(self, key: InstanceKey) -> None:
        self.key = key
        self.namespace = key.namespace
        self.client_id = f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"
        self.ns = NameServerClient(key.nameservers, key.namespace, DEFAULT_ROUTE_TTL_S)
        self.pools = {
            kind: BrokerConnections(self.ns, key.data_path, key.tls_ca) for kind in (SEND, READ)
        }
        self._ttls: dict[int, float] = {}  # lease id -> the route TTL it asked for
        self._beats: dict[Hashable, list[Any]] = {}  # key -> [beat, interval, next due]
        self._beat_lock = threading.Lock()
        self._beat_wake = threading.Event()
        self._beat_thread: threading.Thread | None = None
        self.closed = False

    @property
    def nameservers(self) -> tuple[str, ...]:
        return self.ns.nameservers

    def new_client_id(self, group: str) -> str:
        """A client's own id (``group@<random>``): brokers tell its registrations apart."""
        return f"{group}@{uuid.uuid4().hex[:12]}"

    def view(self, kind: str = SEND) -> ClientView:
        """Routes and the brokers over the ``kind`` pool's connections."""
        return ClientView(self, kind)

    # ------------------------------------------------------------ heartbeats
    def register(self, key: Hashable, beat: Callable[[], Any], interval_s: float) -> None:
        """Call ``beat()`` every ``interval_s`` on the instance's heartbeat thread (the
        first in ``interval_s``) until :meth:`unregister`; a beat that raises is logged
        and called again at its next turn."""
        with self._beat_lock:
            if self.closed:
                raise RuntimeError("the client instance is closed")
            self._beats[key] = [beat, interval_s, time.monotonic() + interval_s]
            if self._beat_thread is None:
                self._beat_thread = threading.Thread(
                    target=self._beat_loop, name="raymq-client-heartbeat", daemon=True
                )
                self._beat_thread.start()
        self._beat_wake.set()

    def unregister(self, key: Hashable) -> None:
        with self._beat_lock:
            self._beats.pop(key, None)

    def _beat_loop(self) -> None:
        while not self.closed:
            now = time.monotonic()
            with self._beat_lock:
                due = [(k, e[0]) for k, e in self._beats.items() if e[2] <= now]
                for k, _ in due:
                    entry = self._beats[k]
                    entry[2] = now + entry[1]
            for key, beat in due:
                try:
                    beat()
                except Exception:  # noqa: BLE001 - its next turn tries again
                    log.exception("heartbeat %s failed", key)
            with self._beat_lock:
                wait = min((e[2] for e in self._beats.values()), default=now + 60.0)
            self._beat_wake.wait(max(0.0, wait - time.monotonic()))
            self._beat_wake.clear()

    # ------------------------------------------------------------ shares
    def _set_ttl(self, lease_id: int, ttl: float | None) -> None:
        if ttl is not None:
            self._ttls[lease_id] = ttl
        else:
            self._ttls.pop(lease_id, None)
        self.ns.route_ttl_s = min(self._ttls.values(), default=DEFAULT_ROUTE_TTL_S)

    def _close(self) -> None:
        with self._beat_lock:
            self.closed = True
            self._beats.clear()
        self._beat_wake.set()
        for pool in self.pools.values():
            pool.close()
        log.info("client instance %s closed", self.client_id)

    @property
    def shares(self) -> int:
        """How many clients hold a share of this instance now."""
        with _LOCK:
            held, count = _SHARES.get(self.key, (None, 0))
            return count if held is self else 0

    def __repr__(self) -> str:
        return f"ClientInstance({self.client_id}, {self.namespace}, {self.key.data_path})"


class ClientView:
    """What a client calls its ``ns``: the instance's routes and NameServers, and the
    brokers over one of its pools (:data:`SEND` or :data:`READ`)."""

    def __init__(self, instance: ClientInstance, kind: str) -> None:
        self.instance = instance
        self.kind = kind
        self.names = instance.ns
        pool = instance.pools[kind]
        self.data_path = pool.data_path
        self.handles = pool.handles

    @property
    def nameservers(self) -> tuple[str, ...]:
        return self.names.nameservers

    @property
    def namespace(self) -> str:
        return self.names.namespace

    # ------------------------------------------------------------ NameServers and routes
    def call(self, method: str, *args: Any) -> Any:
        """``method`` on the current NameServer, failing over through the others."""
        return self.names.call(method, *args)

    def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData | None:
        return self.names.route(topic, refresh=refresh)

    def require_route(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        return self.names.require_route(topic, refresh=refresh)

    def invalidate(self, topic: str) -> None:
        self.names.invalidate(topic)

    # ------------------------------------------------------------ brokers
    def broker(self, route: TopicRouteData, broker_name: str) -> Any:
        """The connection to ``broker_name``'s master."""
        return self.handles.broker(route, broker_name)

    def broker_for_read(self, route: TopicRouteData, broker_name: str, prefer_id: int = 0) -> Any:
        return self.handles.broker_for_read(route, broker_name, prefer_id)

    def broker_by_name(self, actor_name: str, namespace: str | None = None) -> Any:
        return self.handles.by_name(actor_name, namespace)

    def cached_broker(self, topic: str, broker_name: str) -> Any | None:
        return self.handles.cached(topic, broker_name)

    def forget_broker(self, actor_name: str) -> None:
        self.handles.forget(actor_name)

    def master_brokers(self) -> dict[str, Any]:
        return self.handles.masters()

    def forget_topic_broker(self, topic: str, broker_name: str) -> None:
        """After a failed call to ``broker_name`` for ``topic``: re-read the route and
        drop the master's handle (a broker actor made anew under its name is another)."""
        with contextlib.suppress(Exception):  # no NameServer either: the next call finds out
            route = self.names.route(topic)
            bd = route.broker(broker_name) if route is not None else None
            name = bd.master_actor_name() if bd is not None else None
            if name is not None:
                self.handles.forget(name)
        self.names.invalidate(topic)

    def wrap(self, actor_name: str, handle: Any, requests: Mapping[str, Request]) -> Any:
        """The connection to another actor that serves framed ``requests`` on a socket
        of its own (the transaction coordinator)."""
        return self.data_path.wrap(actor_name, handle, requests)


class Lease:
    """A client's share of a :class:`ClientInstance`; :meth:`release` gives it back.
    ``view``: the instance as the client calls it (its pool's brokers)."""

    def __init__(self, instance: ClientInstance, kind: str) -> None:
        self.instance = instance
        self.view = instance.view(kind)
        self._released = False
        self._lock = threading.Lock()

    def release(self) -> None:
        """Give the share back (again: nothing); the last one closes the instance."""
        with self._lock:
            if self._released:
                return
            self._released = True
        _release(self)

    def release_with(self, client: object) -> None:
        """Release the share when ``client`` is collected without being closed."""
        weakref.finalize(client, self.release)


_LOCK = threading.Lock()
_SHARES: dict[InstanceKey, tuple[ClientInstance, int]] = {}
"""Each cluster's instance in this process and how many clients share it."""


def _session() -> str | None:
    if not ray.is_initialized():
        return None
    with contextlib.suppress(Exception):
        return str(ray.get_runtime_context().get_node_id())
    return None


def acquire(
    namespace: str,
    nameservers: Sequence[str] | None = None,
    *,
    data_path: str = "socket",
    tls_ca: str | None = None,
    route_ttl_s: float | None = DEFAULT_ROUTE_TTL_S,
    kind: str = SEND,
) -> Lease:
    """A share of this process's :class:`ClientInstance` for the cluster of
    ``namespace`` (its NameServers found there unless given), made on the first share.
    ``route_ttl_s``: how long this client lets routes be cached (None: any); ``kind``:
    the pool of connections its calls take (:data:`SEND`, or :data:`READ` for a
    consumer's)."""
    names = tuple(nameservers or discover_nameservers(namespace))
    key = InstanceKey(_session(), namespace, names, data_path, tls_ca)
    with _LOCK:
        instance, count = _SHARES.get(key, (None, 0))
        if instance is None:
            instance = ClientInstance(key)
            log.info("client instance %s for %s", instance.client_id, namespace)
        _SHARES[key] = (instance, count + 1)
        lease = Lease(instance, kind)
        instance._set_ttl(id(lease), route_ttl_s)
    return lease


def share(
    client: object,
    namespace: str,
    nameservers: Sequence[str] | None,
    *,
    data_path: str = "socket",
    tls_ca: str | None = None,
    route_ttl_s: float | None = DEFAULT_ROUTE_TTL_S,
    kind: str = SEND,
) -> Lease:
    """:func:`acquire` for ``client``, released when it is collected unless it released
    the share first (a client's ``close``)."""
    lease = acquire(
        namespace,
        nameservers,
        data_path=data_path,
        tls_ca=tls_ca,
        route_ttl_s=route_ttl_s,
        kind=kind,
    )
    lease.release_with(client)
    return lease


class ConnectionOptions(Protocol):
    """A client's settings the instance is chosen by (a producer's or consumer's config)."""

    @property
    def data_path(self) -> str: ...

    @property
    def data_tls_ca(self) -> str | None: ...

    @property
    def route_refresh_s(self) -> float: ...


@dataclass(frozen=True)
class Connection:
    """:class:`ConnectionOptions` given one by one, for a client without a config."""

    data_path: str = "socket"
    data_tls_ca: str | None = None
    route_refresh_s: float = DEFAULT_ROUTE_TTL_S


class SharedClient:
    """A client with a share of its process's instance: :meth:`_join` takes it (and
    names the client), :meth:`_leave` gives it back."""

    group: str
    client_id: str
    instance: ClientInstance
    ns: ClientView
    _lease: Lease
    _data_path: DataPath

    def _join(
        self,
        what: str,
        group: str,
        namespace: str,
        nameservers: Sequence[str] | None,
        options: ConnectionOptions,
        kind: str = SEND,
    ) -> None:
        """Check ``group`` (a ``what`` group) and take this client's share of the
        instance for ``namespace`` and ``options``, its calls on the ``kind`` pool."""
        if not isinstance(group, str) or not group:
            raise InvalidMessageError(f"{what} group={group!r}: must be a non-empty str")
        self.group = group
        self._share(namespace, nameservers, options, kind)
        self.client_id = self.instance.new_client_id(group)

    def _share(
        self,
        namespace: str,
        nameservers: Sequence[str] | None,
        options: ConnectionOptions,
        kind: str = SEND,
    ) -> None:
        """Take this client's share of the instance for ``namespace`` and ``options``,
        its calls on the ``kind`` pool (:meth:`_join` without a group)."""
        self._lease = share(
            self,
            namespace,
            nameservers,
            data_path=options.data_path,
            tls_ca=options.data_tls_ca,
            route_ttl_s=options.route_refresh_s,
            kind=kind,
        )
        self.instance, self.ns = self._lease.instance, self._lease.view
        self._data_path = self.ns.data_path

    def _leave(self) -> None:
        """Give the share back; the last client of the process closes the connections."""
        self._lease.release()


def _release(lease: Lease) -> None:
    instance = lease.instance
    with _LOCK:
        instance._set_ttl(id(lease), None)
        held, count = _SHARES.get(instance.key, (None, 0))
        if held is not instance:
            return
        if count > 1:
            _SHARES[instance.key] = (instance, count - 1)
            return
        del _SHARES[instance.key]
    instance._close()
