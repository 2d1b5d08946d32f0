"""RocketMQ 5's ``apache.rocketmq.v2.MessagingService``, served by a broker master.

The official RocketMQ 5 clients (Java, Go, Python, Node.js, ...) speak this gRPC
protocol to RocketMQ's proxy; a broker started with ``grpc_enable`` serves it itself,
on ``grpc.aio`` in the broker actor's own event loop, onto the same processors as the
Ray methods and the data path (``actors.broker.processor.send``,
``actors.broker.processor.end_transaction``).
``QueryRoute`` answers each queue of a topic with the gRPC endpoint of the broker that
owns it (registered with the NameServers beside the data path's address), so a
client sends each message straight to its queue's broker: no proxy hop.

Every call must carry the cluster's signature (``actors.broker.grpc.auth``); an
unsigned or badly signed call is answered ``UNAUTHORIZED`` and changes nothing.
Every error is a RocketMQ status in the answer (``actors.broker.grpc.convert``),
never a broker crash. docs/rocketmq5.md lists what each RPC does and what is left.

Imported only when a broker starts its endpoint: the generated protocol modules
register ``apache/rocketmq/v2/*.proto`` in the process's protobuf descriptor pool,
as the official Python client's do, so the two must never meet in one process.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import ray

from actors.broker.client.producer_manager import ProducerManager
from actors.broker.grpc.auth import Authenticator
from actors.broker.grpc.convert import (
    PROP_TIMER_DELIVER_MS,
    RecallHandle,
    StatusError,
    raymq_name,
    status,
    status_of,
    to_pb_message,
    to_store_message,
    transaction_check_message,
)
from actors.broker.grpc.renew import AutoRenewer
from actors.broker.grpc.v2 import definition_pb2 as pb
from actors.broker.grpc.v2 import service_pb2 as spb
from actors.broker.grpc.v2 import service_pb2_grpc as sgrpc
from actors.broker.processor.admin import AdminBrokerProcessor
from actors.broker.processor.consumer_manage import ConsumerManageProcessor
from actors.broker.processor.end_transaction import EndTransactionProcessor
from actors.broker.processor.pop import PopProcessor
from actors.broker.processor.send import SendMessageProcessor
from actors.broker.runtime import BrokerRuntime
from actors.config import broker_actor_name
from actors.protocol.pop import MAX_INVISIBLE_MS, MIN_INVISIBLE_MS, PoppedMessage
from actors.protocol.route import TopicRouteData
from actors.protocol.topic import is_readable, is_writeable
from actors.protocol.wire import SendAck
from storage.codec import encode_batch, java_hash
from storage.errors import BrokerUnavailableError, InvalidMessageError, TimerRecallError
from storage.message import Message, PutStatus
from storage.properties import PROP_UNIQ_KEY

log = logging.getLogger("raymq.actors.broker.grpc")

R = TypeVar("R")
ACCEPT_TYPES = (
    pb.MessageType.NORMAL,
    pb.MessageType.FIFO,
    pb.MessageType.DELAY,
    pb.MessageType.TRANSACTION,
)
"""A RayMQ topic takes every kind of message (RocketMQ 4's mixed topics)."""
TRANSACTION_GROUP_PREFIX = "rmq5%"
"""The producer group of a gRPC transactional message: ``rmq5%<topic>`` (a RocketMQ 5
producer sends no group; the orphaned-transaction check will find the topic's
publishers through their Telemetry streams)."""
_PUT_CODES = {
    PutStatus.FLUSH_DISK_TIMEOUT: pb.Code.MASTER_PERSISTENCE_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: pb.Code.SLAVE_PERSISTENCE_TIMEOUT,
    PutStatus.SLAVE_NOT_AVAILABLE: pb.Code.HA_NOT_AVAILABLE,
    PutStatus.SERVICE_NOT_AVAILABLE: pb.Code.INTERNAL_SERVER_ERROR,
}
ROUTE_TIMEOUT_S = 3.0
MAX_RECEIVE_BATCH = 32


def _endpoints(addr: str) -> pb.Endpoints:
    host, _, port = addr.rpartition(":")
    return pb.Endpoints(
        scheme=pb.AddressScheme.IPv4, addresses=[pb.Address(host=host, port=int(port))]
    )


def _permission(read: bool, write: bool) -> int:
    if read and write:
        return pb.Permission.READ_WRITE
    return pb.Permission.READ if read else pb.Permission.WRITE if write else pb.Permission.NONE


def _unary(
    response: Callable[..., R],
) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """Authenticate the call, run it, and answer any error as a RocketMQ status."""

    def wrap(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        @functools.wraps(fn)
        async def call(self: MessagingService, request: Any, context: Any) -> R:
            try:
                self.authenticate(context)
                return await fn(self, request, context)
            except Exception as exc:  # noqa: BLE001 - every error is an answer
                code, message = status_of(exc)
                self.refused(fn.__name__, code, message, exc)
                return response(status=status(code, message))

        return call

    return wrap


class TelemetryStream:
    """One client's Telemetry stream, and for the transaction check service the handle of
    a producer: ``TransactionalMessageCheckService`` calls ``handle.check.remote(broker, offset,
    msg_id, message)`` (as on a native producer's relay actor), which sends the client a
    ``RecoverOrphanedTransactionCommand``; its answer comes back as an EndTransaction."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.out: asyncio.Queue[Any] = asyncio.Queue()
        self.topics: dict[str, pb.Resource] = {}  # RayMQ topic -> as the client names it
        self.check = self

    def remote(self, broker: str, offset: int, msg_id: str, message: Message) -> None:
        resource = self.topics.get(message.topic) or pb.Resource(name=message.topic)
        command = spb.RecoverOrphanedTransactionCommand(
            message=transaction_check_message(message, resource, msg_id),
            transaction_id=str(offset),
        )
        self.out.put_nowait(spb.TelemetryCommand(recover_orphaned_transaction_command=command))


class MessagingService(sgrpc.MessagingServiceServicer):
    """The RPCs, onto one broker's processors."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        sender: SendMessageProcessor,
        transactions: EndTransactionProcessor,
        producers: ProducerManager,
        auth: Authenticator,
        pop: PopProcessor | None = None,
        groups: ConsumerManageProcessor | None = None,
        admin: AdminBrokerProcessor | None = None,
    ) -> None:
        self.rt = runtime
        self.sender = sender
        self.transactions = transactions
        self.producers = producers
        self.auth = auth
        self.pop = pop
        self.groups = groups
        self.admin = admin
        c = runtime.config
        self.renewer = (
            AutoRenewer(pop, c.grpc_renew_invisible_s, c.grpc_renew_ahead_s, c.grpc_renew_max_s)
            if pop is not None
            else None
        )
        self._round_robin = itertools.count()
        self.stats = {"calls": 0, "refused": 0, "unauthorized": 0}
        self._publishers: dict[str, TelemetryStream] = {}  # client id -> its stream

    def status(self) -> dict[str, int]:
        """Calls, refusals, the publishers whose streams take transaction checks, and the
        push consumers' messages renewed."""
        out = {**self.stats, "publishers": len(self._publishers)}
        if self.renewer is not None:
            out.update({f"auto_renew_{k}": v for k, v in self.renewer.stats.items()})
            out["auto_renew_held"] = len(self.renewer)
        return out

    # ------------------------------------------------------------ plumbing
    def authenticate(self, context: Any) -> None:
        self.stats["calls"] += 1
        self.auth.check(context.invocation_metadata() or ())

    def refused(self, rpc: str, code: int, message: str, exc: BaseException) -> None:
        self.stats["refused"] += 1
        if code == pb.Code.UNAUTHORIZED:
            self.stats["unauthorized"] += 1
            log.warning("gRPC %s refused: %s", rpc, message)
        elif code in (pb.Code.INTERNAL_ERROR, pb.Code.INTERNAL_SERVER_ERROR) and not isinstance(
            exc, _RecallRefused
        ):
            log.error("gRPC %s failed: %s", rpc, message, exc_info=exc)
        else:
            log.info("gRPC %s refused (%s): %s", rpc, pb.Code.Name(code), message)  # type: ignore[arg-type]

    @staticmethod
    def client_id(context: Any) -> str:
        for key, value in context.invocation_metadata() or ():
            if key == "x-mq-client-id":
                return value if isinstance(value, str) else value.decode()
        return ""

    async def _route(self, topic: str) -> TopicRouteData | None:
        """The topic's route from the first NameServer that answers."""
        last: Exception | None = None
        for name in self.rt.config.nameservers:
            try:
                handle = await self.rt.run(self.rt.nameserver, name)
                route: TopicRouteData | None = await asyncio.wait_for(
                    handle.get_route.remote(topic), ROUTE_TIMEOUT_S
                )
                return route
            except Exception as exc:  # noqa: BLE001 - try the next NameServer
                self.rt.forget_nameserver(name)
                last = exc
        raise StatusError(pb.Code.INTERNAL_SERVER_ERROR, f"no NameServer answered: {last}")

    def _queues(
        self, resource: pb.Resource, route: TopicRouteData, *, per_broker: bool = False
    ) -> list[pb.MessageQueue]:
        out = []
        for qd in route.queue_datas:
            bd = route.broker(qd.broker_name)
            addr = bd.grpc_addrs.get(0) if bd is not None else None
            if not addr:
                continue  # a group without a master serving gRPC
            broker = pb.Broker(name=qd.broker_name, id=0, endpoints=_endpoints(addr))
            if per_broker:  # POP-style assignment: the broker picks the queue
                if is_readable(qd.perm) and qd.read_queue_nums > 0:
                    out.append(
                        pb.MessageQueue(
                            topic=resource,
                            id=-1,
                            permission=pb.Permission.READ_WRITE,
                            broker=broker,
                            accept_message_types=ACCEPT_TYPES,
                        )
                    )
                continue
            for qid in range(max(qd.read_queue_nums, qd.write_queue_nums)):
                out.append(
                    pb.MessageQueue(
                        topic=resource,
                        id=qid,
                        permission=_permission(  # type: ignore[arg-type]
                            qid < qd.read_queue_nums and is_readable(qd.perm),
                            qid < qd.write_queue_nums and is_writeable(qd.perm),
                        ),
                        broker=broker,
                        accept_message_types=ACCEPT_TYPES,
                    )
                )
        return out

    # ------------------------------------------------------------ routes and clients
    @_unary(spb.QueryRouteResponse)
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        topic = raymq_name(request.topic)
        route = await self._route(topic)
        queues = self._queues(request.topic, route) if route is not None else []
        if not queues:
            raise StatusError(pb.Code.TOPIC_NOT_FOUND, f"topic {topic!r} has no gRPC route")
        return spb.QueryRouteResponse(status=status(), message_queues=queues)

    @_unary(spb.QueryAssignmentResponse)
    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        topic = raymq_name(request.topic)
        raymq_name(request.group, "group")
        route = await self._route(topic)
        queues = self._queues(request.topic, route, per_broker=True) if route else []
        if not queues:
            raise StatusError(pb.Code.TOPIC_NOT_FOUND, f"topic {topic!r} has no gRPC route")
        return spb.QueryAssignmentResponse(
            status=status(), assignments=[pb.Assignment(message_queue=q) for q in queues]
        )

    @_unary(spb.HeartbeatResponse)
    async def Heartbeat(self, request: Any, context: Any) -> Any:
        if request.HasField("group"):
            raymq_name(request.group, "group")
        client = self.client_id(context)
        stream = self._publishers.get(client)
        if stream is not None:  # a publisher stays checkable while it beats
            self._renew(stream)
        if self.renewer is not None:  # a push consumer's messages renewed while it beats
            self.renewer.seen(client)
        return spb.HeartbeatResponse(status=status())

    @_unary(spb.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        if request.HasField("group"):
            group = raymq_name(request.group, "group")
            client = self.client_id(context)
            if client:
                self.rt.consumers.unregister(group, client)
        if self.renewer is not None:  # what it still held lapses and goes to the others
            self.renewer.forget_client(self.client_id(context))
        return spb.NotifyClientTerminationResponse(status=status())

    async def Telemetry(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        """The client's settings in, the server's settings out (before a consumer's start
        completes); a publisher's stream also carries the orphaned-transaction checks of
        its topics' half messages out to it (``RecoverOrphanedTransactionCommand``)."""
        try:
            self.authenticate(context)
        except Exception as exc:  # noqa: BLE001
            code, message = status_of(exc)
            self.refused("Telemetry", code, message, exc)
            yield spb.TelemetryCommand(status=status(code, message))
            return
        stream = TelemetryStream(self.client_id(context) or uuid.uuid4().hex)

        async def read() -> None:
            try:
                async for command in request_iterator:
                    if command.WhichOneof("command") == "settings":
                        self._register_publisher(stream, command.settings)
                        stream.out.put_nowait(
                            spb.TelemetryCommand(
                                status=status(), settings=self.settings(command.settings)
                            )
                        )
                    # stack traces and message verification answers: nothing to do yet
            finally:
                stream.out.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await stream.out.get()) is not None:
                yield item
        finally:
            reader.cancel()
            self._unregister_publisher(stream)

    def _register_publisher(self, stream: TelemetryStream, settings: pb.Settings) -> None:
        """A producer's stream checks the half messages of the topics it publishes."""
        if settings.WhichOneof("pub_sub") != "publishing":
            return
        for resource in settings.publishing.topics:
            try:
                topic = raymq_name(resource)
            except StatusError:
                continue
            stream.topics[topic] = resource
        self._publishers[stream.client_id] = stream
        self._renew(stream)

    def _renew(self, stream: TelemetryStream) -> None:
        ttl = self.rt.config.channel_expired_s
        for topic in stream.topics:
            self.producers.register(TRANSACTION_GROUP_PREFIX + topic, stream.client_id, stream, ttl)

    def _unregister_publisher(self, stream: TelemetryStream) -> None:
        if self._publishers.get(stream.client_id) is stream:
            del self._publishers[stream.client_id]
            for topic in stream.topics:
                self.producers.unregister(TRANSACTION_GROUP_PREFIX + topic, stream.client_id)

    def settings(self, client: pb.Settings) -> pb.Settings:
        """What the server tells a client: its limits and how to retry."""
        out = pb.Settings()
        out.CopyFrom(client)
        out.metric.on = False
        max_body = self.rt.store.config.max_message_size
        if client.WhichOneof("pub_sub") == "subscription":
            sub = out.subscription
            sub.receive_batch_size = 32
            sub.long_polling_timeout.FromSeconds(20)
            try:  # FIFO is the group's as the broker keeps it (its receives are FIFO too)
                fifo = self.pop is not None and self.pop.group_fifo(raymq_name(sub.group, "group"))
            except StatusError:  # a bad group name: not a FIFO group
                fifo = False
            sub.fifo = fifo
            # RocketMQ's retry delays (delay levels 3..18), 16 deliveries before the DLQ
            out.backoff_policy.max_attempts = 16
            out.backoff_policy.customized_backoff.next.extend(
                _seconds(s) for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480)
            )
        else:
            out.publishing.max_body_size = max_body
            out.publishing.validate_message_type = False
            out.backoff_policy.max_attempts = 3
            exp = out.backoff_policy.exponential_backoff
            exp.initial.FromMilliseconds(10)
            exp.max.FromSeconds(1)
            exp.multiplier = 2.0
        return out

    # ------------------------------------------------------------ producing
    @_unary(spb.SendMessageResponse)
    async def SendMessage(self, request: Any, context: Any) -> Any:
        if not request.messages:
            raise StatusError(pb.Code.BAD_REQUEST, "no messages")
        rt = self.rt
        max_body = rt.store.config.max_message_size
        messages, transactional = [], []
        for m in request.messages:
            topic = raymq_name(m.topic)
            tc = rt.topics.get(topic)
            if tc is None:
                raise StatusError(
                    pb.Code.TOPIC_NOT_FOUND, f"topic {topic!r} is not on {rt.config.broker_name}"
                )
            if not is_writeable(tc.perm) or tc.write_queue_nums < 1:
                raise StatusError(pb.Code.FORBIDDEN, f"topic {topic!r} is not writable here")
            sp = m.system_properties
            if sp.HasField("message_group") and sp.message_group:
                qid = abs(java_hash(sp.message_group)) % tc.write_queue_nums  # one queue a group
            else:
                qid = next(self._round_robin) % tc.write_queue_nums
            is_txn = sp.message_type == pb.MessageType.TRANSACTION
            transactional.append(is_txn)
            messages.append(
                to_store_message(
                    m,
                    topic,
                    qid,
                    max_body,
                    transaction_group=TRANSACTION_GROUP_PREFIX + topic if is_txn else None,
                )
            )
        now_ms = int(time.time() * 1000)
        recall = [self._recall_handle(m, now_ms) for m in messages]
        host = _born_host(context)
        born = [
            (m.system_properties.born_timestamp.ToMilliseconds() or now_ms, host, 0)
            for m in request.messages
        ]
        try:
            batch = encode_batch(messages, max_message_size=max_body, born=born)
        except InvalidMessageError as exc:
            raise StatusError(pb.Code.BAD_REQUEST, str(exc)) from exc
        ack = SendAck.from_wire(await self.sender.send_batch(batch))
        code = _PUT_CODES.get(ack.status, pb.Code.OK)
        entries = []
        for i, m in enumerate(request.messages):
            entries.append(
                spb.SendResultEntry(
                    status=status(code, ack.status.value),
                    message_id=m.system_properties.message_id,
                    transaction_id=str(int(ack.commitlog_offsets[i])) if transactional[i] else "",
                    offset=int(ack.queue_offsets[i]),
                    recall_handle=recall[i] if code == pb.Code.OK else "",
                )
            )
        return spb.SendMessageResponse(status=status(code, ack.status.value), entries=entries)

    def _recall_handle(self, message: Message, now_ms: int) -> str:
        """A timer message's recall handle (its delivery time still ahead), else ""."""
        props = message.properties or {}
        deliver = props.get(PROP_TIMER_DELIVER_MS)
        if deliver is None or int(deliver) <= now_ms:
            return ""
        uniq = props[PROP_UNIQ_KEY]
        return RecallHandle(message.topic, self.rt.config.broker_name, int(deliver), uniq).encode()

    @_unary(spb.EndTransactionResponse)
    async def EndTransaction(self, request: Any, context: Any) -> Any:
        topic = raymq_name(request.topic)
        try:
            half_offset = int(request.transaction_id)
            if half_offset < 0:
                raise ValueError(half_offset)
        except ValueError as exc:
            raise StatusError(
                pb.Code.INVALID_TRANSACTION_ID,
                f"transaction_id {request.transaction_id!r} is not one this broker gave",
            ) from exc
        if request.resolution == pb.TransactionResolution.COMMIT:
            commit = True
        elif request.resolution == pb.TransactionResolution.ROLLBACK:
            commit = False
        elif request.resolution == pb.TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED:
            # a checker's UNKNOW (the clients send it as it is): nothing ends, the half
            # message stays pending and is checked again (RocketMQ's broker ignores it too)
            log.info("transaction %s of %s: still unknown", request.message_id, topic)
            return spb.EndTransactionResponse(status=status())
        else:
            raise StatusError(
                pb.Code.BAD_REQUEST, "resolution must be COMMIT, ROLLBACK or unspecified"
            )
        try:
            await self.transactions.end_transaction(
                TRANSACTION_GROUP_PREFIX + topic, half_offset, request.message_id, commit
            )
        except InvalidMessageError as exc:
            raise StatusError(pb.Code.INVALID_TRANSACTION_ID, str(exc)) from exc
        return spb.EndTransactionResponse(status=status())

    # ------------------------------------------------------------ consuming (POP)
    def _popper(self) -> PopProcessor:
        if self.pop is None:
            raise StatusError(
                pb.Code.NOT_IMPLEMENTED,
                "this broker has no POP consumption (actors/broker/processor/pop.py)",
            )
        return self.pop

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """POP receive from this broker's queues of the topic: the delivery time, the
        messages, then the status (``MESSAGE_NOT_FOUND`` when the long poll ends empty)."""
        try:
            self.authenticate(context)
            found, invisible_ms = await self._receive(request, context)
        except Exception as exc:  # noqa: BLE001 - every error is an answer
            code, message = status_of(exc)
            self.refused("ReceiveMessage", code, message, exc)
            yield spb.ReceiveMessageResponse(status=status(code, message))
            return
        topic = request.message_queue.topic
        if found:  # when the broker handed them out (the clients time their delivery by it)
            delivered = spb.ReceiveMessageResponse()
            delivered.delivery_timestamp.GetCurrentTime()
            yield delivered
        for popped in found:
            yield spb.ReceiveMessageResponse(
                message=to_pb_message(
                    popped.message,
                    topic,
                    receipt_handle=popped.receipt_handle,
                    invisible_ms=invisible_ms,
                    delivery_attempt=popped.reconsume_times + 1,
                )
            )
        if found:
            yield spb.ReceiveMessageResponse(status=status())
        else:
            yield spb.ReceiveMessageResponse(
                status=status(pb.Code.MESSAGE_NOT_FOUND, "no new message")
            )

    async def _receive(self, request: Any, context: Any) -> tuple[list[PoppedMessage], int]:
        pop = self._popper()
        group = raymq_name(request.group, "group")
        topic = raymq_name(request.message_queue.topic)
        if not 1 <= request.batch_size <= MAX_RECEIVE_BATCH:
            raise StatusError(pb.Code.BAD_REQUEST, f"batch_size must be in 1..{MAX_RECEIVE_BATCH}")
        tag_expr = "*"
        if request.HasField("filter_expression"):
            fe = request.filter_expression
            if fe.type == pb.FilterType.SQL:
                raise StatusError(pb.Code.UNSUPPORTED, "SQL92 filters are not supported yet")
            tag_expr = fe.expression or "*"
        renewer = self.renewer if request.auto_renew else None
        if renewer is not None:  # a push consumer: invisible while it is alive and has not
            invisible_ms = renewer.invisible_ms  # acked (renewed here, actors.broker.grpc.renew)
        elif request.HasField("invisible_duration"):
            invisible_ms = request.invisible_duration.ToMilliseconds()
        else:
            raise StatusError(pb.Code.ILLEGAL_INVISIBLE_TIME, "invisible_duration is required")
        if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
            raise StatusError(
                pb.Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible_duration must be in {MIN_INVISIBLE_MS}..{MAX_INVISIBLE_MS} ms",
            )
        wait_ms = 0
        if request.HasField("long_polling_timeout"):
            wait_ms = request.long_polling_timeout.ToMilliseconds()
            if wait_ms < 0:
                raise StatusError(pb.Code.ILLEGAL_POLLING_TIME, "long_polling_timeout < 0")
        # answer before the client's deadline (long polling + its request timeout)
        remaining = context.time_remaining()
        if remaining is not None:
            wait_ms = max(0, min(wait_ms, int((remaining - 0.5) * 1000)))
        client = self.client_id(context)
        started = time.monotonic()
        found = await pop.pop(
            group,
            topic,
            request.batch_size,
            invisible_ms,
            wait_ms,
            fifo=False,
            tag_expr=tag_expr,
            client_id=client,
        )
        if renewer is not None:
            renewer.track(group, topic, client, (p.receipt_handle for p in found), started)
        return list(found), invisible_ms

    async def _settle(
        self, group: str, topic: str, handle: str, op: Callable[[str], Awaitable[R]]
    ) -> R:
        """``op`` on the message's current handle: a push consumer's message renewed here
        has a newer one than the client holds (``actors.broker.grpc.renew``)."""
        if self.renewer is None:
            return await op(handle)
        return await self.renewer.settle(group, topic, handle, op)

    @_unary(spb.AckMessageResponse)
    async def AckMessage(self, request: Any, context: Any) -> Any:
        """The entries acked as one store operation (``PopProcessor.ack_each``: one journal
        write), each answering its own status; a push consumer's message renewed here is
        acked under its current handle, on its own (``actors.broker.grpc.renew``)."""
        pop = self._popper()
        group = raymq_name(request.group, "group")
        topic = raymq_name(request.topic)
        if not request.entries:
            raise StatusError(pb.Code.BAD_REQUEST, "no entries")
        handles = [entry.receipt_handle for entry in request.entries]
        renewer = self.renewer
        held = [i for i, h in enumerate(handles) if renewer and renewer.holds(group, topic, h)]
        plain = sorted(set(range(len(handles))) - set(held))
        answers: list[BaseException | None] = [None] * len(handles)
        if plain:
            acked: list[BaseException | None]
            try:
                acked = list(await pop.ack_each(group, topic, [handles[i] for i in plain]))
            except Exception as exc:  # noqa: BLE001 - the whole operation refused
                acked = [exc] * len(plain)
            for i, answer in zip(plain, acked):
                answers[i] = answer
        for i in held:
            try:
                await self._settle(group, topic, handles[i], lambda h: pop.ack(group, topic, h))
            except Exception as exc:  # noqa: BLE001 - each entry answers on its own
                answers[i] = exc
        entries = []
        for entry, answer in zip(request.entries, answers):
            code: int = pb.Code.OK
            message = "OK"
            if answer is not None:
                code, message = _handle_status(answer)
                self.refused("AckMessage", code, message, answer)
            entries.append(
                spb.AckMessageResultEntry(
                    message_id=entry.message_id,
                    receipt_handle=entry.receipt_handle,
                    status=status(code, message),
                )
            )
        codes = {e.status.code for e in entries}
        if codes == {pb.Code.OK}:
            overall = status()
        elif len(entries) == 1:
            overall = entries[0].status
        else:
            overall = status(pb.Code.MULTIPLE_RESULTS, "some entries failed")
        return spb.AckMessageResponse(status=overall, entries=entries)

    @_unary(spb.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        pop = self._popper()
        group = raymq_name(request.group, "group")
        topic = raymq_name(request.topic)
        invisible_ms = request.invisible_duration.ToMilliseconds()
        if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
            raise StatusError(
                pb.Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible_duration must be in {MIN_INVISIBLE_MS}..{MAX_INVISIBLE_MS} ms",
            )
        try:
            handle = await self._settle(
                group,
                topic,
                request.receipt_handle,
                lambda h: pop.change_invisible(group, topic, h, invisible_ms),
            )
        except Exception as exc:  # noqa: BLE001
            code, message = _handle_status(exc)
            raise StatusError(code, message) from exc
        return spb.ChangeInvisibleDurationResponse(status=status(), receipt_handle=handle)

    @_unary(spb.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        """A push consumer gave up on a message (its max delivery attempts): its copy goes
        to ``%DLQ%<group>`` and it is done."""
        pop = self._popper()
        group = raymq_name(request.group, "group")
        topic = raymq_name(request.topic)
        try:
            await self._settle(
                group, topic, request.receipt_handle, lambda h: pop.forward_to_dlq(group, topic, h)
            )
        except Exception as exc:  # noqa: BLE001
            code, message = _handle_status(exc)
            raise StatusError(code, message) from exc
        return spb.ForwardMessageToDeadLetterQueueResponse(status=status())

    # ------------------------------------------------------------ offsets
    def _queue_here(self, mq: Any) -> tuple[str, int]:
        """The RayMQ topic and queue id of a request's queue, which must be this broker's
        (the one ``QueryRoute`` named for it)."""
        topic = raymq_name(mq.topic)
        name = self.rt.config.broker_name
        if mq.HasField("broker") and mq.broker.name and mq.broker.name != name:
            raise StatusError(
                pb.Code.BAD_REQUEST, f"queue of broker {mq.broker.name!r}: this is {name!r}"
            )
        tc = self.rt.topics.get(topic)
        if tc is None:
            raise StatusError(pb.Code.TOPIC_NOT_FOUND, f"topic {topic!r} is not on {name}")
        if not 0 <= mq.id < max(tc.read_queue_nums, tc.write_queue_nums):
            raise StatusError(pb.Code.BAD_REQUEST, f"topic {topic!r} has no queue {mq.id} here")
        return topic, int(mq.id)

    def _offsets(self) -> tuple[ConsumerManageProcessor, AdminBrokerProcessor]:
        if self.groups is None or self.admin is None:
            raise StatusError(pb.Code.NOT_IMPLEMENTED, "this endpoint has no offsets")
        return self.groups, self.admin

    @_unary(spb.QueryOffsetResponse)
    async def QueryOffset(self, request: Any, context: Any) -> Any:
        """A queue's first offset (``BEGINNING``), its next (``END``), or the first stored
        at or after a time (``TIMESTAMP``)."""
        _, admin = self._offsets()
        topic, qid = self._queue_here(request.message_queue)
        policy = request.query_offset_policy
        if policy == pb.QueryOffsetPolicy.TIMESTAMP:
            if not request.HasField("timestamp"):
                raise StatusError(pb.Code.BAD_REQUEST, "TIMESTAMP needs a timestamp")
            ms = request.timestamp.ToMilliseconds()
            if ms < 0:
                raise StatusError(pb.Code.BAD_REQUEST, f"timestamp {ms} ms is before 1970")
            offset = await admin.offset_by_time(topic, qid, ms)
        elif policy in (pb.QueryOffsetPolicy.BEGINNING, pb.QueryOffsetPolicy.END):
            low, high = await admin.min_max_offset(topic, qid)
            offset = low if policy == pb.QueryOffsetPolicy.BEGINNING else high
        else:
            raise StatusError(pb.Code.BAD_REQUEST, f"unknown query_offset_policy {policy}")
        return spb.QueryOffsetResponse(status=status(), offset=offset)

    @_unary(spb.GetOffsetResponse)
    async def GetOffset(self, request: Any, context: Any) -> Any:
        """The group's committed offset of the queue (the next message it consumes)."""
        groups, _ = self._offsets()
        group = raymq_name(request.group, "group")
        topic, qid = self._queue_here(request.message_queue)
        offset = await groups.query_offset(group, topic, qid)
        if offset < 0:
            raise StatusError(
                pb.Code.OFFSET_NOT_FOUND, f"{group} has no offset of {topic}:{qid} here"
            )
        return spb.GetOffsetResponse(status=status(), offset=offset)

    @_unary(spb.UpdateOffsetResponse)
    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        """Commit the group's offset of the queue (0 .. the queue's next offset), as a
        native consumer's commit: replicated to slaves, read by lag and the console."""
        groups, _ = self._offsets()
        group = raymq_name(request.group, "group")
        topic, qid = self._queue_here(request.message_queue)
        await groups.commit_offsets(
            group, {(topic, qid): int(request.offset)}, self.client_id(context)
        )
        return spb.UpdateOffsetResponse(status=status())

    # ------------------------------------------------------------ recall
    @_unary(spb.RecallMessageResponse)
    async def RecallMessage(self, request: Any, context: Any) -> Any:
        """Cancel a pending timer message by the recall handle its send answered, at the
        broker that holds it (the official clients send this to their access point, any
        broker). Refusals answer what RocketMQ's proxy does: ``INTERNAL_SERVER_ERROR``
        with its broker's reason (docs/rocketmq5.md, "Recall")."""
        topic = raymq_name(request.topic)
        try:
            handle = RecallHandle.decode(request.recall_handle)
        except StatusError as exc:  # the client's bad handle, not a fault here
            raise _RecallRefused(exc.message) from exc
        if handle.topic != topic:
            raise _RecallRefused(
                f"recall failed, topic not match: the handle is of {handle.topic!r}"
            )
        try:
            if handle.broker == self.rt.config.broker_name:
                await self.sender.recall_timer(topic, handle.message_id, handle.deliver_ms)
            else:
                await self._recall_at(handle)
        except TimerRecallError as exc:
            raise _RecallRefused(f"recall failed, timestamp invalid: {exc}") from exc
        except BrokerUnavailableError as exc:
            raise _RecallRefused(f"recall failed, broker service not available: {exc}") from exc
        return spb.RecallMessageResponse(status=status(), message_id=handle.message_id)

    async def _recall_at(self, handle: RecallHandle) -> None:
        """Forward a recall to the master of the handle's broker, over Ray."""
        name = broker_actor_name(handle.broker, 0)
        try:
            peer = await self.rt.run(ray.get_actor, name, self.rt.config.namespace)
        except ValueError as exc:  # no such actor: not a broker of this cluster
            raise BrokerUnavailableError(f"no broker {handle.broker!r} here") from exc
        try:
            await asyncio.wait_for(
                peer.recall_timer.remote(handle.topic, handle.message_id, handle.deliver_ms),
                ROUTE_TIMEOUT_S,
            )
        except ray.exceptions.RayTaskError as exc:  # the peer's refusal, as it is
            raise exc.as_instanceof_cause() from None
        except (ray.exceptions.RayActorError, asyncio.TimeoutError) as exc:
            raise BrokerUnavailableError(f"broker {handle.broker!r}: {exc}") from exc

    # ------------------------------------------------------------ not served (yet)

    @_unary(spb.SyncLiteSubscriptionResponse)
    async def SyncLiteSubscription(self, request: Any, context: Any) -> Any:
        raise StatusError(pb.Code.NOT_IMPLEMENTED, "lite topics are not supported")

    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """Not served yet: one status (no client of the official ones calls it)."""
        try:
            self.authenticate(context)
            raise StatusError(pb.Code.NOT_IMPLEMENTED, "PullMessage is not supported yet")
        except Exception as exc:  # noqa: BLE001 - every error is an answer
            code, message = status_of(exc)
            self.refused("PullMessage", code, message, exc)
            yield spb.PullMessageResponse(status=status(code, message))


class _RecallRefused(StatusError):
    """A recall RocketMQ's broker refuses (``ILLEGAL_OPERATION`` there), which its proxy
    answers ``INTERNAL_SERVER_ERROR``: the client's to handle, not a fault here."""

    def __init__(self, message: str) -> None:
        super().__init__(pb.Code.INTERNAL_SERVER_ERROR, message)


def _handle_status(exc: BaseException) -> tuple[int, str]:
    """A refused receipt handle is ``INVALID_RECEIPT_HANDLE``; a malformed one too."""
    code, message = status_of(exc)
    if code == pb.Code.BAD_REQUEST:
        return pb.Code.INVALID_RECEIPT_HANDLE, message
    return code, message


def _seconds(s: int) -> Any:
    from google.protobuf.duration_pb2 import Duration

    return Duration(seconds=s)


def _born_host(context: Any) -> str:
    """The caller's ``ip:port`` (RocketMQ's born host) from gRPC's peer, IPv4 only."""
    peer = context.peer() or ""
    if peer.startswith("ipv4:"):
        return peer[5:]
    return "0.0.0.0:0"


class GrpcEndpoint:
    """The broker's gRPC server: started in the broker's ``_start``, on its event loop."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        sender: SendMessageProcessor,
        transactions: EndTransactionProcessor,
        producers: ProducerManager,
        tls: tuple[bytes, bytes] | None = None,
        pop: PopProcessor | None = None,
        groups: ConsumerManageProcessor | None = None,
        admin: AdminBrokerProcessor | None = None,
    ) -> None:
        c = runtime.config
        self.rt = runtime
        self.service = MessagingService(
            runtime,
            sender,
            transactions,
            producers,
            Authenticator(c.grpc_access_key, c.grpc_secret_key, c.grpc_auth_window_s),
            pop,
            groups,
            admin,
        )
        self.tls = tls
        self.addr = ""
        self._server: Any = None
        self._renewing: asyncio.Task[None] | None = None

    async def start(self) -> str:
        c = self.rt.config
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", c.grpc_max_receive_bytes),
                ("grpc.so_reuseport", 0),
                # calls waiting for the loop: queued up to this bound, not shed at random
                # (as CANCELLED) past core's default 1,000 (BrokerConfig.grpc_max_pending_calls)
                ("grpc.server.max_pending_requests", c.grpc_max_pending_calls),
                ("grpc.server.max_pending_requests_hard_limit", c.grpc_max_pending_calls),
            ]
        )
        sgrpc.add_MessagingServiceServicer_to_server(self.service, server)
        bind = c.grpc_bind or self.rt.node_ip
        where = f"{bind}:{c.grpc_port}"
        if self.tls is not None:
            key, cert = self.tls
            port = server.add_secure_port(where, grpc.ssl_server_credentials([(key, cert)]))
        else:
            port = server.add_insecure_port(where)
        await server.start()
        self._server = server
        renewer = self.service.renewer
        if renewer is not None:
            self._renewing = asyncio.get_running_loop().create_task(
                renewer.run(lambda: self.rt.closing)
            )
        host = self.rt.node_ip if bind in ("0.0.0.0", "") else bind
        self.addr = f"{host}:{port}"
        log.info(
            "broker %s serves RocketMQ 5 gRPC on %s%s",
            c.actor_name,
            self.addr,
            " (TLS)" if self.tls else "",
        )
        return self.addr

    async def stop(self, grace_s: float = 1.0) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
            self._renewing = None
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
