"""The broker's own socket (RocketMQ's ``NettyRemotingServer``): the data path's door.

Ray places the broker, restarts it and carries the control plane; sends, pulls,
offset commits, send-back and heartbeats come here instead, over TCP, framed as
``actors.protocol.frames`` says. The listener runs on the actor's own event loop
and hands each request to the same processor a Ray method would, so both doors
behave alike. Requests on one connection run concurrently and are answered in
whatever order they finish (a held pull does not hold up a send behind it).

A connection must prove it belongs to the cluster (HMAC over the broker's secret,
which clients get through Ray) before the broker reads anything else from it, and
at most ``HANDSHAKE_MAX_BYTES`` until then. A frame over ``max_frame_bytes`` or
malformed closes the connection; no processor sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl
from typing import Any

from actors.broker.consumer_manage import ConsumerManageProcessor
from actors.broker.pop import PopProcessor
from actors.broker.pull import PullMessageProcessor
from actors.broker.runtime import BrokerRuntime
from actors.broker.send import SendMessageProcessor
from actors.broker.transaction import TransactionProcessor, apply_decision
from actors.protocol import frames
from actors.protocol.errors import AnswerDroppedError
from actors.protocol.frames import Code, Flag
from storage.errors import RayMQError

log = logging.getLogger("raymq.actors.broker.listener")


class DataPathListener:
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
        self.rt = runtime
        self.sender = sender
        self.puller = puller
        self.groups = groups
        self.transactions = transactions
        self.pop = pop
        self.ssl_context = ssl_context
        self.secret = secrets.token_bytes(32)
        """This incarnation's secret: clients get it through Ray (``Broker.data_path``)."""
        self.max_frame_bytes = runtime.config.max_frame_bytes
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.stats = {
            "connections": 0,
            "refused": 0,
            "requests": 0,
            "bad_frames": 0,
            "paused_reads": 0,
        }

    @property
    def addr(self) -> str:
        return f"{self.rt.node_ip}:{self.port}" if self.port else ""

    async def start(self) -> None:
        cfg = self.rt.config
        self._server = await asyncio.start_server(
            self._serve,
            host=cfg.data_bind or self.rt.node_ip,
            port=cfg.data_port,
            ssl=self.ssl_context,
            limit=1 << 20,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("broker %s serves its data path on %s", cfg.actor_name, self.addr)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._conns):
            writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)
        self._server = None

    # ------------------------------------------------------------ a connection
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            if not await self._handshake(reader, writer):
                self.stats["refused"] += 1
                log.warning("%s: refused a data-path connection from %s", self._name, peer)
                return
            self.stats["connections"] += 1
            self._conns.add(writer)
            await self._serve_frames(reader, writer, peer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
            return
        finally:
            self._conns.discard(writer)
            writer.close()

    async def _serve_frames(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Any
    ) -> None:
        """A proved connection's requests, parsed as they arrive (``frames.FrameReader``),
        each run as its own task, until the connection ends."""
        transport = writer.transport
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tasks: set[asyncio.Task[None]] = set()

        cap = self.rt.config.max_requests_per_connection
        paused = False

        def ended(task: asyncio.Task[None]) -> None:
            nonlocal paused
            tasks.discard(task)
            if paused and len(tasks) < cap and not transport.is_closing():
                paused = False
                proto.resume()

        def on_frame(header: dict[str, Any], body: bytes | memoryview) -> None:
            nonlocal paused
            if self.rt.closing:
                transport.close()
                return
            task = asyncio.ensure_future(self._request(header, body, transport, proto))
            tasks.add(task)
            task.add_done_callback(ended)
            if len(tasks) >= cap and not paused:  # read no more until some end
                paused = True
                self.stats["paused_reads"] += 1
                proto.pause()

        def on_error(exc: frames.FrameError) -> None:
            self.stats["bad_frames"] += 1
            log.warning("%s: closing %s: %s", self._name, peer, exc)

        def on_lost(exc: Exception | None) -> None:
            if not lost.done():
                lost.set_result(None)

        proto = frames.FrameReader(transport, self.max_frame_bytes, on_frame, on_error, on_lost)
        transport.set_protocol(proto)
        leftover = bytes(getattr(reader, "_buffer", b""))  # requests sent right behind AUTH
        if leftover:
            proto.feed(leftover)
        await lost

    @property
    def _name(self) -> str:
        return self.rt.config.actor_name

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        mine = frames.nonce()
        writer.writelines(frames.encode({"c": int(Code.HELLO), "o": 0, "n": mine}))
        try:
            header, _ = await asyncio.wait_for(
                frames.read_frame(reader, frames.HANDSHAKE_MAX_BYTES), frames.HANDSHAKE_TIMEOUT_S
            )
        except (frames.FrameError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            return False
        theirs = header.get("n")
        if (
            header.get("c") != Code.AUTH
            or not isinstance(theirs, bytes)
            or len(theirs) != frames.NONCE_BYTES
            or not frames.check_proof(self.secret, b"client", mine, theirs, header.get("p"))
        ):
            return False
        reply = {"c": int(Code.OK), "o": 0, "p": frames.proof(self.secret, b"broker", theirs, mine)}
        writer.writelines(frames.encode(reply))
        return True

    # ------------------------------------------------------------ a request
    async def _request(
        self,
        header: dict[str, Any],
        body: bytes | memoryview,
        transport: asyncio.WriteTransport,
        proto: frames.FrameReader,
    ) -> None:
        self.stats["requests"] += 1
        opaque = header["o"]
        try:
            fields, parts = await self._dispatch(header["c"], header, body)
            reply = {"c": int(Code.OK), **fields}
        except AnswerDroppedError:  # an injected fault: the connection goes, unanswered
            transport.abort()
            return
        except RayMQError as exc:
            reply, parts = frames.error_fields(exc), []
        except Exception as exc:  # noqa: BLE001 - the client hears of it; the broker goes on
            log.exception("%s: data-path request %s failed", self._name, header.get("c"))
            reply, parts = frames.error_fields(exc), []
        if header.get("f", 0) & Flag.ONEWAY or transport.is_closing():
            return
        reply.update(o=opaque, f=int(Flag.RESPONSE))
        frames.write_frame(transport, reply, parts)
        await proto.drain()

    async def _dispatch(
        self, code: int, h: dict[str, Any], body: bytes | memoryview
    ) -> tuple[dict[str, Any], list[Any]]:
        if code == Code.SEND:
            ack = await self.sender.send(body, _int(h.get("n", 0)))
            return {}, [ack]
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
            )
            return {"r": count}, []
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
