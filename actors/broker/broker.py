"""The Broker actor: one ``storage.MessageStore`` on its node's disk, served over Ray.

A thin shell, as RocketMQ's ``BrokerController`` is: it wires the broker's parts
and hands each call to the processor of its family, so that the Ray methods, and
later a socket listener and a gRPC gateway, are doors onto the same processors:

* :class:`~actors.broker.processor.send.SendMessageProcessor`: sends and consumer send-back;
* :class:`~actors.broker.processor.pull.PullMessageProcessor`: pulls, held while nothing is new;
* :class:`~actors.broker.processor.consumer_manage.ConsumerManageProcessor`: offsets, fences,
  members, lag;
* :class:`~actors.broker.processor.admin.AdminBrokerProcessor`: topics, lookups, status;
* :class:`~actors.broker.processor.end_transaction.EndTransactionProcessor`: ends of
  transactions, over the half and op topics
  (:class:`~actors.broker.transaction.bridge.TransactionalMessageBridge`);
* :class:`~actors.broker.transaction.check_service.TransactionalMessageCheckService`:
  checks of old half messages with the producers of
  :class:`~actors.broker.client.producer_manager.ProducerManager`;
* :class:`~actors.broker.transaction.one_phase.OnePhaseCommits`: transactions one
  broker commits alone;
* :class:`~actors.broker.processor.pop.PopProcessor`: POP receive, ack and change of invisible
  time by receipt handle (RocketMQ 5's SimpleConsumer);
* the role in its group (``actors.broker.ha``) and the NameServer registration
  (``actors.broker.out.registration``).

An async actor. Store calls that block (puts, SYNC_FLUSH, reads) run in a thread
pool so a held pull or a slow fsync never stalls the event loop.

The actor is created pinned to a node (``NodeAffinitySchedulingStrategy``,
``soft=False``) with ``max_restarts``; when Ray restarts it, ``__init__`` runs
again, the store recovers from its directory, and the broker registers anew
with every NameServer under a new incarnation. Cut off from the cluster, it fences
itself (``actors.broker.lease``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from actors.broker.client.producer_ids import ProducerIdAllocator
from actors.broker.client.producer_manager import ProducerManager
from actors.broker.ha import create_replication
from actors.broker.ha.ha_service import HAService
from actors.broker.lease import ClusterLease
from actors.broker.listener import DataPathListener
from actors.broker.lite.consumers import LiteConsumers
from actors.broker.lite.parents import LiteParents
from actors.broker.lite.processor import LiteProcessor
from actors.broker.memory import retain_freed_memory
from actors.broker.metrics import BrokerMetrics, BrokerMetricsService
from actors.broker.out.registration import Registration
from actors.broker.priority import take_priority
from actors.broker.processor.admin import AdminBrokerProcessor
from actors.broker.processor.consumer_manage import ConsumerManageProcessor
from actors.broker.processor.end_transaction import EndTransactionProcessor
from actors.broker.processor.pop import PopProcessor
from actors.broker.processor.pull import PullMessageProcessor
from actors.broker.processor.send import SendMessageProcessor
from actors.broker.processor.subscribe import SubscribeProcessor
from actors.broker.runtime import BrokerRuntime
from actors.broker.transaction.bridge import TransactionalMessageBridge
from actors.broker.transaction.check_service import TransactionalMessageCheckService
from actors.broker.transaction.one_phase import OnePhaseCommits
from actors.config.broker import BrokerConfig
from actors.protocol import checks, requests
from actors.protocol.shared_ring import RingId
from storage.lite import LiteConfig

log = logging.getLogger("raymq.actors.broker.broker")

GRPC_BIND_RETRY_S = 1.0
"""How often a broker whose configured ``grpc_port`` was held tries it again."""


def _served_by(processor: str, method: Callable[..., Awaitable[Any]], doc: str = "") -> Any:
    """A Ray method that is ``method`` of the processor the Broker holds as ``processor``:
    its signature, its docstring (or ``doc``) and its answer, stated once, in the
    processor (the data path's requests reach the same coroutines,
    ``actors.protocol.requests``)."""
    name = method.__name__

    @functools.wraps(method)
    async def ray_method(self: Broker, *args: Any, **kwargs: Any) -> Any:
        return await getattr(getattr(self, processor), name)(*args, **kwargs)

    if doc:
        ray_method.__doc__ = doc
    return ray_method


class Broker:
    """Ray actor class (created by :func:`actors.start_cluster` as ``<broker name>-<id>``)."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        retain_freed_memory(config.malloc_trim_threshold)  # before the store allocates
        take_priority(config.process_nice, f"broker {config.actor_name}")  # not Ray's 15
        loop = asyncio.get_event_loop()  # an async actor runs __init__ in its loop
        self.rt = rt = BrokerRuntime(config, loop)
        self._closed = asyncio.Event()
        self.metrics: BrokerMetrics | None = None  # raymq_* metrics (actors/broker/metrics.py)
        self._metrics_service: BrokerMetricsService | None = None
        if config.metrics_enable:
            self._metrics_service = BrokerMetricsService(
                rt, config.metrics_export_interval_s, config.metrics_lag_interval_s
            )
            self.metrics = self._metrics_service.metrics
            self._metrics_service.start(loop)
        self.ha = create_replication(rt)  # its role in the group: actors/broker/ha
        if self._metrics_service is not None:  # the failovers gauge reads the role's epoch
            self._metrics_service.role_status = self.ha.status
        self.registration = Registration(rt, self.ha)
        rt.register_all = self.registration.register_all
        self.lease = ClusterLease(rt, self._leave)
        self.sender = SendMessageProcessor(rt, self.ha, self.metrics)
        self.puller = PullMessageProcessor(rt, self.ha, self.metrics)
        self.subscriber = SubscribeProcessor(rt, self.ha, self.metrics)  # socket streams
        self.groups = ConsumerManageProcessor(rt, self.ha)
        self.admin = AdminBrokerProcessor(rt, self.ha)
        self.producers = ProducerManager(config.channel_expired_s)
        self.txn_bridge = TransactionalMessageBridge(rt, self.ha)
        self.end_txn = EndTransactionProcessor(rt, self.txn_bridge, self.groups)
        self.txn_check = TransactionalMessageCheckService(
            rt, self.txn_bridge, self.producers, self.end_txn.end_halves
        )
        self.one_phase = OnePhaseCommits(rt, self.ha)
        self.one_phase.attach(self.groups)
        self.popper = PopProcessor(rt, self.ha)
        lite_config = LiteConfig(expire_interval_ms=config.lite_expire_interval_ms)
        self.lite = LiteProcessor(rt, self.ha, self.admin, lite_config)  # lite topics
        self.lite_parents = self.lite.parents  # LITE parents and their listings
        self.lite_consumers = self.lite.consumers  # subscriptions and acks
        self.producer_ids = ProducerIdAllocator(
            rt.store.config_file("producerIds"), config.actor_name
        )
        self.listener: DataPathListener | None = None
        if config.data_path_enable:
            # its requests go to these Ray methods (or processors), as declared in
            # actors.protocol.requests: both doors call the same coroutines
            self.listener = DataPathListener(rt, self, self.sender, _tls_context(config))
        self.grpc: Any = None  # actors.broker.grpc.service.GrpcEndpoint, with grpc_enable
        self._grpc_binding: asyncio.Task[None] | None = None  # its port, tried again
        self.ha.start()
        self.txn_check.start()
        self.popper.start()
        self._startup = loop.create_task(self._start())
        self._offset_flush = loop.create_task(self._offset_flush_loop())
        log.info(
            "broker %s up on node %s (%s), store %s, %s start, incarnation %s",
            config.actor_name,
            rt.node_id[:12],
            rt.addr,
            rt.store_dir,
            "abnormal" if rt.store.abnormal_start else "normal",
            rt.incarnation[:8],
        )

    async def _start(self) -> None:
        """Open the data path, then register: the first registration carries its address."""
        if self.listener is not None:
            try:
                await self.listener.start()
                self.rt.data_addr = self.listener.addr
            except OSError as exc:  # clients fall back to Ray's path
                log.error(
                    "broker %s: no data path (%s): serving through Ray only",
                    self.config.actor_name,
                    exc,
                )
                self.listener = None
        if self.config.grpc_enable:
            await self._start_grpc()
        _freeze_collector(self.config.actor_name)
        self.registration.start()
        self.lease.start()

    async def _start_grpc(self) -> None:
        """Serve RocketMQ 5's gRPC protocol (``actors.broker.grpc``); imported here only,
        so a process that never starts it never loads the generated protocol modules."""
        try:
            from actors.broker.grpc.activity import Processors
            from actors.broker.grpc.service import GrpcEndpoint

            processors = Processors(
                self.sender,
                self.end_txn,
                self.producers,
                pop=self.popper,
                groups=self.groups,
                admin=self.admin,
                lite=self.lite,
            )
            endpoint = GrpcEndpoint(self.rt, processors, _tls_files(self.config))
        except Exception as exc:  # noqa: BLE001 - the rest of the broker still serves
            log.error("broker %s: no gRPC endpoint (%s)", self.config.actor_name, exc)
            return
        try:
            self._grpc_listening(endpoint, await endpoint.start())
        except Exception as exc:  # noqa: BLE001 - the rest of the broker still serves
            if not self.config.grpc_port:
                log.error("broker %s: no gRPC endpoint (%s)", self.config.actor_name, exc)
                return
            # a port of its own may be held for a while (a connection of the machine
            # took it as its local port while this broker was down): tried again
            log.warning(
                "broker %s: gRPC port %d not bound (%s): trying again every %.0f s",
                self.config.actor_name,
                self.config.grpc_port,
                exc,
                GRPC_BIND_RETRY_S,
            )
            self._grpc_binding = asyncio.get_running_loop().create_task(
                self._bind_grpc_later(endpoint)
            )

    def _grpc_listening(self, endpoint: Any, addr: str) -> None:
        """The gRPC endpoint listens: its address goes out with the next registration."""
        self.rt.grpc_addr = addr
        self.grpc = endpoint

    async def _bind_grpc_later(self, endpoint: Any) -> None:
        """The configured gRPC port, every ``GRPC_BIND_RETRY_S`` until it binds or the
        broker closes."""
        while not self.rt.closing:
            await asyncio.sleep(GRPC_BIND_RETRY_S)
            try:
                addr = await endpoint.start()
            except Exception:  # noqa: BLE001 - still held
                continue
            self._grpc_listening(endpoint, addr)
            log.info("broker %s: gRPC endpoint bound on %s", self.config.actor_name, addr)
            return

    async def data_path(self) -> dict[str, Any] | None:
        """Where and how to reach this broker's own socket: its address, this incarnation's
        secret (a client proves it holds it, ``actors.protocol.frames``) and whether it
        speaks TLS; None without one. Handed out through Ray: only the cluster gets it."""
        await asyncio.shield(self._startup)
        if self.listener is None:
            return None
        return {
            "addr": self.listener.addr,
            "secret": self.listener.secret,
            "tls": self.listener.ssl_context is not None,
            "incarnation": self.rt.incarnation,
            "unix": self.listener.unix_path,  # for clients on this node (``node``)
            "node": self.rt.node_id,
        }

    async def recall_timer(self, topic: str, uniq_key: str, deliver_ms: int) -> None:
        """Cancel a pending timer message here (a gRPC ``RecallMessage`` that reached
        another broker of the cluster is forwarded to this one, the handle's)."""
        await asyncio.shield(self._startup)
        await self.sender.recall_timer(topic, uniq_key, deliver_ms)

    async def grpc_endpoint(self) -> dict[str, Any] | None:
        """This broker's RocketMQ 5 gRPC endpoint (``grpc_enable``): its address, whether it
        speaks TLS and the credentials calls must be signed with; None without one. Handed
        out through Ray: only the cluster gets the secret."""
        await asyncio.shield(self._startup)
        if self.grpc is None:
            return None
        c = self.config
        return {
            "addr": self.grpc.addr,
            "tls": self.grpc.tls is not None,
            "access_key": c.grpc_access_key,
            "secret_key": c.grpc_secret_key,
            "stats": self.grpc.service.status(),
        }

    async def _offset_flush_loop(self) -> None:
        rt = self.rt
        while not rt.closing:
            await asyncio.sleep(self.config.flush_consumer_offset_interval_s)
            self.sender.rings.sweep()  # rings of producers that went away without closing
            try:
                await rt.run(rt.offsets.persist)
            except Exception:  # noqa: BLE001
                log.exception("persisting consumer offsets failed")

    async def register_all(self) -> int:
        """Register with every NameServer now; return how many took it."""
        return await self.registration.register_all()

    async def inject_fault(self, kind: str, count: int = 1) -> None:
        """Arm a fault for the next ``count`` sends, commits or status calls
        (``actors.broker.faults``)."""
        self.rt.faults.arm(kind, count)

    async def allocate_producer_id(self) -> str:
        """An id for an idempotent producer (``actors.broker.client.producer_ids``): once per
        producer, through Ray."""
        return await self.rt.run(self.producer_ids.allocate)

    # ------------------------------------------------------------ data path
    # A method written ``x = _served_by(processor, Processor.x)`` is the processor's own
    # (its arguments, checks and docstring are there). Those the socket serves too are
    # not written here: each is derived from its declaration's ``served_by``
    # (actors.protocol.requests; ``_derive_served_methods`` below): send, send_shared,
    # pull_packed, commit_offsets, heartbeat, unregister_consumer, consumer_send_msg_back,
    # end_transaction(s/_batch), commit_one_phase, pop, ack_message,
    # change_invisible_duration, min_max_offset, offset_by_time.

    async def drop_ring(self, ring: RingId) -> None:
        """A producer closed its shared ring: let its memory go now."""
        self.sender.rings.drop(ring)

    pull = _served_by("puller", PullMessageProcessor.pull)

    # ------------------------------------------------------------ consumer groups
    fence_offsets = _served_by("groups", ConsumerManageProcessor.fence_offsets)
    offset_fences = _served_by("groups", ConsumerManageProcessor.offset_fences)
    query_offsets = _served_by("groups", ConsumerManageProcessor.query_offsets)
    query_offset = _served_by("groups", ConsumerManageProcessor.query_offset)

    save_stream_checkpoint = _served_by("groups", ConsumerManageProcessor.save_stream_checkpoint)
    load_stream_checkpoint = _served_by("groups", ConsumerManageProcessor.load_stream_checkpoint)
    reset_offsets = _served_by("groups", ConsumerManageProcessor.reset_offsets)
    consumer_list = _served_by("groups", ConsumerManageProcessor.consumer_list)
    consumer_lag = _served_by("groups", ConsumerManageProcessor.consumer_lag)

    # ------------------------------------------------------------ retries, dead letters, delays
    create_retry_topic = _served_by(
        "sender",
        SendMessageProcessor.create_retry_topic,
        """Create ``%RETRY%<group>`` (1 queue) here unless it exists.""",
    )
    read_dlq = _served_by("admin", AdminBrokerProcessor.read_dlq)
    delay_levels = _served_by("admin", AdminBrokerProcessor.delay_levels)

    # ------------------------------------------------------------ transactions

    async def fence_transactional(self, transactional_id: str, epoch: int) -> int:
        """Refuse from now on half messages of ``transactional_id`` below ``epoch``, and
        roll back those pending here; how many were rolled back."""
        tid = checks.check_str("transactional_id", transactional_id)
        epoch = checks.check_int("epoch", epoch, 0)
        # after any one-phase commit in progress here: the new instance reads the offsets
        # once this answers, and an older instance's commit must be in them or refused
        await self.one_phase.raise_fence(tid, epoch)
        return await self.end_txn.abort_fenced(tid, epoch)

    async def register_transaction_producer(
        self, producer_group: str, client_id: str, relay: Any, ttl_s: float
    ) -> None:
        """A transactional producer's check handle (its relay actor), live for ``ttl_s``
        (at most ``channel_expired_s``) unless registered again."""
        self.producers.register(producer_group, client_id, relay, ttl_s)

    async def unregister_transaction_producer(self, producer_group: str, client_id: str) -> None:
        self.producers.unregister(producer_group, client_id)

    check_transactions = _served_by(
        "txn_check",
        TransactionalMessageCheckService.check_once,
        """Run one round of the transaction check service now; how many it handled.""",
    )

    async def pending_transactions(self) -> list[dict[str, Any]]:
        """Half messages not ended yet, with their age and check count."""
        await self.txn_bridge.ensure_loaded()
        return await self.rt.run(self.txn_bridge.pending)

    # ------------------------------------------------------------ POP (processor/pop.py)
    set_group_fifo = _served_by("popper", PopProcessor.set_group_fifo)
    forward_to_dead_letter_queue = _served_by("popper", PopProcessor.forward_to_dead_letter_queue)

    # ------------------------------------------------------------ topics and lookups (admin)
    create_topic = _served_by("admin", AdminBrokerProcessor.create_topic)
    delete_topic = _served_by("admin", AdminBrokerProcessor.delete_topic)
    get_topic_config = _served_by("admin", AdminBrokerProcessor.get_topic_config)
    topic_configs = _served_by("admin", AdminBrokerProcessor.topic_configs)
    topic_status = _served_by("admin", AdminBrokerProcessor.topic_status)
    query_by_key = _served_by("admin", AdminBrokerProcessor.query_by_key)
    message_by_id = _served_by("admin", AdminBrokerProcessor.message_by_id)
    counters = _served_by("admin", AdminBrokerProcessor.counters)

    # ------------------------------------------------------------ the group (replication)
    ha_transfer = _served_by(
        "ha",
        HAService.transfer,
        """Master side of replication: a slave asks for the CommitLog's bytes from
        ``offset`` (held up to ``wait_s`` until there are some) and acknowledges what it
        holds (``acked``); see ``actors.broker.ha.master_slave``.""",
    )

    async def ha_config_snapshot(self) -> dict[str, Any]:
        """Topics, consumer offsets and delay progress, for slaves (SlaveSynchronize)."""
        return self.ha.config_snapshot()

    async def ha_local_offsets(self) -> dict[tuple[str, str], dict[int, int]]:
        """Offsets consumers committed to this slave that its master has not merged yet."""
        return self.ha.local_offsets()

    async def ha_log_tail(self, offset: int, max_bytes: int) -> Any:
        """Slave side: where this slave's CommitLog ends (its last whole record), its
        epochs and up to ``max_bytes`` of it from ``offset``, for a master that restarted
        behind it (``actors.broker.ha.master_slave``)."""
        return await self.ha.log_tail(offset, max_bytes)

    async def ha_merge_offsets(self, table: dict[tuple[str, str], dict[int, int]]) -> int:
        """Take a slave's consumer commits (the larger offset of each queue wins)."""
        return self.ha.merge_offsets(table)

    async def promote(
        self, role: str | None = None, min_offset: int = 0, force: bool = False
    ) -> dict[str, Any]:
        """Make this slave its group's master (``raymq broker promote``); refused while the
        master is alive or when this slave lacks an acknowledged message (< ``min_offset``)."""
        return await self.ha.promote(role, min_offset, force)

    async def raft_receive(self, messages: list[Any], entries: Any = None) -> None:
        """DLedger: Raft messages from a member of the group, with the log entries they
        carry (one shared buffer per drain; see ``actors.broker.ha.dledger``)."""
        await self.ha.raft_receive(messages, entries)

    # ------------------------------------------------------------ status and lifecycle
    async def status(self) -> dict[str, Any]:
        if self.rt.faults.take("stall_status"):
            await self._closed.wait()
        data_path: dict[str, Any] = {"data_addr": self.rt.data_addr, "grpc_addr": self.rt.grpc_addr}
        if self.listener is not None:
            data_path.update({f"data_{k}": v for k, v in self.listener.stats.items()})
        return {
            **await self.admin.status(),
            **self.sender.status(),
            **self.popper.status(),
            **self.txn_bridge.status(),
            **self.one_phase.status(),
            **data_path,
        }

    async def ping(self) -> str:
        return self.rt.incarnation

    async def persist(self) -> None:
        """Save consumer offsets and flush the store now, then the lite store: its
        groups' committed offsets and subscription tables too."""
        await self.rt.run(self.rt.offsets.persist, True)
        await self.rt.run(self.rt.store.flush)
        await self.rt.run(self.lite.persist)

    async def wait_closed(self) -> None:
        """Returns when the broker shuts down; NameServers keep this call pending so
        Ray's failure of it tells them at once that the actor died."""
        await self._closed.wait()

    def _leave(self, why: str) -> None:
        """The broker's node is gone from the cluster (``lease``): save the consumer
        offsets committed since the last periodic save, close the store, releasing its
        lock and flushing what it holds, and end the process, so the broker Ray starts
        again on a node with this disk can open it with every commit it acknowledged."""
        log.error("broker %s leaves: %s", self.config.actor_name, why)
        self.rt.closing = True
        with contextlib.suppress(Exception):
            self.rt.offsets.persist(True)
        with contextlib.suppress(Exception):
            self.lite.close()
        with contextlib.suppress(Exception):
            self.rt.store.close()
        _exit_process()

    async def shutdown(self) -> None:
        """A clean stop: leave the routes, release held pulls, save offsets, close the store."""
        rt = self.rt
        if rt.closing:
            return
        rt.closing = True
        self._closed.set()
        self.registration.stop()
        self.lease.stop()
        rt.holds.wake_all()
        self._offset_flush.cancel()
        self.txn_check.stop()
        with contextlib.suppress(Exception):
            await self.popper.stop()
        if self.listener is not None:
            await self.listener.stop()
        if self._grpc_binding is not None:
            self._grpc_binding.cancel()
        if self.grpc is not None:
            with contextlib.suppress(Exception):
                await self.grpc.stop()
        if self._metrics_service is not None:
            self._metrics_service.stop()
        with contextlib.suppress(Exception):
            await self.ha.stop()
        await self.registration.unregister_all()
        await rt.run(rt.offsets.persist, True)
        await rt.run(self.lite.close)
        await rt.run(rt.store.close)
        rt.io.shutdown(wait=False)
        log.info("broker %s shut down cleanly", self.config.actor_name)


