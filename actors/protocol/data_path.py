"""A client's data path: per-message calls to brokers over their own sockets.

Ray is the control plane; what a client does per message (send, pull, commit
offsets, send back, heartbeat, end transactions, POP receive, ack and change of
invisible time) goes over one connection per broker (``actors.protocol.connection``), as RocketMQ's clients keep to each broker. A
``BrokerStub`` stands where a broker's Ray handle stood
(``BrokerHandles(wrap=...)``, ``actors.namesrv.brokers``): its class has a method per
request the broker declares (``actors.protocol.requests``): ``stub.send.remote(...)``
goes over the socket and answers a :class:`~actors.protocol.rpc.PendingCall` that
``rpc.get``, ``rpc.wait`` and ``.future()`` take as they take an ObjectRef; the
broker's other Ray methods (:data:`BROKER_RAY_ONLY`) are the Ray handle's, and
``stub.handle`` is the handle itself.

Finding a broker's socket: its address and this incarnation's secret come from the
broker itself, through Ray (``Broker.data_path``), once per incarnation. A broker
that restarted (another port, another secret) is found again the same way: the
connection breaks, the next call asks Ray anew. A broker whose socket cannot be
reached is called through Ray instead, logged, and its socket tried again after a
backoff that doubles from ``RETRY_SOCKET_MIN_S`` to ``RETRY_SOCKET_S`` (a broker
restarting is back on its socket in a second or two; one whose socket is blocked is
asked every half minute): a socket that does not work never costs a broker Ray can
reach.
``data_path="ray"`` keeps every call on Ray.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray

from actors.protocol import rpc
from actors.protocol.connection import BrokerConnection
from actors.protocol.requests import BROKER, COORDINATOR, Request, by_method
from actors.protocol.rpc import PendingCall
from storage.errors import BrokerUnavailableError

log = logging.getLogger("raymq.actors.protocol.data_path")

RETRY_SOCKET_MIN_S = 0.5
RETRY_SOCKET_S = 30.0
DATA_PATH_CALL_S = 5.0
RAY_AHEAD_S = 10.0
"""How long calls made through Ray keep a broker's later calls off its socket at most
(see :meth:`DataPath.connection`): a call Ray never answers must not keep it forever."""


class DataPath:
    """One client's connections to brokers, by broker actor name.

    Finding a connection never blocks the caller: a call is made on whatever thread
    a client runs it (a user's, a Ray callback's, the client I/O loop's), and
    waiting there for Ray or a handshake could deadlock. A broker without an open
    connection gets this call through Ray while one opens on the ``opener`` thread;
    the calls after it take the socket.
    """

    def __init__(self, mode: str = "socket", tls_ca: str | None = None) -> None:
        self.mode = mode
        self.tls_ca = tls_ca
        self._conns: dict[str, BrokerConnection] = {}
        # actor name -> (when to try its socket again, the backoff that got it there)
        self._no_socket: dict[str, tuple[float, float]] = {}
        self._opening: set[str] = set()
        # actor name -> [calls made through Ray and not yet answered, until when they count]
        self._via_ray: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        self.closed = False

    def wrap(
        self, actor_name: str, handle: Any, requests: Mapping[str, Request] | None = None
    ) -> Any:
        """For ``BrokerHandles(wrap=...)``: starts opening the broker's connection.
        ``requests``: the methods that go over the socket, and how each is framed (a
        broker's by default: a :data:`BrokerStub`; :data:`COORDINATOR_REQUESTS` for the
        transaction coordinator, whose ``data_path`` answers as a broker's does: a
        :data:`CoordinatorStub`)."""
        if self.mode != "socket":
            return handle
        if requests is None or requests is BrokerStub.requests:
            stub_class = BrokerStub
        elif requests is COORDINATOR_REQUESTS:
            stub_class = CoordinatorStub
        else:
            raise ValueError("requests: the broker's (None) or COORDINATOR_REQUESTS")
        self._start_open(actor_name, handle)
        return stub_class(self, actor_name, handle)

    def connection(
        self, actor_name: str, handle: Any, ordered: bool = True
    ) -> BrokerConnection | None:
        """An open connection to the broker's socket, or None (call it through Ray; a
        connection is opening meanwhile unless the broker's backoff says not yet).
        ``ordered``: the call must reach the broker after the calls made before it
        through Ray (a send); a read (a pull, a pop) takes the socket at once."""
        conn = self._conns.get(actor_name)
        if conn is not None and conn.error is None and not conn.closed:
            if ordered and actor_name in self._via_ray and self._ray_ahead(actor_name):
                return None
            return conn
        self._start_open(actor_name, handle)
        return None

    def is_open(self, actor_name: str) -> bool:
        """Whether calls to ``actor_name`` go over an open connection now (nothing is
        started)."""
        conn = self._conns.get(actor_name)
        if conn is None or conn.error is not None or conn.closed:
            return False
        return not (actor_name in self._via_ray and self._ray_ahead(actor_name))

    def through_ray(
        self, actor_name: str, method: Any, *args: Any, ordered: bool = True, **kwargs: Any
    ) -> Any:
        """``method.remote(*args, **kwargs)`` (a Ray handle's), counted among the calls
        that keep ``actor_name``'s later ordered calls off its socket until answered
        (unless ``ordered`` is false: a held pull must not keep sends off it for long)."""
        ref = method.remote(*args, **kwargs)
        if not ordered:
            return ref
        with self._lock:
            ahead = self._via_ray.setdefault(actor_name, [0, 0.0])
            ahead[0] += 1
            ahead[1] = time.monotonic() + RAY_AHEAD_S
        ref.future().add_done_callback(lambda _: self._ray_answered(actor_name))
        return ref

    def _ray_answered(self, actor_name: str) -> None:
        with self._lock:
            ahead = self._via_ray.get(actor_name)
            if ahead is not None:
                ahead[0] -= 1
                if ahead[0] <= 0:
                    del self._via_ray[actor_name]

    def _ray_ahead(self, actor_name: str) -> bool:
        """Calls through Ray to ``actor_name`` are unanswered (and recent enough to wait for)."""
        with self._lock:
            ahead = self._via_ray.get(actor_name)
            if ahead is None:
                return False
            if time.monotonic() < ahead[1]:
                return True
            del self._via_ray[actor_name]  # unanswered too long: the socket goes ahead
            return False

    def _start_open(self, actor_name: str, handle: Any) -> None:
        with self._lock:
            if self.closed or actor_name in self._opening:
                return
            conn = self._conns.get(actor_name)
            if conn is not None and conn.error is None and not conn.closed:
                return
            if time.monotonic() < self._no_socket.get(actor_name, (0.0, 0.0))[0]:
                return
            self._opening.add(actor_name)
        _OPENER.submit(self._open_now, actor_name, handle)

    def _open_now(self, actor_name: str, handle: Any) -> None:
        try:
            conn = self._open(actor_name, handle)
        except Exception as exc:  # noqa: BLE001 - Ray's path still works
            with self._lock:
                last = self._no_socket.get(actor_name, (0.0, 0.0))[1]
                backoff = min(RETRY_SOCKET_S, max(RETRY_SOCKET_MIN_S, 2 * last))
                self._no_socket[actor_name] = (time.monotonic() + backoff, backoff)
                self._opening.discard(actor_name)
            log.warning(
                "broker %s: no data-path connection (%s: %s); calling it through Ray, "
                "its socket again in %.1f s",
                actor_name,
                type(exc).__name__,
                exc,
                backoff,
            )
            return
        with self._lock:
            old = self._conns.get(actor_name)
            self._opening.discard(actor_name)
            self._no_socket.pop(actor_name, None)
            if self.closed:
                conn.close()
                return
            self._conns[actor_name] = conn
        if old is not None:
            old.close()

    def _open(self, actor_name: str, handle: Any) -> BrokerConnection:
        info = rpc.get(handle.data_path.remote(), DATA_PATH_CALL_S)
        if not info:
            raise BrokerUnavailableError("the broker serves no data path")
        unix = info.get("unix")
        conn = BrokerConnection(
            info["addr"],
            info["secret"],
            tls=info["tls"],
            tls_ca=self.tls_ca,
            name=actor_name,
            unix=unix if unix and info.get("node") == _node_id() else None,
        )
        conn.open()
        return conn

    def close(self) -> None:
        with self._lock:
            self.closed = True
            conns, self._conns = self._conns, {}
        for conn in conns.values():
            conn.close()


def _node_id() -> str | None:
    """This process's Ray node (None outside Ray): a server's Unix socket is taken only
    by a client on the server's node."""
    try:
        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # noqa: BLE001 - no Ray here: the TCP port
        return None


_OPENER = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="raymq-data-path-open")
"""Opens connections off the callers' threads (shared by every client of the process)."""


class _Stub:
    """An actor's stub (a broker's, the transaction coordinator's): what its class
    declares as socket requests go over the socket (:class:`_Declared`), the other Ray
    methods it names go to the Ray handle (:class:`_ThroughRay`); nothing else (the
    handle itself is ``stub.handle``)."""

    requests: Mapping[str, Request] = {}
    """The actor's socket requests, by Ray method name."""

    def __init__(self, data_path: DataPath, actor_name: str, handle: Any) -> None:
        self._dp = data_path
        self.actor_name = actor_name
        self.handle = handle

    def on_socket(self) -> bool:
        """Whether its calls go over an open connection now (none goes through Ray, and
        none waits for a connection to open)."""
        return self._dp.is_open(self.actor_name)

    def connection(self) -> BrokerConnection | None:
        """Its open connection, for a stream (``BrokerConnection.stream``), or None
        while none is open (one starts opening)."""
        return self._dp.connection(self.actor_name, self.handle, ordered=False)

    def __reduce__(self) -> Any:  # a stub handed to a Ray task arrives as the Ray handle
        return (_identity, (self.handle,))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.actor_name})"


