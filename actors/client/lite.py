"""Lite topics from Python: :class:`LiteProducer` and :class:`LiteConsumer`.

A lite topic lives on one master broker of its parent topic: the one at
``crc32(name) % n`` of the parent's writable master brokers, sorted by name, so every
producer and consumer finds it at the same place while the parent's brokers stay the
same. Calls go over the broker's socket as a normal send or pull does (the lite
requests of ``actors.protocol.requests.lite``, served by
``actors.broker.lite.processor``); ``data_path="ray"`` makes them Ray calls to the
broker's ``lite_*`` methods instead.

Within a consumer group a lite topic is consumed by one consumer at a time (the first
subscriber; another takes over when it unsubscribes, closes or falls silent). A
consumer acks a lite topic up to an offset; the group resumes from there, and
:meth:`LiteConsumer.pull` reads a lite topic from any offset the caller kept.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import ray

from actors.client import instance as _instance
from actors.client import lite_core as core
from actors.client.lite_core import LiteBatch, home_broker, send_item_topic
from actors.protocol import rpc
from actors.protocol.names import DEFAULT_NAMESPACE

log = logging.getLogger("raymq.actors.client.lite")

__all__ = ["LiteBatch", "LiteConsumer", "LiteProducer", "home_broker", "send_item_topic"]


def _wait_first(calls: Sequence[Any], timeout: float) -> list[Any]:
    """Those of ``calls`` answered, once at least one is (at most ``timeout`` s)."""
    if all(isinstance(c, rpc.PendingCall) for c in calls):
        concurrent.futures.wait(
            [c.future() for c in calls], timeout, concurrent.futures.FIRST_COMPLETED
        )
        return [c for c in calls if c.done()]
    if not any(isinstance(c, rpc.PendingCall) for c in calls):
        return list(ray.wait(list(calls), num_returns=1, timeout=timeout)[0])
    return rpc.wait(calls, timeout)[0]  # mixed paths: all of them


def _path(data_path: str) -> _instance.Connection:
    """The client's connection: ``data_path`` checked."""
    if data_path not in ("socket", "ray"):
        raise ValueError(f"data_path={data_path!r}: 'socket' or 'ray'")
    return _instance.Connection(data_path=data_path)


_C = TypeVar("_C", bound="_LiteCalls")


