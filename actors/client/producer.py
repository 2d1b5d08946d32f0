"""The Producer: the public face of sending, wiring the parts that do it.

Messages are validated and encoded on the client (:mod:`.encoder`: the store's
own rules and errors) and go to the broker as one blob per batch, one queue per
batch, over the broker's own socket (``actors.protocol.data_path``; Ray is the
control plane, ``data_path="ray"`` keeps sends on Ray calls). Queues are picked
round robin over the topic's write queues, skipping brokers that failed or
answered slowly a moment ago (latency fault tolerance); with a ``sharding_key``
the same key always maps to the same queue (:mod:`.queue_selector`).

Sends are idempotent by default (``enable_idempotence``, :mod:`.idempotence`):
each chunk is numbered per queue and the broker stores a numbered run once, so a
send that may have been stored is retried only on its own queue, as the same
bytes, and never stored twice; one that certainly never left is retried on
another broker (``retry_times_when_send_failed``, default 2; :mod:`.sender`).
With ``enable_idempotence=False`` a retry after a timeout may store a message
twice: delivery is at least once, as in RocketMQ. How one call reaches a broker
(the socket data path, a Ray call, or a co-located broker's shared memory ring)
is the :mod:`.transport`'s business.

Single ``send_async`` messages are coalesced into batches (:mod:`.coalescer`),
batches waiting behind a broker's calls leave merged (:mod:`.send_lanes`), and
what ``send_async`` holds unanswered is bounded (:mod:`.backpressure`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actors.client.backpressure import AsyncSendBudget
from actors.client.coalescer import SendCoalescer
from actors.client.encoder import MessageEncoder
from actors.client.fault import LatencyFaultTolerance
from actors.client.idempotence import Sequencer
from actors.client.instance import SharedClient
from actors.client.queue_selector import QueueSelector
from actors.client.send_result import BatchSendResult, SendResult
from actors.client.sender import Sender
from actors.client.transport import BrokerTransport
from actors.config.client import ProducerConfig
from actors.config.options import with_options
from actors.protocol.names import DEFAULT_NAMESPACE
from actors.protocol.route import TopicRouteData
from actors.protocol.shared_ring import SharedRing
from rebalance import MessageQueue
from storage.codec import EncodedBatch
from storage.errors import BrokerUnavailableError, InvalidMessageError
from storage.message import Message
from storage.properties import PROP_TIMER_DELAY_SEC, PROP_TIMER_DELIVER_MS

log = logging.getLogger("raymq.actors.producer")


def with_delay(messages: Sequence[Message], delay_s: float) -> list[Message]:
    """The messages to be delivered ``delay_s`` seconds from now (``deliver_at_ms``)."""
    if (
        not isinstance(delay_s, (int, float))
        or isinstance(delay_s, bool)
        or not math.isfinite(delay_s)
        or delay_s < 0
    ):
        raise InvalidMessageError(f"delay_s={delay_s!r}: must be a number of seconds >= 0")
    at = math.ceil((time.time() + delay_s) * 1000)
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Message):
            raise InvalidMessageError(
                f"message {i}: expected storage.Message, got {type(m).__name__}"
            )
        props = {k: v for k, v in (m.properties or {}).items() if k != PROP_TIMER_DELAY_SEC}
        props[PROP_TIMER_DELIVER_MS] = str(at)
        out.append(dataclasses.replace(m, properties=props))
    return out


def _short_list(messages: Any, most: int) -> tuple[list[Message], int] | None:
    """``messages`` as a list and its bodies' size when it is a short list of plain
    messages of one topic (the coalescer's), else None (sent as a batch of its own;
    what is wrong with it raises there)."""
    if not isinstance(messages, (list, tuple)) or not 0 < len(messages) <= most:
        return None
    first = messages[0]
    if first.__class__ is not Message:
        return None
    if len(messages) == 1:  # the commonest short list: no loop, one copy
        try:
            return [first], len(first.body)
        except TypeError:
            return None
    topic, nbytes = first.topic, 0
    for m in messages:
        if m.__class__ is not Message or m.topic != topic:
            return None
        try:
            nbytes += len(m.body)
        except TypeError:
            return None
    return list(messages), nbytes


class ProducerCore(SharedClient):
    """What every producer (threaded or asyncio) sets up: its config (``ProducerConfig``
    fields may be given as keywords), its share of the client instance, the brokers it
    isolates after failures and its queue selector."""

    def __init__(
        self,
        group: str = "DEFAULT_PRODUCER",
        *,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        config: ProducerConfig | None = None,
        **options: Any,
    ) -> None:
        self.config = with_options(config or ProducerConfig(), options)
        self._join("producer", group, namespace, nameservers, self.config)
        self.fault = LatencyFaultTolerance(self.config.fault_isolation_s)
        self._selector = QueueSelector(self.ns, self.fault, self.config)
        self._setup()

    def _setup(self) -> None:
        """The rest of the producer's own parts (its way of sending)."""
        raise NotImplementedError


