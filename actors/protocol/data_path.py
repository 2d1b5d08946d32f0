"""A client's data path: per-message calls to brokers over their own sockets.

Ray is the control plane; what a client does per message (send, pull, commit
offsets, send back, heartbeat, end transactions, POP receive, ack and change of
invisible time) goes over one connection per broker (``actors.protocol.connection``), as RocketMQ's clients keep to each broker. A
:class:`BrokerStub` stands where a broker's Ray handle stood
(``NameServerClient(wrap=...)``): ``stub.send.remote(...)`` goes over the socket
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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from actors.protocol import rpc
from actors.protocol.connection import BrokerConnection
from actors.protocol.frames import Code
from actors.protocol.pop import PoppedMessage, pops_from_wire
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

    def wrap(self, actor_name: str, handle: Any, requests: Mapping[str, Any] | None = None) -> Any:
        """For ``NameServerClient(wrap=...)``: starts opening the broker's connection.
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
        self, data_path: DataPath, actor_name: str, handle: Any, requests: Mapping[str, Any]
    ) -> None:
        self._dp = data_path
        self.actor_name = actor_name
        self.handle = handle
        self._requests = requests

    def __getattr__(self, method: str) -> Any:
        encode = self.__dict__.get("_requests", _REQUESTS).get(method)
        if encode is None:
            return getattr(self.handle, method)
        return _Method(self, method, encode)

    def on_socket(self) -> bool:
        """Whether its calls go over an open connection now (none goes through Ray, and
        none waits for a connection to open)."""
        return self._dp.is_open(self.actor_name)

    def __reduce__(self) -> Any:  # a stub handed to a Ray task arrives as the Ray handle
        return (_identity, (self.handle,))

    def __repr__(self) -> str:
        return f"BrokerStub({self.actor_name})"


UNORDERED = frozenset({"pull_packed", "pop"})
"""Reads, held by the broker up to their long poll: their order against other calls
does not matter, so they neither wait behind calls made through Ray nor hold others."""


class _Method:
    __slots__ = ("_stub", "_name", "_encode", "_ordered")

    def __init__(self, stub: BrokerStub, name: str, encode: Any) -> None:
        self._stub, self._name, self._encode = stub, name, encode
        self._ordered = name not in UNORDERED

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
def _body(h: Mapping[str, Any], body: bytes) -> bytes:
    return body


def _result(h: Mapping[str, Any], body: bytes) -> Any:
    return h.get("r")


def _none(h: Mapping[str, Any], body: bytes) -> None:
    return None


def _send(blob: bytes | np.ndarray, auto_create_queue_nums: int = 0) -> Any:
    return {"c": int(Code.SEND), "n": int(auto_create_queue_nums)}, [blob], _body


def _ring_answer(h: Mapping[str, Any], body: bytes) -> bytes | None:
    return None if h.get("u") else body  # "u": the broker cannot read the ring


def _send_shared(
    ring: tuple[int, int, bytes], offset: int, length: int, auto_create_queue_nums: int = 0
) -> Any:
    header = {
        "c": int(Code.SEND_SHARED),
        "r": list(ring),
        "x": int(offset),
        "l": int(length),
        "n": int(auto_create_queue_nums),
    }
    return header, [], _ring_answer


def _pull_packed(request: bytes) -> Any:
    return {"c": int(Code.PULL)}, [request], _body


def _commit_offsets(
    group: str,
    offsets: Mapping[tuple[str, int], int],
    client_id: str = "",
    tokens: Mapping[tuple[str, int], tuple[int, int]] | None = None,
) -> Any:
    header: dict[str, Any] = {"c": int(Code.COMMIT_OFFSETS), "g": group, "i": client_id}
    header["q"] = [[t, q, o] for (t, q), o in offsets.items()]
    if tokens:
        header["k"] = [[t, q, e, g] for (t, q), (e, g) in tokens.items()]
    return header, [], _result


def _send_back(
    group: str,
    commitlog_offsets: Sequence[int],
    max_reconsume_times: int,
    reconsume_times: Sequence[int] | None = None,
) -> Any:
    header = {
        "c": int(Code.SEND_BACK),
        "g": group,
        "q": [int(o) for o in commitlog_offsets],
        "x": max_reconsume_times,
        "t": None if reconsume_times is None else [int(t) for t in reconsume_times],
    }
    return header, [], _result


def _heartbeat(
    group: str, client_id: str, topics: Sequence[str], ttl_s: float | None = None
) -> Any:
    header = {"c": int(Code.HEARTBEAT), "g": group, "i": client_id, "t": list(topics)}
    header["l"] = ttl_s
    return header, [], _none


def _unregister(group: str, client_id: str) -> Any:
    return {"c": int(Code.UNREGISTER), "g": group, "i": client_id}, [], _none


