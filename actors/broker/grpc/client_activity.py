"""Routes and clients over gRPC: ``QueryRoute``, ``QueryAssignment``, ``Heartbeat``,
``NotifyClientTermination`` and ``Telemetry`` (settings, and the orphaned-transaction
checks a publisher's stream carries).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

from actors.broker.grpc.activity import (
    ACCEPT_TYPES,
    ROUTE_TIMEOUT_S,
    TRANSACTION_GROUP_PREFIX,
    TelemetryStream,
    unary,
)
from actors.broker.grpc.convert import (
    StatusError,
    raymq_name,
    status,
    status_of,
)
from actors.broker.grpc.lite_activity import LITE_CLIENT_TYPES, LiteActivity
from actors.broker.grpc.v2 import definition_pb2 as pb
from actors.broker.grpc.v2 import service_pb2 as spb
from actors.protocol.route import TopicRouteData
from actors.protocol.topic import is_readable, is_writeable


def _endpoints(addr: str) -> pb.Endpoints:
    host, _, port = addr.rpartition(":")
    return pb.Endpoints(
        scheme=pb.AddressScheme.IPv4, addresses=[pb.Address(host=host, port=int(port))]
    )


def _permission(read: bool, write: bool) -> int:
    if read and write:
        return pb.Permission.READ_WRITE
    return pb.Permission.READ if read else pb.Permission.WRITE if write else pb.Permission.NONE


def _seconds(s: int) -> Any:
    from google.protobuf.duration_pb2 import Duration

    return Duration(seconds=s)


class ClientActivity(LiteActivity):
    """Routes, assignments, heartbeats and each client's Telemetry stream (RocketMQ's proxy
    ``RouteActivity`` and ``ClientActivity``)."""

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
    @unary(spb.QueryRouteResponse)
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        topic = raymq_name(request.topic)
        route = await self._route(topic)
        queues = self._queues(request.topic, route) if route is not None else []
        if not queues:
            raise StatusError(pb.Code.TOPIC_NOT_FOUND, f"topic {topic!r} has no gRPC route")
        return spb.QueryRouteResponse(status=status(), message_queues=queues)

    @unary(spb.QueryAssignmentResponse)
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

    @unary(spb.HeartbeatResponse)
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

    @unary(spb.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        if request.HasField("group"):
            group = raymq_name(request.group, "group")
            client = self.client_id(context)
            if client:
                self.rt.consumers.unregister(group, client)
        if self.renewer is not None:  # what it still held lapses and goes to the others
            self.renewer.forget_client(self.client_id(context))
        await self.release_lite(self.client_id(context))  # its lite topics pass on too
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
                        if command.settings.client_type in LITE_CLIENT_TYPES:
                            self._lite_streams[stream.client_id] = stream
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
            if self._lite_streams.get(stream.client_id) is stream:
                del self._lite_streams[stream.client_id]

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
            if client.client_type in LITE_CLIENT_TYPES:
                self.lite_settings(out)
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