class _LiteCalls(core.LiteClientCore):
    """The calls of a threaded lite client: each over the broker's socket, or through Ray
    with ``data_path="ray"``; the caller's thread waits for them."""

    def _route(self) -> Any:
        return self.ns.require_route(self.parent)

    def _home(self, lite_topic: str) -> str:
        return self.home(self._route(), lite_topic)

    def _start(self, route: Any, call: core.LiteCall) -> Any:
        return getattr(self.ns.broker(route, call.broker), call.method).remote(*call.args)

    def _run(self, calls: Sequence[core.LiteCall]) -> list[Any]:
        """``calls`` all at once; their answers in order, once all came."""
        route = self._route()
        wait_s = max((c.wait_s for c in calls), default=0.0)
        try:
            return list(
                rpc.get([self._start(route, c) for c in calls], self.call_timeout_s + wait_s)
            )
        except ray.exceptions.RayActorError:
            for call in calls:
                self.ns.forget_topic_broker(self.parent, call.broker)
            raise

    def close(self) -> None:
        self._release()

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LiteProducer(_LiteCalls, core.LiteProducerCore):
    """Sends to lite topics of ``parent`` (a topic created with type LITE)."""

    def __init__(
        self,
        parent: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        call_timeout_s: float = 10.0,
        data_path: str = "socket",
    ) -> None:
        super().__init__(parent, namespace, nameservers, call_timeout_s, _path(data_path))

    def send(
        self,
        lite_topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: Sequence[str] | str = (),
        properties: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Send one message; ``{"lite_topic", "offset", "msg_id"}``."""
        return self.send_batch([core.send_item(lite_topic, body, tags, keys, properties)])[0]

    def send_batch(
        self, items: Iterable[tuple[str, bytes] | tuple[str, bytes, dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """Send ``(lite topic, body)`` or ``(lite topic, body, {"tags", "keys",
        "properties"})`` items, one call per broker (all at once); the results in the
        items' order. Names are checked before anything is sent."""
        plan = core.LiteSendPlan(self.parent, self._route(), items)
        return plan.results(self._run(plan.calls))


class LiteConsumer(_LiteCalls, core.LiteConsumerCore):
    """Consumes lite topics of ``parent`` for ``group``: subscribe and unsubscribe at
    any time, receive from the lite topics this consumer owns, ack, or pull from an
    offset."""

    def __init__(
        self,
        group: str,
        parent: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        call_timeout_s: float = 10.0,
        resync_s: float = 10.0,
        data_path: str = "socket",
    ) -> None:
        super().__init__(
            group, parent, namespace, nameservers, call_timeout_s, resync_s, _path(data_path)
        )

    def subscribe(self, *lite_topics: str) -> list[str]:
        """Subscribe these lite topics (created if new); the lite topics this consumer
        owns among all it subscribes."""
        return self._change(lite_topics, "add")

    def unsubscribe(self, *lite_topics: str) -> list[str]:
        return self._change(lite_topics, "remove")

    def _change(self, lite_topics: Iterable[str], action: str) -> list[str]:
        names, calls = self.change_calls(self._route(), lite_topics, action)
        self.changed(names, action, self._run(calls))
        return self.owned()

    def owned(self) -> list[str]:
        """The subscribed lite topics this consumer consumes now (renews its claim)."""
        return self.owned_of(self._run(self.renew_calls(self._route())))

    def receive(self, max_count: int = 32, wait_s: float = 0.0) -> list[LiteBatch]:
        """Messages of the owned lite topics from where the group stands, per topic.
        With none, the call is held up to ``wait_s`` for a send to one of them: on one
        broker, by that broker; on several, each is asked at once whether it has any
        (held there) and the first that has is received from. Every ``resync_s`` it
        first sends its whole subscription again (a broker started anew knows none)."""
        wait_ms = core.wait_ms_of(wait_s)
        if again := self.resync_due():
            self._change(again, "keep")
        brokers = self.subscribed_brokers(self._route())
        if len(brokers) > 1 and wait_ms:
            got = self._receive(brokers, max_count, 0)
            if got:
                return got
            ready = self._first_with_messages(brokers, wait_ms)
            return self._receive(ready, max_count, 0) if ready else []
        return self._receive(brokers, max_count, wait_ms)

    def _receive(self, brokers: Sequence[str], max_count: int, wait_ms: int) -> list[LiteBatch]:
        return self.batches(self._run(self.receive_calls(brokers, max_count, wait_ms)))

    def _first_with_messages(self, brokers: Sequence[str], wait_ms: int) -> list[str]:
        """The brokers that have messages for this consumer, as soon as one has: each is
        asked at once with a held peek (nothing handed out, so the peeks still held
        when one answers are left to time out at their brokers). None within
        ``wait_ms``: []."""
        route = self._route()
        peeks = self.receive_calls(brokers, 0, wait_ms, peek=True)
        calls = {self._start(route, peek): peek.broker for peek in peeks}
        pending = list(calls)
        deadline = time.monotonic() + wait_ms / 1000 + self.call_timeout_s
        ready: list[str] = []
        while pending and not ready:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            done = _wait_first(pending, left)
            for call in done:
                pending.remove(call)
                try:
                    if rpc.get([call], timeout=0)[0]:
                        ready.append(calls[call])
                except Exception as exc:  # noqa: BLE001 - the receive that follows tells
                    log.debug("lite peek on %s failed: %s", calls[call], exc)
        return sorted(ready)

    def ack(self, batch_or_topic: LiteBatch | str, next_offset: int | None = None) -> None:
        """Commit a lite topic for the group up to ``next_offset`` (a batch: its
        ``next_offset``)."""
        self._run([self.ack_call(self._route(), batch_or_topic, next_offset)])

    def pull(
        self, lite_topic: str, offset: int, max_count: int = 32, wait_s: float = 0.0
    ) -> LiteBatch:
        """``lite_topic`` from ``offset`` (a resume from where the caller stood); with
        nothing there yet the broker holds the call up to ``wait_s`` for a send to it."""
        call = self.pull_call(self._route(), lite_topic, offset, max_count, wait_s)
        return self.pulled(lite_topic, offset, self._run([call])[0])

    def committed_offset(self, lite_topic: str) -> int:
        return int(self._run([self.committed_call(self._route(), lite_topic)])[0])

    def close(self) -> None:
        if not self.closed and self._subscribed:
            try:  # the lite topics pass to the group's other consumers at once
                self._change(self.subscription(), "remove")
            except Exception:  # noqa: BLE001 - they pass on anyway when its claim lapses
                log.warning("lite consumer %s: unsubscribe at close failed", self.client_id)
        super().close()
