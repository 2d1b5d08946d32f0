"""The broker's own socket (RocketMQ's ``NettyRemotingServer``): the data path's door.

Ray places the broker, restarts it and carries the control plane; sends, pulls,
offset commits, send-back, heartbeats and the ends of transactions come here instead,
over TCP, framed as ``actors.protocol.frames`` says. The listener runs on the actor's
own event loop and hands each request to the coroutine its declaration names
(``actors.protocol.requests``): the Broker's own Ray method, or the processor's, so
both doors behave alike. Requests on one connection run concurrently and are answered
in whatever order they finish (a held pull does not hold up a send behind it).

A connection must prove it belongs to the cluster (HMAC over the broker's secret,
which clients get through Ray) before the broker reads anything else from it
(``actors.protocol.frame_server``, shared with the transaction coordinator's door). A
frame over ``max_frame_bytes`` or malformed closes the connection; no processor sees it.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

from actors.broker.lite.processor import LiteProcessor
from actors.broker.processor.send import SendMessageProcessor
from actors.broker.runtime import BrokerRuntime
from actors.protocol import requests
from actors.protocol.frame_server import FrameServer
from actors.protocol.requests.lite import LITE_SEND
from actors.protocol.requests.send import SEND, SEND_SHARED

log = logging.getLogger("raymq.actors.broker.listener")


class DataPathListener(FrameServer):
    """Serves one broker's requests (``requests.BROKER``) on ``node_ip:data_port`` (0: any
    free port): each to the coroutine its declaration names, found on ``broker`` (the
    Broker actor: its Ray method, or one of its processors')."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        broker: object,
        sender: SendMessageProcessor,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        cfg = runtime.config
        super().__init__(
            cfg.actor_name,
            requests.Dispatch(broker, requests.BROKER),
            cfg.data_bind or runtime.node_ip,
            cfg.data_port,
            cfg.max_frame_bytes,
            cfg.max_requests_per_connection,
            ssl_context,
        )
        self.rt = runtime
        self.sender = sender
        self.lite: LiteProcessor | None = getattr(broker, "lite", None)

    @property
    def closing(self) -> bool:
        return self.rt.closing

    async def start(self, advertised_host: str | None = None, local_socket: bool = True) -> None:
        """Listen on ``advertised_host`` (the node's IP) and, unless ``local_socket`` or
        the broker's ``data_local_socket`` is off, on a Unix socket for its node."""
        await super().start(
            advertised_host or self.rt.node_ip,
            local_socket=local_socket and self.rt.config.data_local_socket,
        )
        log.info("broker %s serves its data path on %s", self.name, self.addr)

    def _answer_now(
        self, code: int, h: dict[str, Any], body: bytes | memoryview
    ) -> tuple[dict[str, Any], list[Any], bool] | None:
        # a send to topics that exist, on an ASYNC_FLUSH master with nothing to wait for
        # (``SendMessageProcessor.send_now``); a lite send there too
        # (``LiteProcessor.send_now``); its answer after the held reads it woke
        if code == LITE_SEND.code:
            if self.lite is None:
                return None
            (parent, items), _ = LITE_SEND.decode(h, body)
            sent = self.lite.send_now(parent, items)
            if sent is None:
                return None
            answer, woke = sent
            return *LITE_SEND.answer.reply(answer), woke
        if code == SEND.code:
            (blob, auto_create), _ = SEND.decode(h, body)
            if auto_create:  # auto-creation: the general path
                return None
            done = self.sender.send_now(blob)
        elif code == SEND_SHARED.code:
            (ring, offset, length, auto_create), _ = SEND_SHARED.decode(h, body)
            if auto_create:
                return None
            view = self.sender.ring_view(ring, offset, length)
            if view is None:
                return SEND_SHARED.answer.reply(None) + (False,)  # it stops using its ring here
            done = self.sender.send_now(view)
        else:
            return None
        if done is None:
            return None
        ack, woke = done
        return *SEND.answer.reply(ack), woke