# lite topics (actors/broker/lite): lite_send, lite_create_parent, lite_subscribe ... are
# the coroutines of the lite processor, its parents and its consumers
for _attribute, _lite in (
    ("lite", LiteProcessor),
    ("lite_parents", LiteParents),
    ("lite_consumers", LiteConsumers),
):
    for _name in _lite.REQUESTS:
        setattr(Broker, f"lite_{_name}", _served_by(_attribute, getattr(_lite, _name)))


_PROCESSORS: dict[str, type] = {
    "sender": SendMessageProcessor,
    "puller": PullMessageProcessor,
    "groups": ConsumerManageProcessor,
    "end_txn": EndTransactionProcessor,
    "one_phase": OnePhaseCommits,
    "popper": PopProcessor,
    "admin": AdminBrokerProcessor,
    "lite": LiteProcessor,
    "lite_parents": LiteParents,
    "lite_consumers": LiteConsumers,
    "subscriber": SubscribeProcessor,
}
"""The class of each processor the Broker holds, by attribute (a declaration's
``served_by`` names one)."""


def _derive_served_methods() -> None:
    """The Broker's Ray method of each socket request declared ``served_by`` a
    processor (``actors.protocol.requests.BROKER``): a new request is its declaration
    and its processor's coroutine."""
    for request in requests.BROKER:
        if request.served_by is None:
            continue
        attribute, name = request.served_by
        if request.method in vars(Broker):
            raise TypeError(f"{request.name}: Broker.{request.method} is written by hand too")
        processor = _PROCESSORS.get(attribute)
        if processor is None or not callable(getattr(processor, name, None)):
            raise TypeError(f"{request.name}: served_by {request.served_by} is no processor's")
        method = getattr(processor, name)
        ray_method = _served_by(attribute, method, "" if method.__doc__ else request.doc)
        ray_method.__name__ = request.method
        ray_method.__qualname__ = f"Broker.{request.method}"
        setattr(Broker, request.method, ray_method)


