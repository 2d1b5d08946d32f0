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
import logging
from typing import Any

import grpc

from actors.broker.grpc.activity import Processors
from actors.broker.grpc.auth import Authenticator
from actors.broker.grpc.client_activity import ClientActivity
from actors.broker.grpc.lite_activity import LiteActivity
from actors.broker.grpc.offset_activity import OffsetActivity
from actors.broker.grpc.receive_activity import ReceiveActivity
from actors.broker.grpc.send_activity import SendActivity
from actors.broker.grpc.v2 import service_pb2_grpc as sgrpc
from actors.broker.runtime import BrokerRuntime

log = logging.getLogger("raymq.actors.broker.grpc")


class MessagingService(
    ClientActivity,
    SendActivity,
    ReceiveActivity,
    OffsetActivity,
    LiteActivity,
    sgrpc.MessagingServiceServicer,
):
    """The RPCs, onto one broker's processors: each group of them is an activity, as in
    RocketMQ's proxy (``client_activity``, ``send_activity``, ``receive_activity``,
    ``offset_activity``, ``lite_activity``; what they share is ``activity``)."""


class GrpcEndpoint:
    """The broker's gRPC server: started in the broker's ``_start``, on its event loop."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        processors: Processors,
        tls: tuple[bytes, bytes] | None = None,
    ) -> None:
        c = runtime.config
        self.rt = runtime
        self.service = MessagingService(
            runtime,
            processors,
            Authenticator(c.grpc_access_key, c.grpc_secret_key, c.grpc_auth_window_s),
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
