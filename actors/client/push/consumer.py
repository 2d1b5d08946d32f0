"""The PushConsumer: register a listener; the client pulls, threads, commits and retries.

    def listener(messages: list[MessageExt]) -> ConsumeStatus:
        ...
        return ConsumeStatus.SUCCESS

    consumer = PushConsumer("my-group", "Orders", "TagA || TagB", listener=listener)
    consumer.start()
    ...
    consumer.shutdown()   # commits offsets and leaves the group

Usable from a driver, a Ray task or a Ray actor (it runs its own threads).
Parts, each in its own module: :mod:`.coordinated` (which queues this
consumer owns, as the group's ``GroupCoordinator`` hands them out; the
uncoordinated way is :mod:`.rebalance`), :mod:`.pull_service` (long-polling pulls,
flow control; with ``delivery="stream"`` :mod:`.stream_service`, a subscription per
broker), :mod:`.consume_concurrently` (the listener's thread pool, per-queue
order, outcomes), :mod:`.consume_orderly` (``orderly=True``: one batch per queue at
a time, failures retried in place, RocketMQ's ``MessageListenerOrderly``),
:mod:`.send_back` (failed messages back to the broker, batched),
:mod:`.offset_store` (offsets on the brokers or in a local file). This class wires
them: each gets the consumer as the small protocol of :mod:`.context` it needs,
so none of them imports this module back.

Delivery is at least once: a message is redelivered when its consumer dies
before committing it or when queues move between consumers.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from actors.client import instance as _instance
from actors.client.instance import ClientView
from actors.client.push.config import (
    Listener,
    MessageModel,
    PushConsumerConfig,
)
from actors.client.push.consume_concurrently import ConsumeMessageService
from actors.client.push.consume_orderly import ConsumeMessageOrderlyService
from actors.client.push.coordinated import CoordinatedRebalanceService
from actors.client.push.offset_store import (
    LocalFileOffsetStore,
    OffsetStore,
    RemoteBrokerOffsetStore,
)
from actors.client.push.process_queue import ProcessQueue
from actors.client.push.pull_service import PullMessageService
from actors.client.push.rebalance import RebalanceService
from actors.client.push.send_back import SendBackService
from actors.client.push.stream_service import StreamService
from actors.client.push.timer import Counters, Scheduler
from actors.config.options import with_options
from actors.coordinator.strategies import client_id_with_room
from actors.protocol import rpc as _rpc
from actors.protocol.names import DEFAULT_NAMESPACE
from actors.protocol.topic import retry_topic
from rebalance import MessageQueue
from storage.codec import validate_topic
from storage.errors import InvalidConfigError, InvalidMessageError, RayMQError
from storage.subscription import parse_subscription

log = logging.getLogger("raymq.actors.push_consumer")

CALL_TIMEOUT_S = 10.0
SERVICE_TICK_S = 0.05

__all__ = ["PushConsumer"]


class PushConsumer:
    """Consumes ``topic`` (tags ``subscription``) for ``group`` by calling ``listener``.

    Options are :class:`PushConsumerConfig` fields (``model``, ``consume_from``,
    ``consume_threads``, ``consume_batch_size``, ``pull_batch_size``,
    ``pull_threshold_for_queue``, ``max_reconsume_times``, intervals ...).
    """

    def __init__(
        self,
        group: str,
        topic: str,
        subscription: str = "*",
        listener: Listener | None = None,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        config: PushConsumerConfig | None = None,
        actor_handle: Any = None,
        **options: Any,
    ) -> None:
        from actors.namesrv.client import discover_nameservers

        if actor_handle is not None and not hasattr(actor_handle, "wait_closed"):
            raise InvalidConfigError(
                "actor_handle: the hosting actor needs a wait_closed() method that returns "
                "when this consumer shuts down (e.g. `return self.consumer.wait_closed()`)"
            )
        # the actor hosting this consumer: the group's coordinator keeps a wait_closed()
        # call pending on it and drops this consumer the moment Ray reports it dead
        self.actor_handle = actor_handle
        self._closed_event = threading.Event()

        if not isinstance(group, str) or not group:
            raise InvalidMessageError(f"consumer group={group!r}: must be a non-empty str")
        retry_topic(group)  # the group must make valid %RETRY%/%DLQ% topic names
        self.group = group
        self.topic = validate_topic(topic)
        self.config = with_options(config or PushConsumerConfig(), options)
        self.namespace = namespace
        self.listener: Listener | None = listener
        # a room in the id: the members of an uncoordinated group read each other's there
        self.client_id = client_id_with_room(
            f"{socket.gethostname()}@{os.getpid()}@{self.config.instance_name}@"
            f"{uuid.uuid4().hex[:8]}",
            self.config.machine_room,
        )
        self._subscriptions: dict[str, tuple[str, frozenset[str] | None]] = {}
        self.subscribe(topic, subscription)
        self._nameservers = list(nameservers) if nameservers else None
        self._discover = discover_nameservers
        self.ns: ClientView
        self.stats = Counters()
        self._table: dict[MessageQueue, ProcessQueue] = {}
        self._table_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._started = False
        self._closed = False
        self._stop = threading.Event()
        self._rebalance_now = threading.Event()
        self._heartbeat_refs: list[Any] = []
        self._heartbeat_lock = threading.Lock()
        self._beat_key = ("push-consumer", self.client_id)
        self._retry_topic_on: set[str] = set()

    # ------------------------------------------------------------ setup
    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Also consume ``topic`` (before :meth:`start`); ``expression`` is ``"*"`` or
        ``"TagA || TagB"``."""
        if getattr(self, "_started", False):
            raise RayMQError("subscribe before start()")
        validate_topic(topic)
        if not isinstance(expression, str):
            raise InvalidMessageError(f"subscription={expression!r}: must be a str")
        self._subscriptions[topic] = (expression, parse_subscription(expression))

    def register_listener(self, listener: Listener) -> None:
        if not callable(listener):
            raise InvalidConfigError(f"listener={listener!r}: must be callable")
        self.listener = listener

    def start(self) -> PushConsumer:
        """Join the group, take queues and start consuming; returns self."""
        with self._state_lock:
            if self._started:
                raise RayMQError(f"consumer {self.client_id} was already started")
            if not callable(self.listener):
                raise InvalidConfigError(
                    f"listener={self.listener!r}: register a callable before start()"
                )
            self._lease = _instance.share(
                self,
                self.namespace,
                self._nameservers or self._discover(self.namespace),
                data_path=self.config.data_path,
                tls_ca=self.config.data_tls_ca,
                route_ttl_s=self.config.route_refresh_s,
                kind=_instance.READ,
            )
            self.instance = self._lease.instance
            self.ns = self._lease.view
            self._data_path = self.ns.data_path
            if self.config.clustering:
                self._subscriptions.setdefault(retry_topic(self.group), ("*", None))
                self.offset_store: OffsetStore = RemoteBrokerOffsetStore(
                    self.ns, self.group, self.client_id
                )
            else:
                self.offset_store = LocalFileOffsetStore(
                    self.config.offset_store_dir, self.group, self.config.instance_name
                )
            self.scheduler = Scheduler(f"raymq-timer-{self.group}")
            self.consume = (
                ConsumeMessageOrderlyService(self)
                if self.config.orderly
                else ConsumeMessageService(self)
            )
            self.send_back = SendBackService(self)
            self.pull: PullMessageService | StreamService = (
                StreamService(self)
                if self.config.deliver_by == "stream"
                else PullMessageService(self)
            )
            self.rebalancer: RebalanceService | CoordinatedRebalanceService = (
                CoordinatedRebalanceService(self)
                if self.config.clustering and self.config.coordinated
                else RebalanceService(self)
            )
            if isinstance(self.rebalancer, RebalanceService) and isinstance(
                self.offset_store, RemoteBrokerOffsetStore
            ):
                # a refused commit: the group's offsets were reset, take the queues again
                self.offset_store.use_tokens()
                self.offset_store.on_fenced = self.rebalance_now
            self._started = True
        try:
            self.pull.start()
            self.send_back.start()
            self.heartbeat(wait=True)
            # the instance's heartbeat thread beats for every client of the process
            self.instance.register(self._beat_key, self.heartbeat, self.config.heartbeat_interval_s)
            self.rebalancer.rebalance()
        except BaseException:
            self.shutdown()
            raise
        self._service = threading.Thread(
            target=self._service_loop, name=f"raymq-push-{self.group}", daemon=True
        )
        self._service.start()
        log.info(
            "push consumer %s started: group %s, %s, topics %s",
            self.client_id,
            self.group,
            self.config.model.value if isinstance(self.config.model, MessageModel) else "",
            sorted(self._subscriptions),
        )
        return self

    def __enter__(self) -> PushConsumer:
        return self if self._started else self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------ what services share
    def topics(self) -> list[str]:
        return list(self._subscriptions)

    def subscription_of(self, topic: str) -> tuple[str, frozenset[str] | None]:
        return self._subscriptions.get(topic, ("*", None))

    def process_queues(self) -> list[ProcessQueue]:
        with self._table_lock:
            return list(self._table.values())

    def table_items(self) -> list[tuple[MessageQueue, ProcessQueue]]:
        with self._table_lock:
            return list(self._table.items())

    def table_put(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        with self._table_lock:
            self._table[mq] = pq

    def table_remove(self, mq: MessageQueue) -> None:
        with self._table_lock:
            self._table.pop(mq, None)

    def broker_for(self, mq: MessageQueue) -> Any:
        """The master broker actor holding ``mq`` (route cached)."""
        route = self.ns.require_route(mq.topic)
        if route.broker(mq.broker_name) is None:
            route = self.ns.require_route(mq.topic, refresh=True)
        return self.ns.broker(route, mq.broker_name)

    def cached_broker_for(self, mq: MessageQueue) -> Any | None:
        return self.ns.cached_broker(mq.topic, mq.broker_name)

    def forget_route(self, topic: str, broker_name: str | None = None) -> None:
        """After a failed call: re-read the route, and drop a broker's cached handle
        (a broker actor created anew under its name needs a new one)."""
        if broker_name is not None:
            self.ns.forget_topic_broker(topic, broker_name)
        else:
            self.ns.invalidate(topic)

    # ------------------------------------------------------------ group membership
    def heartbeat(self, wait: bool = False) -> None:
        """Tell every live master broker this consumer is in the group (creating the
        group's retry topic where it is missing)."""
        with self._heartbeat_lock:  # the instance's heartbeat thread, or a rebalance
            self._heartbeat_once(wait)

    def _heartbeat_once(self, wait: bool) -> None:
        pending, self._heartbeat_refs = self._heartbeat_refs, []
        for ref in pending:  # report last round's failures
            try:
                _rpc.get(ref, 0.001)
            except Exception as exc:  # noqa: BLE001
                log.debug("group %s: heartbeat failed: %s", self.group, exc)
        try:
            brokers = self.ns.master_brokers()
        except Exception as exc:  # noqa: BLE001 - NameServers down: try next round
            log.warning("group %s: no broker list for the heartbeat: %s", self.group, exc)
            return
        topics = self.topics()
        refs = []
        for name, handle in brokers.items():
            refs.append(
                handle.heartbeat.remote(
                    self.group, self.client_id, topics, self.config.session_timeout
                )
            )
            if self.config.clustering and name not in self._retry_topic_on:
                refs.append(handle.create_retry_topic.remote(self.group))
                self._retry_topic_on.add(name)
        if wait:
            for ref in refs:
                try:
                    _rpc.get(ref, CALL_TIMEOUT_S)
                except Exception as exc:  # noqa: BLE001 - the next heartbeat tries again
                    log.warning("group %s: heartbeat failed: %s", self.group, exc)
        else:
            self._heartbeat_refs = refs

    def _unregister(self) -> None:
        try:
            brokers = self.ns.master_brokers()
        except Exception as exc:  # noqa: BLE001 - brokers expire us after channel_expired_s
            log.warning("group %s: could not leave the group cleanly: %s", self.group, exc)
            return
        refs = [h.unregister_consumer.remote(self.group, self.client_id) for h in brokers.values()]
        for ref in refs:
            try:
                _rpc.get(ref, CALL_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001
                log.warning("group %s: unregister failed: %s", self.group, exc)

    def rebalance_now(self) -> None:
        """Recompute the assignment on the next service tick (rather than waiting)."""
        self._rebalance_now.set()

    # ------------------------------------------------------------ the service loop
    def _service_loop(self) -> None:
        cfg = self.config
        now = time.monotonic()
        next_rebalance = now + cfg.rebalance_interval_s
        next_persist = now + cfg.persist_offset_interval_s
        while not self._stop.wait(SERVICE_TICK_S):
            now = time.monotonic()
            try:
                if now >= next_rebalance or self._rebalance_now.is_set():
                    self._rebalance_now.clear()
                    next_rebalance = now + cfg.rebalance_interval_s
                    self.rebalancer.rebalance()
                if now >= next_persist:
                    next_persist = now + cfg.persist_offset_interval_s
                    self.persist_offsets(wait=False)
                self.consume.check_timeouts(now)
                self.pull.check_stuck(now)
            except Exception:  # noqa: BLE001 - the loop must survive a bad round
                log.exception("group %s: service round failed", self.group)

    def persist_offsets(self, wait: bool = True) -> dict[MessageQueue, int]:
        """Commit every owned queue's lowest unconsumed offset now."""
        grants = self.offset_store.grants()  # before the table is read: see the store
        offsets = {pq.mq: pq.commit_offset() for pq in self.process_queues() if not pq.dropped}
        if offsets:
            self.offset_store.commit(offsets, wait=wait, grants=grants)
            self.stats.add("commit_rounds")
        return offsets

    # ------------------------------------------------------------ introspection
    def assigned_queues(self, topic: str | None = None) -> list[MessageQueue]:
        """The queues this consumer owns now (of ``topic``, or of every subscription)."""
        return sorted(mq for mq in list(self._table) if topic is None or mq.topic == topic)

    def status(self) -> dict[str, Any]:
        """Counters (pulled, consumed, reconsume_later, sent_back ...) and buffers."""
        queues = self.process_queues()
        return {
            "client_id": self.client_id,
            "group": self.group,
            "model": self.config.model.value if isinstance(self.config.model, MessageModel) else "",
            "queues": len(queues),
            "buffered": sum(pq.buffered for pq in queues),
            **self.stats.snapshot(),
        }

    # ------------------------------------------------------------ stop
    def shutdown(self) -> None:
        """Stop pulling, let running listener calls finish (up to
        ``shutdown_timeout_s``), send back what failed, commit offsets and leave the
        group so the others take over at once."""
        with self._state_lock:
            if not self._started or self._closed:
                self._closed = True
                self._closed_event.set()
                return
            self._closed = True
        self._stop.set()
        self.instance.unregister(self._beat_key)
        service = getattr(self, "_service", None)
        if service is not None:
            service.join(timeout=CALL_TIMEOUT_S)
        self.rebalancer.stop()  # no queue comes or goes from here on
        self.pull.stop()
        self.consume.shutdown(self.config.shutdown_timeout_s)
        self.send_back.stop(CALL_TIMEOUT_S)
        try:
            self.persist_offsets(wait=True)
        except Exception as exc:  # noqa: BLE001 - at least once: others re-read
            log.warning("group %s: final offset commit failed: %s", self.group, exc)
        for pq in self.process_queues():
            with pq.lock:
                pq.dropped = True
        self.rebalancer.leave()  # coordinated: commit, hand every queue over, leave
        if self.config.clustering:
            self._unregister()
        self.offset_store.close()
        self.scheduler.stop()
        self._lease.release()
        self._closed_event.set()
        log.info("push consumer %s shut down: %s", self.client_id, self.stats.snapshot())

    def wait_closed(self, timeout: float | None = None) -> bool:
        """Block until :meth:`shutdown` is done (True) or ``timeout`` passes (False).

        An actor hosting a consumer passes ``actor_handle=`` (its own handle) and
        forwards a ``wait_closed`` method here, so the group's coordinator can keep a
        call pending on it and learn from Ray at once when the actor dies::

            @ray.remote(max_concurrency=4)  # wait_closed holds one thread
            class Host:
                def __init__(self):
                    me = ray.get_runtime_context().current_actor
                    self.consumer = PushConsumer(..., actor_handle=me).start()

                def wait_closed(self):
                    return self.consumer.wait_closed()

        (An async actor: ``await asyncio.to_thread(self.consumer.wait_closed)``.)
        """
        return self._closed_event.wait(timeout)

    def __del__(self) -> None:
        if getattr(self, "_started", False) and not getattr(self, "_closed", True):
            log.warning("push consumer %s was not shut down", getattr(self, "client_id", "?"))
