"""The broker's own socket (RocketMQ's ``NettyRemotingServer``): the data path's door.

Ray places the broker, restarts it and carries the control plane; sends, pulls,
offset commits, send-back, heartbeats and the ends of transactions come here instead,
over TCP, framed as ``actors.protocol.frames`` says. The listener runs on the actor's
own event loop and hands each request to the same processor a Ray method would, so
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

from actors.broker.consumer_manage import ConsumerManageProcessor
from actors.broker.pop import PopProcessor
from actors.broker.pull import PullMessageProcessor
from actors.broker.runtime import BrokerRuntime
from actors.broker.send import SendMessageProcessor
from actors.broker.transaction import TransactionProcessor, apply_decision
from actors.protocol import frames
from actors.protocol.frame_server import FrameServer
from actors.protocol.frames import Code

log = logging.getLogger("raymq.actors.broker.listener")


class DataPathListener(FrameServer):
    """Serves one broker's processors on ``node_ip:data_port`` (0: any free port)."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        sender: SendMessageProcessor,
        puller: PullMessageProcessor,
        groups: ConsumerManageProcessor,
        transactions: TransactionProcessor,
        ssl_context: ssl.SSLContext | None = None,
        pop: PopProcessor | None = None,
    ) -> None:
        cfg = runtime.config
        super().__init__(
            cfg.actor_name,
            cfg.data_bind or runtime.node_ip,
            cfg.data_port,
            cfg.max_frame_bytes,
            cfg.max_requests_per_connection,
            ssl_context,
        )
        self.rt = runtime
        self.sender = sender
        self.puller = puller
        self.groups = groups
        self.transactions = transactions
        self.pop = pop

    @property
    def closing(self) -> bool:
        return self.rt.closing

    async def start(self, advertised_host: str | None = None) -> None:
        await super().start(advertised_host or self.rt.node_ip)
        log.info("broker %s serves its data path on %s", self.name, self.addr)

    def _answer_now(
        self, code: int, h: dict[str, Any], body: bytes | memoryview
    ) -> tuple[dict[str, Any], list[Any], bool] | None:
        # a send to topics that exist, on an ASYNC_FLUSH master with nothing to wait for
        # (``SendMessageProcessor.send_now``); its answer after the held pulls it woke
        n = h.get("n", 0)
        if type(n) is not int or n:  # auto-creation: the general path
            return None
        if code == Code.SEND:
            done = self.sender.send_now(body)
        elif code == Code.SEND_SHARED:
            view = self.sender.ring_view(_ring(h.get("r")), h.get("x"), h.get("l"))
            if view is None:
                return {"u": 1}, [], False  # the producer stops using its ring here
            done = self.sender.send_now(view)
        else:
            return None
        if done is None:
            return None
        ack, woke = done
        return {}, [ack], woke

    async def _dispatch(
        self, code: int, h: dict[str, Any], body: bytes | memoryview
    ) -> tuple[dict[str, Any], list[Any]]:
        if code == Code.SEND:
            ack = await self.sender.send(body, _int(h.get("n", 0)))
            return {}, [ack]
        if code == Code.SEND_SHARED:
            shared = await self.sender.send_shared(
                _ring(h.get("r")), h.get("x"), h.get("l"), _int(h.get("n", 0))
            )
            return ({"u": 1}, []) if shared is None else ({}, [shared])
        if code == Code.PULL:
            answer = await self.puller.pull_packed(body)
            return {}, answer if isinstance(answer, list) else [answer]
        if code == Code.COMMIT_OFFSETS:
            offsets = {(t, q): o for t, q, o in _triples(h.get("q", _MISSING))}
            tokens = {(t, q): (e, g) for t, q, e, g in _rows(h.get("k", _MISSING), 4)} or None
            n = await self.groups.commit_offsets(
                h.get("g", _MISSING), offsets, h.get("i", ""), tokens
            )
            return {"r": n}, []
        if code == Code.SEND_BACK:
            outcome = await self.sender.consumer_send_msg_back(
                h.get("g", _MISSING),
                h.get("q", _MISSING),
                h.get("x", _MISSING),
                h.get("t", _MISSING),
            )
            return {"r": outcome}, []
        if code == Code.HEARTBEAT:
            await self.groups.heartbeat(
                h.get("g", _MISSING),
                h.get("i", _MISSING),
                h.get("t", _MISSING),
                h.get("l", _MISSING),
            )
            return {}, []
        if code == Code.UNREGISTER:
            await self.groups.unregister_consumer(h.get("g", _MISSING), h.get("i", _MISSING))
            return {}, []
        if code == Code.END_TRANSACTION:
            ended = await self.transactions.end_transaction(
                h.get("g", _MISSING),
                h.get("q", _MISSING),
                h.get("i", _MISSING),
                h.get("m", _MISSING),
            )
            return {"r": ended}, []
        if code == Code.END_TRANSACTION_BATCH:
            wire = h.get("k")
            by_group: dict[str, dict[tuple[str, int], int]] | None = None
            if wire is not None:
                if not isinstance(wire, dict):
                    raise frames.FrameError(f"expected offsets by group, got {wire!r:.80}")
                by_group = {g: {(t, q): o for t, q, o in _triples(qs)} for g, qs in wire.items()}
            count = await apply_decision(
                self.transactions,
                self.groups,
                h.get("x", _MISSING),
                h.get("m", _MISSING),
                h.get("q"),
                by_group,
                h.get("i"),
                h.get("e"),
                h.get("y", False),
            )
            return {"r": count}, []
        if code == Code.TXN_COMMIT_ONE_PHASE:
            one: dict[str, Any] = await self.transactions.one_phase.commit(
                h.get("x", _MISSING), h.get("i", _MISSING), h.get("e", _MISSING), body, h.get("k")
            )
            return {"r": one}, []
        if code == Code.END_TRANSACTIONS:
            ends = [tuple(e) for e in _rows(h.get("q", _MISSING), 3)]
            return {"r": await self.transactions.end_transactions(h.get("g", _MISSING), ends)}, []
        if code in (Code.POP, Code.ACK, Code.CHANGE_INVISIBLE):
            return await self._pop_request(code, h)
        raise frames.FrameError(f"unknown request code {code}")

    async def _pop_request(self, code: int, h: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        """POP receive, ack and change of invisible time (``actors.broker.pop``): every
        field goes to the processor, whose checks refuse a wrong one before anything
        changes; a receive answers the records as stored, the handles in the header."""
        pop = self.pop
        if pop is None:
            raise frames.FrameError(f"request code {code}: this broker serves no POP")
        group, topic = h.get("g", _MISSING), h.get("t", _MISSING)
        if code == Code.POP:
            heads, records = await pop.pop_packed(
                group,
                topic,
                h.get("n", _MISSING),
                h.get("i", _MISSING),
                h.get("w", 0),
                fifo=h.get("ff", False),
                tag_expr=h.get("x", "*"),
                client_id=h.get("id", ""),
            )
            return {"r": heads}, [records] if records else []
        handle = h.get("h", _MISSING)
        if code == Code.ACK:
            if isinstance(handle, list):
                return {"r": await pop.ack_many(group, topic, handle)}, []
            await pop.ack(group, topic, handle)
            return {}, []
        new = await pop.change_invisible(group, topic, handle, h.get("i", _MISSING))
        return {"r": new}, []


_MISSING: Any = None  # a field a request left out: the processor's own checks name it


def _ring(value: object) -> Any:
    """A shared ring's id as msgpack carries it (a list): the tuple the ring reader checks."""
    return tuple(value) if isinstance(value, list) else value


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise frames.FrameError(f"expected an int, got {value!r:.80}")
    return value


def _rows(value: object, width: int) -> list[tuple[Any, ...]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(r, list) and len(r) == width for r in value
    ):
        raise frames.FrameError(f"expected rows of {width}, got {value!r:.80}")
    return [tuple(r) for r in value]


def _triples(value: object) -> list[tuple[Any, ...]]:
    return _rows(value, 3)
