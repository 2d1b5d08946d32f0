"""The SimpleConsumer: RocketMQ 5's POP consumption, natively (``actors.broker.processor.pop``).

No rebalance and no queue ownership: any number of processes, Ray tasks or actors of a
group call :meth:`SimpleConsumer.receive`, and each message goes to one of them,
invisible to the others for ``invisible_s``. The receiver acks it by its receipt
handle (:meth:`~SimpleConsumer.ack`, :meth:`~SimpleConsumer.ack_many`), or takes more
time (:meth:`~SimpleConsumer.change_invisible_duration`); a message not acked in time
comes again, to whoever receives next, with ``reconsume_times`` + 1, and after the
broker's ``pop_max_reconsume_times`` it goes to ``%DLQ%<group>``.

A receive asks every master broker of the topic at once (each for its share of
``max_msgs``) and returns as soon as one answers with messages; a call still waiting on
another broker is kept, and what it brings is returned by the next receive (it was
made invisible for this consumer; if never received it comes back after its invisible
time). One call per broker per receive, one per broker per :meth:`ack_many`, each
over the broker's own socket (``actors.protocol.data_path``: the records come as stored,
with their receipt handles beside them), or through Ray while a broker's socket cannot
be reached; ``data_path="ray"`` keeps every call on Ray.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from actors.client import instance as _instance
from actors.config.options import check_data_path, check_isolation
from actors.protocol import rpc as _rpc
from actors.protocol.checks import check_number, validate_group
from actors.protocol.names import DEFAULT_NAMESPACE
from actors.protocol.pop import PoppedMessage, check_receive_args
from storage.codec import validate_topic
from storage.errors import (
    BrokerUnavailableError,
    InvalidMessageError,
    InvalidReceiptHandleError,
)
from storage.pop import ReceiptHandle
from storage.subscription import parse_subscription

log = logging.getLogger("raymq.actors.simple_consumer")

__all__ = ["PoppedMessage", "SimpleConsumer"]


class PopClient(_instance.SharedClient):
    """A POP consumer's checked subscription (topic, tag expression, FIFO, its waits) and
    its share of the process's client instance, its calls on the ``READ`` pool: what
    :class:`SimpleConsumer` and the awaited ``actors.aio.AsyncSimpleConsumer`` share."""

    topic: str
    tag_expr: str
    fifo: bool
    wait_s: float
    call_timeout_s: float

    def _join_pop(
        self,
        group: str,
        topic: str,
        tag_expr: str,
        fifo: bool,
        wait_s: float,
        call_timeout_s: float,
        namespace: str,
        nameservers: Sequence[str] | None,
        connection: _instance.ConnectionOptions,
    ) -> None:
        """Check every argument, then join the instance: a bad one changes nothing."""
        validate_group(group)
        self.topic = validate_topic(topic)
        parse_subscription(tag_expr)
        self.tag_expr = tag_expr
        self.fifo = bool(fifo)
        self.wait_s = check_number("wait_s", wait_s)
        self.call_timeout_s = check_number("call_timeout_s", call_timeout_s)
        self._join("simple consumer", group, namespace, nameservers, connection, _instance.READ)

    _closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidMessageError(f"the {type(self).__name__} is closed")

    def _receive_args(
        self, max_msgs: object, invisible_s: object, wait_s: object
    ) -> tuple[int, int, float]:
        """A receive's arguments checked (:func:`check_receive_args`), the consumer open."""
        self._check_open()
        return check_receive_args(max_msgs, invisible_s, wait_s, self.wait_s)

    @staticmethod
    def _shares(count: int, names: Sequence[str]) -> list[tuple[str, int]]:
        """``count`` messages asked of the brokers ``names`` in near-equal shares (the
        first ones one more), those whose share is 0 left out."""
        if not names:
            return []
        n = len(names)
        shares = [(name, count // n + (1 if i < count % n else 0)) for i, name in enumerate(names)]
        return [(name, share) for name, share in shares if share > 0]

    def _readable_brokers(self) -> list[str]:
        """The brokers the topic's route names readable (its cached route)."""
        return self.ns.require_route(self.topic).readable_brokers()

    @staticmethod
    def _handle_of(msg: object) -> str:
        """The receipt handle of a received message; a clear error for anything else."""
        handle = getattr(msg, "receipt_handle", None)
        if not isinstance(handle, str):
            raise InvalidMessageError(f"{msg!r:.80}: not a received message (no receipt handle)")
        return handle


class SimpleConsumer(PopClient):
    """Receive, ack and change the invisible duration of messages of one topic for
    ``group``. ``tag_expr``: ``"*"`` or ``"TagA || TagB"``; ``fifo``: at most one batch
    in flight per queue, so a queue's messages are received in order."""

    def __init__(
        self,
        group: str,
        topic: str,
        tag_expr: str = "*",
        *,
        fifo: bool = False,
        wait_s: float = 5.0,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        route_refresh_s: float = 30.0,
        call_timeout_s: float = 10.0,
        data_path: str = "socket",
        data_tls_ca: str | None = None,
        isolation: str = "read_committed",
    ) -> None:
        check_isolation("SimpleConsumer", isolation)  # before anything is made
        check_data_path("SimpleConsumer", data_path)
        self._join_pop(
            group,
            topic,
            tag_expr,
            fifo,
            wait_s,
            call_timeout_s,
            namespace,
            nameservers,
            _instance.Connection(data_path, data_tls_ca, route_refresh_s),
        )
        # broker name -> (pop call: a socket's PendingCall or an ObjectRef, its share)
        self._pending: dict[str, tuple[Any, int]] = {}
        self._buffer: list[PoppedMessage] = []  # received beyond a receive's max_msgs
        self._turn = 0

    # ------------------------------------------------------------ brokers
    def _broker(self, name: str, refresh: bool = False) -> Any:
        route = self.ns.require_route(self.topic, refresh=refresh)
        return self.ns.broker(route, name)

    def _forget(self, name: str) -> None:
        self.ns.forget_topic_broker(self.topic, name)

    # ------------------------------------------------------------ receive
    def receive(
        self, max_msgs: int = 16, invisible_s: float = 30.0, wait_s: float | None = None
    ) -> list[PoppedMessage]:
        """Up to ``max_msgs`` messages, each invisible to the group for ``invisible_s``
        unless acked; waits up to ``wait_s`` (the consumer's default) for one."""
        max_msgs, invisible_ms, wait = self._receive_args(max_msgs, invisible_s, wait_s)
        if self._buffer:  # received for an earlier call beyond its max_msgs
            got, self._buffer = self._buffer[:max_msgs], self._buffer[max_msgs:]
            return got
        deadline = time.monotonic() + wait
        while True:
            self._start_pops(
                max_msgs, invisible_ms, int(max(0.0, deadline - time.monotonic()) * 1000)
            )
            if not self._pending:  # no broker could be asked: not a busy loop
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            got = self._collect(max(0.0, deadline - time.monotonic()) + self.call_timeout_s)
            if not got and time.monotonic() >= deadline:
                # nothing came: the calls still out end about now (their waits end with
                # ours), so take their answers rather than leave messages invisible
                got = self._collect(self.call_timeout_s, every=True)
            if got or time.monotonic() >= deadline:
                got, self._buffer = got[:max_msgs], got[max_msgs:]
                return got

    def _start_pops(self, max_msgs: int, invisible_ms: int, wait_ms: int) -> None:
        names = self._readable_brokers()
        free = [n for n in names if n not in self._pending]
        room = max_msgs - sum(share for _, share in self._pending.values())
        if not free or room <= 0:
            return
        self._turn += 1
        start = self._turn % len(free)
        for name, share in self._shares(room, free[start:] + free[:start]):
            try:
                ref = self._broker(name).pop.remote(
                    self.group,
                    self.topic,
                    share,
                    invisible_ms,
                    wait_ms,
                    fifo=self.fifo,
                    tag_expr=self.tag_expr,
                    client_id=self.client_id,
                )
            except BrokerUnavailableError as exc:
                log.warning("receive: broker %s unavailable: %s", name, exc)
                self._forget(name)
                continue
            self._pending[name] = (ref, share)

    def _collect(self, timeout: float, every: bool = False) -> list[PoppedMessage]:
        """The messages of the pop calls answered: waits for the first (``every``: for
        all), takes whatever else is answered by then, keeps the others for the next
        receive."""
        if not self._pending:
            return []
        futures = {ref.future(): name for name, (ref, _) in self._pending.items()}
        concurrent.futures.wait(
            futures,
            timeout=timeout,
            return_when=(
                concurrent.futures.ALL_COMPLETED if every else concurrent.futures.FIRST_COMPLETED
            ),
        )
        out: list[PoppedMessage] = []
        for fut, name in futures.items():
            if not fut.done():
                continue
            ref, _ = self._pending.pop(name)
            try:
                out.extend(_rpc.get(ref, self.call_timeout_s))
            except Exception as exc:
                if not _rpc.is_retriable(exc) and not isinstance(exc, BrokerUnavailableError):
                    raise
                log.warning("receive: broker %s failed (%s): trying it again", name, exc)
                self._forget(name)
        return out

    # ------------------------------------------------------------ ack, change
    def _on_broker(self, handle: str, method: str, *args: Any) -> Any:
        """``method`` on the master of the broker that handed out ``handle``: retried
        while it restarts or fails over, up to ``call_timeout_s``."""
        name = ReceiptHandle.parse(handle).broker
        deadline = time.monotonic() + self.call_timeout_s
        delay = 0.05
        while True:
            try:
                broker = self._broker(name)
                return _rpc.get(
                    getattr(broker, method).remote(self.group, self.topic, *args),
                    self.call_timeout_s,
                )
            except Exception as exc:
                if not _rpc.is_retriable(exc) and not isinstance(exc, BrokerUnavailableError):
                    raise
                if time.monotonic() + delay > deadline:
                    raise BrokerUnavailableError(
                        f"broker {name!r} did not take {method} in {self.call_timeout_s} s: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                self._forget(name)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def ack(self, msg: PoppedMessage) -> None:
        """Done with ``msg``: it is not delivered again."""
        self._check_open()
        self._on_broker(self._handle_of(msg), "ack_message", self._handle_of(msg))

    def ack_many(self, msgs: Iterable[PoppedMessage]) -> None:
        """:meth:`ack` of many messages, one call per broker; raises after acking all it
        could when some were refused (expired, superseded), naming them."""
        self._check_open()
        by_broker: dict[str, list[str]] = {}
        for m in msgs:
            h = self._handle_of(m)
            by_broker.setdefault(ReceiptHandle.parse(h).broker, []).append(h)
        refused: list[str] = []
        for handles in by_broker.values():
            answers = self._on_broker(handles[0], "ack_message", handles)
            refused.extend(f"{h}: {why}" for h, why in zip(handles, answers) if why)
        if refused:
            raise InvalidReceiptHandleError(
                f"{len(refused)} ack(s) refused: " + "; ".join(refused[:5])
            )

    def change_invisible_duration(self, msg: PoppedMessage, invisible_s: float) -> PoppedMessage:
        """Make ``msg`` invisible for ``invisible_s`` from now; returns it with its new
        receipt handle (the old one is refused from now on)."""
        self._check_open()
        invisible_ms = int(check_number("invisible_s", invisible_s) * 1000)
        h = self._handle_of(msg)
        new = self._on_broker(h, "change_invisible_duration", h, invisible_ms)
        msg.receipt_handle = new
        return msg

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop receiving; messages received and not acked come back after their
        invisible time (and those of receives still waiting, which are dropped)."""
        self._closed = True
        self._pending.clear()
        self._buffer.clear()
        self._leave()

    def __enter__(self) -> SimpleConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