_derive_served_methods()


def _exit_process() -> None:
    logging.shutdown()
    os._exit(1)


def _freeze_collector(name: str) -> None:
    """Move what the broker holds once started (Ray, RayMQ, the store's recovered state:
    ~100,000 objects) out of the garbage collector's reach, before any client knows of
    it. A full collection walks every object it tracks while the event loop waits: tens
    of milliseconds for such a process on a 2-core machine, whenever enough objects had
    outlived the young generations; after the freeze it walks only what came since, as
    fleet members do (``actors.fleet.member``)."""
    started = time.perf_counter()
    gc.collect()  # what is garbage now is not frozen with the rest
    gc.freeze()
    log.info(
        "broker %s: %d objects out of the collector's walks (%.0f ms)",
        name,
        gc.get_freeze_count(),
        (time.perf_counter() - started) * 1e3,
    )


def _tls_context(config: BrokerConfig) -> ssl.SSLContext | None:
    if config.data_tls_cert is None or config.data_tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.data_tls_cert, config.data_tls_key)
    return context


def _tls_files(config: BrokerConfig) -> tuple[bytes, bytes] | None:
    """The data path's certificate and key, for the gRPC endpoint too: (key, chain)."""
    if config.data_tls_cert is None or config.data_tls_key is None:
        return None
    with open(config.data_tls_key, "rb") as key, open(config.data_tls_cert, "rb") as cert:
        return key.read(), cert.read()