def _end_transaction(group: str, half_offset: int, transaction_id: str, commit: bool) -> Any:
    header = {
        "c": int(Code.END_TRANSACTION),
        "g": group,
        "q": half_offset,
        "i": transaction_id,
        "m": commit,
    }
    return header, [], _result


def _end_transaction_batch(
    txn_id: str,
    commit: bool,
    half_offsets: Sequence[int | str] | None = None,
    offsets: Mapping[str, Mapping[tuple[str, int], int]] | None = None,
    transactional_id: str | None = None,
    epoch: int | None = None,
    retry: bool = False,
) -> Any:
    header: dict[str, Any] = {
        "c": int(Code.END_TRANSACTION_BATCH),
        "x": txn_id,
        "m": commit,
        "q": None if half_offsets is None else list(half_offsets),
        "i": transactional_id,
        "e": epoch,
        "y": retry,
    }
    if offsets:
        header["k"] = {g: [[t, q, o] for (t, q), o in qs.items()] for g, qs in offsets.items()}
    return header, [], _result


def _commit_one_phase(
    txn_id: str,
    transactional_id: str,
    epoch: int,
    blob: bytes | np.ndarray,
    offsets: Mapping[str, Sequence[Sequence[Any]]] | None = None,
) -> Any:
    header: dict[str, Any] = {
        "c": int(Code.TXN_COMMIT_ONE_PHASE),
        "x": txn_id,
        "i": transactional_id,
        "e": epoch,
    }
    if offsets:
        header["k"] = {g: [list(r) for r in rows] for g, rows in offsets.items()}
    return header, [blob], _result


def _end_transactions(group: str, ends: Sequence[tuple[int, str, bool]]) -> Any:
    header = {"c": int(Code.END_TRANSACTIONS), "g": group, "q": [list(e) for e in ends]}
    return header, [], _result


def _popped(h: Mapping[str, Any], body: bytes) -> list[PoppedMessage]:
    return pops_from_wire(h.get("r"), body)


def _pop(
    group: str,
    topic: str,
    max_msgs: int,
    invisible_ms: int,
    wait_ms: int = 0,
    *,
    fifo: bool = False,
    tag_expr: str = "*",
    client_id: str = "",
) -> Any:
    header = {
        "c": int(Code.POP),
        "g": group,
        "t": topic,
        "n": max_msgs,
        "i": invisible_ms,
        "w": wait_ms,
        "ff": fifo,
        "x": tag_expr,
        "id": client_id,
    }
    return header, [], _popped


def _ack_message(group: str, topic: str, receipt_handle: str | Sequence[str]) -> Any:
    handles = receipt_handle if isinstance(receipt_handle, str) else list(receipt_handle)
    return {"c": int(Code.ACK), "g": group, "t": topic, "h": handles}, [], _result


def _change_invisible(group: str, topic: str, receipt_handle: str, invisible_ms: int) -> Any:
    header = {
        "c": int(Code.CHANGE_INVISIBLE),
        "g": group,
        "t": topic,
        "h": receipt_handle,
        "i": invisible_ms,
    }
    return header, [], _result


_REQUESTS = {
    "send": _send,
    "send_shared": _send_shared,
    "pull_packed": _pull_packed,
    "commit_offsets": _commit_offsets,
    "consumer_send_msg_back": _send_back,
    "heartbeat": _heartbeat,
    "unregister_consumer": _unregister,
    "end_transaction": _end_transaction,
    "end_transaction_batch": _end_transaction_batch,
    "end_transactions": _end_transactions,
    "commit_one_phase": _commit_one_phase,
    "pop": _pop,
    "ack_message": _ack_message,
    "change_invisible_duration": _change_invisible,
}
"""The broker's per-message methods, and how each is framed (header, body, decoder)."""


def _txn_end(
    txn_id: str,
    transactional_id: str,
    epoch: int,
    commit: bool,
    halves: Mapping[str, Sequence[int] | None] | None = None,
    offsets: Mapping[str, Mapping[str, Sequence[tuple[str, int, int]]]] | None = None,
    wait: bool = True,
) -> Any:
    header = {
        "c": int(Code.TXN_END),
        "x": txn_id,
        "i": transactional_id,
        "e": epoch,
        "m": commit,
        "h": None
        if halves is None
        else {b: None if h is None else list(h) for b, h in halves.items()},
        "k": None
        if offsets is None
        else {b: {g: [list(q) for q in qs] for g, qs in gs.items()} for b, gs in offsets.items()},
        "w": wait,
    }
    return header, [], _result


COORDINATOR_REQUESTS = {"end": _txn_end}
"""The transaction coordinator's per-transaction method, framed (``TXN_END``)."""