class Producer(ProducerCore):
    """Sends messages to a RayMQ cluster; usable from a driver, a task or an actor."""

    def _setup(self) -> None:
        self._transport = BrokerTransport(self.ns, self.config)
        self._send_timeout_s = self.config.send_timeout_s
        self._budget = AsyncSendBudget(
            self.config.async_send_max_messages, self.config.async_send_max_bytes
        )
        self.sequencer = Sequencer(self._allocate_id) if self.config.enable_idempotence else None
        self._encoder = MessageEncoder(self.config, self.sequencer)
        self._sender = Sender(
            self.config, self._selector, self._transport, self.fault, self._budget, self.sequencer
        )
        self._coalescer = SendCoalescer(
            self._send_batch_async,
            max_batch=self.config.max_batch_messages,
            release=self._budget.release,
            max_bytes=self.config.max_batch_bytes,
            send_one=self._send_one_async,
        )

    # ------------------------------------------------------------ public API
    def send(
        self,
        message: Message,
        *,
        sharding_key: str | None = None,
        timeout_s: float | None = None,
        delay_s: float | None = None,
    ) -> SendResult:
        """Send one message and wait for the broker's answer.

        ``delay_s``: deliver it that many seconds from now (a timer message: any delay,
        within about a second, up to the brokers' ``timer_max_delay_ms``; RocketMQ 5's
        ``TIMER_DELIVER_MS``). ``Message(deliver_at_ms=...)`` names the time instead."""
        return self.send_batch(
            [message], sharding_key=sharding_key, timeout_s=timeout_s, delay_s=delay_s
        )[0]

    def send_batch(
        self,
        messages: Sequence[Message],
        *,
        sharding_key: str | None = None,
        timeout_s: float | None = None,
        delay_s: float | None = None,
    ) -> BatchSendResult:
        """Send many messages: one Ray call per (topic, chunk), chunks in flight together.
        ``delay_s`` delays every one of them (see :meth:`send`)."""
        if delay_s is not None:
            messages = with_delay(messages, delay_s)
        return self._sender.send_chunks(
            self._encoder.encode(messages), len(messages), sharding_key, timeout_s
        )

    def _send_marked(
        self, messages: Sequence[Message], marks: Mapping[str, str]
    ) -> BatchSendResult:
        """``send_batch`` of messages that all carry ``marks`` on top of their own
        properties (a transaction's): encoded once per batch, not copied per message."""
        return self._sender.send_chunks(
            self._encoder.encode(messages, shared=marks), len(messages), None, None
        )

    def send_encoded(
        self, batches: Sequence[EncodedBatch], *, timeout_s: float | None = None
    ) -> BatchSendResult:
        """Send batches encoded already (one topic each, e.g. by the Arrow encoder of
        ``actors.bridge``) as ``send_batch`` sends its chunks: one Ray call per batch,
        in flight together, retried on another broker when Ray cannot deliver."""
        chunks = self._encoder.encoded(batches)
        total = sum(len(c.batch) for c in chunks)
        return self._sender.send_chunks(chunks, total, None, timeout_s)

    def send_async(
        self,
        messages: Message | Sequence[Message],
        *,
        sharding_key: str | None = None,
        delay_s: float | None = None,
    ) -> concurrent.futures.Future[Any]:
        """Send without waiting: a future of a :class:`SendResult` (one message) or a
        :class:`BatchSendResult` (a list). Failed sends are retried on another broker.
        ``delay_s`` delays delivery (see :meth:`send`).

        Invalid messages raise here. So does :class:`ProducerBusyError` when
        ``async_send_max_messages`` / ``_bytes`` stay full for ``send_timeout_s``: the
        call waits for earlier sends to be answered first, as RocketMQ's backpressure does.
        """
        if messages.__class__ is Message and sharding_key is None and delay_s is None:
            # the commonest call, one plain message: coalesced with its neighbours
            try:
                nbytes = len(messages.body)  # type: ignore[union-attr]
            except TypeError:  # not bytes: the coalesced batch's validation names it
                nbytes = 0
            self._budget.acquire(1, nbytes, self._send_timeout_s)
            return self._coalescer.submit(messages, nbytes)  # type: ignore[arg-type]
        if delay_s is not None:
            delayed = with_delay([messages] if isinstance(messages, Message) else messages, delay_s)
            messages = delayed[0] if isinstance(messages, Message) else delayed
        single = isinstance(messages, Message)
        if isinstance(messages, Message) and sharding_key is None:
            # one message at a time: coalesce with its neighbours into batches
            try:
                nbytes = len(messages.body)
            except TypeError:  # not bytes: the coalesced batch's validation names it
                nbytes = 0
            self._budget.acquire(1, nbytes, self.config.send_timeout_s)
            return self._coalescer.submit(messages, nbytes)  # given back when answered
        if sharding_key is None and not single:
            short = _short_list(messages, self.config.coalesce_list_max)
            if short is not None:  # a few messages of one topic: merged as single ones are
                msgs, nbytes = short
                self._budget.acquire(len(msgs), nbytes, self.config.send_timeout_s)
                return self._coalescer.submit_list(msgs, nbytes)
        return self._send_batch_async(
            [messages] if isinstance(messages, Message) else list(messages),
            single,
            sharding_key,
            budgeted=True,
        )

    def _send_batch_async(
        self,
        msgs: list[Message],
        single: bool = False,
        sharding_key: str | None = None,
        budgeted: bool = False,
    ) -> concurrent.futures.Future[Any]:
        """``msgs`` sent asynchronously: the coalescer's batches, and ``send_async``'s
        lists (``budgeted``: those wait for room in the async budget)."""
        chunks = self._encoder.encode(msgs)  # validation errors raise here, before anything is sent
        return self._sender.send_chunks_async(chunks, len(msgs), single, sharding_key, budgeted)

    def _send_one_async(
        self, message: Message, on_done: Callable[[Any, BaseException | None], None]
    ) -> None:
        """The coalescer's batch of one message: ``on_done(SendResult, None)`` or
        ``on_done(None, error)`` when answered (validation errors raise here)."""
        (chunk,) = self._encoder.encode([message])
        self._sender.send_one_async(chunk, on_done)

    def send_oneway(self, messages: Message | Sequence[Message]) -> None:
        """Fire and forget: no answer is awaited and no failure is reported."""
        msgs = [messages] if isinstance(messages, Message) else list(messages)
        self._sender.send_oneway(self._encoder.encode(msgs, numbered=False))

    def _allocate_id(self, route: TopicRouteData, broker_name: str) -> str:
        """A producer id from ``broker_name``'s master (the sequencer's first send)."""
        from actors.protocol import rpc

        try:
            handle = self.ns.broker(route, broker_name)
            return str(rpc.get(handle.allocate_producer_id.remote(), self.config.send_timeout_s))
        except Exception as exc:  # noqa: BLE001 - the send fails over as one never sent
            raise BrokerUnavailableError(
                f"no producer id from broker {broker_name!r}: {exc}"
            ) from exc

    def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        """The queues a send to ``topic`` may go to now."""
        route, _ = self._selector.route(topic)
        return list(self._selector.write_queues(route))

    def delay_level_for(self, seconds: float) -> int:
        """The cluster's delay level for a delay of ``seconds``, rounded up to the next
        level (0 for none; the top level past it): ``Message(..., delay_level=...)``."""
        from actors.client.delay import broker_levels_ms, level_for_seconds

        return level_for_seconds(seconds, broker_levels_ms(self.ns))

    def close(self, timeout_s: float | None = None) -> None:
        """Wait for the answers of ``send_async`` calls still out (batches may still be
        waiting for their turn on the wire), up to ``timeout_s`` (default: twice the
        send timeout, room for a retry), then release the producer's threads."""
        timeout = 2 * self.config.send_timeout_s if timeout_s is None else timeout_s
        if not self._budget.wait_empty(timeout):
            messages, _ = self._budget.in_flight
            log.warning(
                "producer %s closed with %d async messages unanswered", self.group, messages
            )
        self._sender.close()
        self._transport.close()
        self._leave()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the transport's rings, as the shared-ring tests (in other rooms) look at them
    @property
    def _rings(self) -> dict[str, SharedRing]:
        return self._transport.rings

    @property
    def _ringless(self) -> set[str]:
        return self._transport.ringless
