"""The plumbing every group of RPCs of the gRPC ``MessagingService`` shares
(``actors.broker.grpc.service``): the processors it serves onto, authentication,
answering every error as a RocketMQ status.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from actors.broker.client.producer_manager import ProducerManager
from actors.broker.grpc.auth import Authenticator
from actors.broker.grpc.convert import (
    StatusError,
    status,
    status_of,
    transaction_check_message,
)
from actors.broker.grpc.renew import AutoRenewer
from actors.broker.grpc.v2 import definition_pb2 as pb
from actors.broker.grpc.v2 import service_pb2 as spb
from actors.broker.lite.processor import LiteProcessor
from actors.broker.processor.admin import AdminBrokerProcessor
from actors.broker.processor.consumer_manage import ConsumerManageProcessor
from actors.broker.processor.end_transaction import EndTransactionProcessor
from actors.broker.processor.pop import PopProcessor
from actors.broker.processor.send import SendMessageProcessor
from actors.broker.runtime import BrokerRuntime
from storage.message import Message

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
ROUTE_TIMEOUT_S = 3.0
MAX_RECEIVE_BATCH = 32


def unary(
    response: Callable[..., R],
) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """Authenticate the call, run it, and answer any error as a RocketMQ status."""

    def wrap(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        @functools.wraps(fn)
        async def call(self: Activity, request: Any, context: Any) -> R:
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
    a producer: ``TransactionalMessageCheckService`` calls ``handle.check.remote(broker,
    offset, msg_id, message)`` (as on a native producer's relay actor), which sends the
    client a ``RecoverOrphanedTransactionCommand``; its answer comes back as an
    EndTransaction."""

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


class RecallRefused(StatusError):
    """A recall RocketMQ's broker refuses (``ILLEGAL_OPERATION`` there), which its proxy
    answers ``INTERNAL_SERVER_ERROR``: the client's to handle, not a fault here."""

    def __init__(self, message: str) -> None:
        super().__init__(pb.Code.INTERNAL_SERVER_ERROR, message)


@dataclass(frozen=True)
class Processors:
    """The broker's processors the RPCs serve onto; None for one the broker runs
    without (the RPCs that need it are then refused)."""

    sender: SendMessageProcessor
    transactions: EndTransactionProcessor
    producers: ProducerManager
    pop: PopProcessor | None = None
    groups: ConsumerManageProcessor | None = None
    admin: AdminBrokerProcessor | None = None
    lite: LiteProcessor | None = None


class Activity:
    """What every group of RPCs shares: the broker's processors, the call counts,
    authentication and how a refusal is logged (RocketMQ's proxy ``AbstractMessingActivity``)."""

    def __init__(self, runtime: BrokerRuntime, processors: Processors, auth: Authenticator) -> None:
        self.rt = runtime
        self.auth = auth
        self.sender = processors.sender
        self.transactions = processors.transactions
        self.producers = processors.producers
        self.pop = pop = processors.pop
        self.groups = processors.groups
        self.admin = processors.admin
        self.lite = processors.lite
        # lite topics (actors.broker.grpc.lite_activity): each client's (group, parent)
        # subscriptions, the receives waiting on a parent, the acks committing a lite topic
        self._lite_clients: dict[str, set[tuple[str, str]]] = {}
        self._lite_waiting: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        self._lite_acking: dict[tuple[str, str, str], list[Any]] = {}
        self._listening = False
        c = runtime.config
        self.renewer = (
            AutoRenewer(pop, c.grpc_renew_invisible_s, c.grpc_renew_ahead_s, c.grpc_renew_max_s)
            if pop is not None
            else None
        )
        self._round_robin = itertools.count()
        self.stats = {"calls": 0, "refused": 0, "unauthorized": 0}
        self._publishers: dict[str, TelemetryStream] = {}  # client id -> its stream
        self._lite_streams: dict[str, TelemetryStream] = {}  # a lite consumer's stream
        if self.lite is not None:
            self.lite.consumers.ended_listener = self._lite_ended

    def _lite_ended(self, client: str, lite_topics: list[str]) -> None:
        """The subscriptions of ``client`` to these lite topics ended (a delete or an
        expiry; any thread): its Telemetry stream, if it has one here, tells it to
        unsubscribe them, so its resync does not create them again (RocketMQ's
        ``NotifyUnsubscribeLiteCommand``)."""
        if client in self._lite_streams:
            self.rt.loop.call_soon_threadsafe(self._notify_unsubscribe, client, lite_topics)

    def _notify_unsubscribe(self, client: str, lite_topics: list[str]) -> None:
        stream = self._lite_streams.get(client)
        if stream is None:
            return
        for name in lite_topics:
            command = spb.NotifyUnsubscribeLiteCommand(lite_topic=name)
            stream.out.put_nowait(spb.TelemetryCommand(notify_unsubscribe_lite_command=command))

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
            exc, RecallRefused
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
