"""A client's data path: per-message calls to brokers over their own sockets.

Ray is the control plane; what a client does per message (send, pull, commit
offsets, send back, heartbeat, end transactions, POP receive, ack and change of
invisible time) goes over one connection per broker (``actors.protocol.connection``), as RocketMQ's clients keep to each broker. A
:class:`BrokerStub` stands where a broker's Ray handle stood
(``BrokerHandles(wrap=...)``, ``actors.namesrv.brokers``): ``stub.send.remote(...)`` goes over the socket
and answers a :class:`~actors.protocol.rpc.PendingCall` that ``rpc.get``,
``rpc.wait`` and ``.future()`` take as they take an ObjectRef; any other method
is the Ray handle's. Callers do not change.

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
from collections.abc import Mapping
from typing import Any

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
        broker's by default; :data:`COORDINATOR_REQUESTS` for the transaction
        coordinator, whose ``data_path`` answers as a broker's does)."""
        if self.mode != "socket":
            return handle
        self._start_open(actor_name, handle)
        return BrokerStub(self, actor_name, handle, _REQUESTS if requests is None else requests)

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
        conn = BrokerConnection(
            info["addr"], info["secret"], tls=info["tls"], tls_ca=self.tls_ca, name=actor_name
        )
        conn.open()
        return conn

    def close(self) -> None:
        with self._lock:
            self.closed = True
            conns, self._conns = self._conns, {}
        for conn in conns.values():
            conn.close()


_OPENER = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="raymq-data-path-open")
"""Opens connections off the callers' threads (shared by every client of the process)."""


class BrokerStub:
    """A broker's Ray handle whose per-message methods go over its socket."""

    def __init__(
        self, data_path: DataPath, actor_name: str, handle: Any, requests: Mapping[str, Request]
    ) -> None:
        self._dp = data_path
        self.actor_name = actor_name
        self.handle = handle
        self._requests = requests

    def __getattr__(self, method: str) -> Any:
        request = self.__dict__.get("_requests", _REQUESTS).get(method)
        if request is None:
            return getattr(self.handle, method)
        return _Method(self, method, request)

    def on_socket(self) -> bool:
        """Whether its calls go over an open connection now (none goes through Ray, and
        none waits for a connection to open)."""
        return self._dp.is_open(self.actor_name)

    def __reduce__(self) -> Any:  # a stub handed to a Ray task arrives as the Ray handle
        return (_identity, (self.handle,))

    def __repr__(self) -> str:
        return f"BrokerStub({self.actor_name})"


class _Method:
    """``stub.<method>``: ``remote`` and ``oneway`` frame the call as its declaration
    says. A request declared unordered (a read the broker may hold up to its long
    poll) neither waits behind calls made through Ray nor holds others."""

    __slots__ = ("_stub", "_name", "_encode", "_ordered")

    def __init__(self, stub: BrokerStub, name: str, request: Request) -> None:
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
_REQUESTS = by_method(BROKER)
"""The broker's per-message methods, each framed as its declaration says
(``actors.protocol.requests``)."""

COORDINATOR_REQUESTS = by_method(COORDINATOR)
"""The transaction coordinator's per-transaction method, framed (``TXN_END``)."""