class _Declared:
    """A socket request as a stub's method: ``stub.<method>`` is a :class:`_Method`
    framing the call as ``request`` declares."""

    __slots__ = ("request",)

    def __init__(self, request: Request) -> None:
        self.request = request

    def __get__(self, stub: _Stub | None, owner: type | None = None) -> Any:
        if stub is None:
            return self
        return _Method(stub, self.request.method, self.request)


class _ThroughRay:
    """A Ray method the actor serves only through Ray: ``stub.<name>`` is the Ray
    handle's method."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, stub: _Stub | None, owner: type | None = None) -> Any:
        if stub is None:
            return self
        return getattr(stub.handle, self.name)


def _stub_class(
    name: str, requests: Sequence[Request], through_ray: frozenset[str], doc: str
) -> type[_Stub]:
    """A stub class with a method per declared request and per Ray-only method."""
    table = by_method(requests)
    both = set(table) & through_ray
    if both:
        raise ValueError(f"{name}: {sorted(both)} declared as socket requests and Ray-only")
    namespace: dict[str, Any] = {"__doc__": doc, "requests": table, "__slots__": ()}
    namespace.update({method: _Declared(r) for method, r in table.items()})
    namespace.update({method: _ThroughRay(method) for method in sorted(through_ray)})
    return type(name, (_Stub,), namespace)


BROKER_RAY_ONLY = frozenset(
    {
        "allocate_producer_id",
        "check_transactions",
        "consumer_lag",
        "consumer_list",
        "counters",
        "create_retry_topic",
        "create_topic",
        "data_path",
        "delay_levels",
        "delete_topic",
        "drop_ring",
        "fence_offsets",
        "fence_transactional",
        "forward_to_dead_letter_queue",
        "get_topic_config",
        "grpc_endpoint",
        "ha_config_snapshot",
        "ha_local_offsets",
        "ha_log_tail",
        "ha_merge_offsets",
        "ha_transfer",
        "inject_fault",
        "lite_create_parent",
        "lite_delete_topic",
        "lite_describe_parent",
        "lite_describe_topic",
        "lite_parents",
        "lite_stats",
        "lite_topics",
        "lite_topics_page",
        "load_stream_checkpoint",
        "message_by_id",
        "offset_fences",
        "pending_transactions",
        "persist",
        "ping",
        "promote",
        "pull",
        "query_by_key",
        "query_offset",
        "query_offsets",
        "raft_receive",
        "read_dlq",
        "recall_timer",
        "register_all",
        "register_transaction_producer",
        "reset_offsets",
        "save_stream_checkpoint",
        "set_group_fifo",
        "shutdown",
        "status",
        "topic_configs",
        "topic_status",
        "unregister_transaction_producer",
        "wait_closed",
    }
)
"""The broker's Ray methods not declared as socket requests: a broker stub passes
them to its Ray handle (``actors.broker.broker.Broker``'s other methods)."""

COORDINATOR_RAY_ONLY = frozenset(
    {
        "data_path",
        "fences",
        "init_producer",
        "inject_fault",
        "ping",
        "resolve",
        "settings",
        "shutdown",
        "status",
        "transaction",
    }
)
"""The transaction coordinator's Ray methods not declared as socket requests."""

BrokerStub = _stub_class(
    "BrokerStub",
    BROKER,
    BROKER_RAY_ONLY,
    """A broker's stub: its socket requests (``requests.BROKER``) over its connection,
    its other Ray methods through its Ray handle.""",
)
CoordinatorStub = _stub_class(
    "CoordinatorStub",
    COORDINATOR,
    COORDINATOR_RAY_ONLY,
    """The transaction coordinator's stub: ``end`` (``TXN_END``) over its connection,
    its other Ray methods through its Ray handle.""",
)


class _Method:
    """``stub.<method>``: ``remote`` and ``oneway`` frame the call as its declaration
    says. A request declared unordered (a read the broker may hold up to its long
    poll) neither waits behind calls made through Ray nor holds others."""

    __slots__ = ("_stub", "_name", "_encode", "_ordered")

    def __init__(self, stub: _Stub, name: str, request: Request) -> None:
        self._stub, self._name = stub, name
        self._encode, self._ordered = request.encode, request.ordered

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        stub = self._stub
        conn = stub._dp.connection(stub.actor_name, stub.handle, self._ordered)
        if conn is None:
            method = getattr(stub.handle, self._name)
            return stub._dp.through_ray(
                stub.actor_name, method, *args, ordered=self._ordered, **kwargs
            )
        header, body, decode = self._encode(*args, **kwargs)
        return PendingCall(conn.request(header, body, decode=decode))

    def oneway(self, *args: Any, **kwargs: Any) -> None:
        """The request without waiting for, or getting, an answer (RocketMQ's
        ``invokeOneway``): written on the socket and forgotten (the broker answers
        nothing); through Ray, the call is made and its result dropped. A request lost
        on the way is not reported: for what only a caller that can afford that sends."""
        stub = self._stub
        conn = stub._dp.connection(stub.actor_name, stub.handle)
        if conn is None:
            getattr(stub.handle, self._name).remote(*args, **kwargs)
            return
        header, body, _ = self._encode(*args, **kwargs)
        conn.request(header, body, oneway=True)


def _identity(value: Any) -> Any:
    return value


# ------------------------------------------------------------ the requests
COORDINATOR_REQUESTS = CoordinatorStub.requests
"""The transaction coordinator's per-transaction method, framed (``TXN_END``)."""
