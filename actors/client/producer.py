"""The Producer: route lookup, queue selection, batched sends with retries.

Messages are validated and encoded on the client (``storage.codec.encode_batch``,
the store's own rules and errors) and cross Ray as one blob per batch, one
queue per batch. Queues are picked round robin over the topic's write queues,
skipping brokers that failed or answered slowly a moment ago (latency fault
tolerance); with a ``sharding_key`` the same key always maps to the same queue.
A sync send that Ray cannot deliver is retried on another broker
(``retry_times_when_send_failed``, default 2). A retry after a timeout may store
a message twice: delivery is at least once, as in RocketMQ.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import functools
import itertools
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayError

from actors.client.backpressure import AsyncSendBudget
from actors.client.coalescer import SendCoalescer
from actors.client.fault import LatencyFaultTolerance
from actors.client.send_lanes import SendLanes
from actors.client.send_result import BatchSendResult, SendResult, _arg, _Chunk
from actors.config.client import ProducerConfig
from actors.config.options import with_options
from actors.namesrv.client import NameServerClient
from actors.protocol import rpc as _rpc
from actors.protocol.names import DEFAULT_NAMESPACE
from actors.protocol.route import QueueData, TopicRouteData
from actors.protocol.shared_ring import SharedCall, SharedRing, pass_on
from actors.protocol.topic import (
    AUTO_CREATE_TOPIC_KEY,
    PERM_READ,
    PERM_WRITE,
    SYSTEM_TOPICS,
    is_writeable,
)
from actors.protocol.wire import OUT_OF_BAND_BYTES, SendAck
from rebalance import MessageQueue
from storage import codec
from storage._fast_encode import encode_plain
from storage.codec import EncodedBatch, encode_batch
from storage.errors import BrokerUnavailableError, InvalidMessageError, PermissionDeniedError
from storage.message import Message

log = logging.getLogger("raymq.actors.producer")


class Producer:
    """Sends messages to a RayMQ cluster; usable from a driver, a task or an actor."""

    def __init__(
        self,
        group: str = "DEFAULT_PRODUCER",
        *,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        config: ProducerConfig | None = None,
        **options: Any,
    ) -> None:
        from actors.namesrv.client import discover_nameservers

        if not isinstance(group, str) or not group:
            raise InvalidMessageError(f"producer group={group!r}: must be a non-empty str")
        self.group = group
        self.config = with_options(config or ProducerConfig(), options)
        self.client_id = f"{group}@{uuid.uuid4().hex[:12]}"
        self.ns = NameServerClient(
            nameservers or discover_nameservers(namespace), namespace, self.config.route_refresh_s
        )
        self.fault = LatencyFaultTolerance(self.config.fault_isolation_s)
        self._uniq = codec.UniqueKeyGenerator()
        self._born = codec.host_to_bytes(self.config.born_host)
        self._counters: dict[str, Iterator[int]] = {}
        self._queue_cache: dict[int, tuple[TopicRouteData, list[MessageQueue]]] = {}
        self._synthetic: dict[str, tuple[TopicRouteData, int]] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="raymq-producer")
        self._coalescer = SendCoalescer(self._send_batch_async)
        self._budget = AsyncSendBudget(
            self.config.async_send_max_messages, self.config.async_send_max_bytes
        )
        self._lanes = SendLanes(
            self.config.max_in_flight_per_broker,
            max_messages=4 * self.config.max_batch_messages,
            max_bytes=2 * self.config.max_batch_bytes,
        )
        self._rings: dict[str, SharedRing] = {}  # by co-located master's actor name
        self._ringless: set[str] = set()  # masters that cannot read a ring of ours
        self._rings_lock = threading.Lock()
        weakref.finalize(self, _close_rings, self._rings)

    # ------------------------------------------------------------ public API
    def send(
        self, message: Message, *, sharding_key: str | None = None, timeout_s: float | None = None
    ) -> SendResult:
        """Send one message and wait for the broker's answer."""
        return self.send_batch([message], sharding_key=sharding_key, timeout_s=timeout_s)[0]

    def send_batch(
        self,
        messages: Sequence[Message],
        *,
        sharding_key: str | None = None,
        timeout_s: float | None = None,
    ) -> BatchSendResult:
        """Send many messages: one Ray call per (topic, chunk), chunks in flight together."""
        return self._send_chunks(self._encode(messages), len(messages), sharding_key, timeout_s)

    def send_encoded(
        self, batches: Sequence[EncodedBatch], *, timeout_s: float | None = None
    ) -> BatchSendResult:
        """Send batches encoded already (one topic each, e.g. by the Arrow encoder of
        ``actors.datasource``) as ``send_batch`` sends its chunks: one Ray call per
        batch, in flight together, retried on another broker when Ray cannot deliver."""
        chunks, first = [], 0
        for batch in batches:
            if len(batch.topics) != 1:
                raise InvalidMessageError(f"an encoded batch has topics {batch.topics}: need one")
            codec.validate_topic(batch.topics[0])
            if batch.topics[0] in SYSTEM_TOPICS:
                raise InvalidMessageError(f"topic={batch.topics[0]!r} is reserved for the system")
            batch.check_structure()
            chunks.append(_Chunk(batch.topics[0], batch, np.arange(first, first + len(batch))))
            first += len(batch)
        if not chunks:
            raise InvalidMessageError("send needs at least one message")
        return self._send_chunks(chunks, first, None, timeout_s)

    def _send_chunks(
        self,
        chunks: list[_Chunk],
        total: int,
        sharding_key: str | None,
        timeout_s: float | None,
    ) -> BatchSendResult:
        for topic in {c.topic for c in chunks}:  # route errors before anything is sent
            self._write_queues(self._route(topic)[0])
        timeout = timeout_s or self.config.send_timeout_s
        parts: list[Any] = [None] * len(chunks)
        # one chunk in flight per queue, so chunks to the same queue are stored in order
        inflight: dict[MessageQueue, tuple[int, Any, float]] = {}
        for i, chunk in enumerate(chunks):
            try:
                mq, route, auto_n = self._select(chunk.topic, None, sharding_key)
            except Exception as exc:  # noqa: BLE001 - retried in _finish
                if not _rpc.is_retriable(exc):
                    raise
                parts[i] = self._finish(chunk, None, exc, timeout, sharding_key)
                continue
            prev = inflight.pop(mq, None)
            if prev is not None:
                j, ref, started = prev
                parts[j] = self._finish(chunks[j], mq, (ref, started), timeout, sharding_key)
            try:
                inflight[mq] = (i, *self._send(chunk, mq, route, auto_n))
            except Exception as exc:  # noqa: BLE001
                if not _rpc.send_may_retry(exc):
                    raise
                parts[i] = self._finish(chunk, mq, exc, timeout, sharding_key)
        for mq, (j, ref, started) in inflight.items():
            parts[j] = self._finish(chunks[j], mq, (ref, started), timeout, sharding_key)
        return BatchSendResult(parts, total)

    def send_async(
        self, messages: Message | Sequence[Message], *, sharding_key: str | None = None
    ) -> concurrent.futures.Future[Any]:
        """Send without waiting: a future of a :class:`SendResult` (one message) or a
        :class:`BatchSendResult` (a list). Failed sends are retried on another broker.

        Invalid messages raise here. So does :class:`ProducerBusyError` when
        ``async_send_max_messages`` / ``_bytes`` stay full for ``send_timeout_s``: the
        call waits for earlier sends to be answered first, as RocketMQ's backpressure does.
        """
        single = isinstance(messages, Message)
        if isinstance(messages, Message) and sharding_key is None:
            # one message at a time: coalesce with its neighbours into batches
            try:
                nbytes = len(messages.body)
            except TypeError:  # not bytes: the coalesced batch's validation names it
                nbytes = 0
            self._budget.acquire(1, nbytes, self.config.send_timeout_s)
            future = self._coalescer.submit(messages)
            future.add_done_callback(lambda _: self._budget.release(1, nbytes))
            return future
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
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()
        chunks = self._encode(msgs)  # validation errors raise here, before anything is sent
        if budgeted:  # the caller's own send, not the coalescer's: it waits for room
            count, nbytes = len(msgs), sum(len(c.batch.data) for c in chunks)
            self._budget.acquire(count, nbytes, self.config.send_timeout_s)
            # the callback stays on the future as long as the caller keeps it: not msgs
            out.add_done_callback(lambda _: self._budget.release(count, nbytes))
        parts: list[Any] = [None] * len(chunks)
        remaining = [len(chunks)]  # parts to come; -1 once ``out`` is being settled
        lock = threading.Lock()

        def done(i: int, part: Any, exc: BaseException | None) -> None:
            with lock:
                if remaining[0] < 0:
                    return
                if exc is None:
                    parts[i] = part
                    remaining[0] -= 1
                    if remaining[0]:
                        return
                remaining[0] = -1
            with self._budget.delivering():  # callers' callbacks run here and may send
                if exc is not None:
                    out.set_exception(exc)
                else:
                    result = BatchSendResult(parts, len(msgs))
                    out.set_result(result[0] if single else result)

        for i, chunk in enumerate(chunks):
            self._send_chunk_async(chunk, 0, None, sharding_key, functools.partial(done, i))
        return out

    def send_oneway(self, messages: Message | Sequence[Message]) -> None:
        """Fire and forget: no answer is awaited and no failure is reported."""
        msgs = [messages] if isinstance(messages, Message) else list(messages)
        for chunk in self._encode(msgs):
            try:
                self._submit(chunk, None, None)
            except Exception as exc:  # noqa: BLE001 - oneway never reports
                log.debug("oneway send failed: %s", exc)

    def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        route, _ = self._route(topic)
        return list(self._write_queues(route))

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
        self._pool.shutdown(wait=True)
        for actor, ring in list(self._rings.items()):
            # the broker lets the ring's memory go now rather than when idle; a broker
            # that is gone took its mapping with it
            with contextlib.suppress(Exception):
                self.ns.broker_by_name(actor).drop_ring.remote(ring.ring_id)
        _close_rings(self._rings)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ encoding
    def _encode(self, messages: Sequence[Message]) -> list[_Chunk]:
        """Validate and encode: one chunk per topic and size limit, in the caller's order."""
        if not messages:
            raise InvalidMessageError("send needs at least one message")
        cfg = self.config
        first = messages[0]
        if (
            len(messages) <= cfg.max_batch_messages
            and first.__class__ is Message
            and first.topic.__class__ is str
            and first.topic not in SYSTEM_TOPICS
        ):
            # the usual batch (one topic, plain, one call's worth) in one pass: the plain
            # encoder checks every message is a Message of the first one's topic
            batch = encode_plain(
                messages, cfg.max_message_size, int(time.time() * 1000), self._born, self._uniq
            )
            if batch is not None and len(batch.data) <= cfg.max_batch_bytes:
                return [_Chunk(first.topic, batch, np.arange(len(messages)))]
        for i, m in enumerate(messages):
            if m.__class__ is not Message and not isinstance(m, Message):
                raise InvalidMessageError(
                    f"message {i}: expected storage.Message, got {type(m).__name__}"
                )
        topics = [m.topic for m in messages]
        by_topic: dict[str, list[int]]
        if len(set(topics)) == 1:
            by_topic = {topics[0]: list(range(len(messages)))}
        else:
            by_topic = {}
            for i, t in enumerate(topics):
                by_topic.setdefault(t, []).append(i)
        chunks = []
        for topic, positions in by_topic.items():
            codec.validate_topic(topic)
            if topic in SYSTEM_TOPICS:
                raise InvalidMessageError(f"topic={topic!r} is reserved for the system")
            for picked in self._cut(messages, positions):
                whole = len(picked) == len(messages)
                batch = encode_batch(
                    messages if whole else [messages[i] for i in picked],
                    max_message_size=cfg.max_message_size,
                    born_host=cfg.born_host,
                    uniq=self._uniq,
                )
                where = np.arange(len(picked)) if whole else np.array(picked, dtype=np.int64)
                chunks.append(_Chunk(topic, batch, where))
        return chunks

    def _cut(self, messages: Sequence[Message], positions: list[int]) -> list[list[int]]:
        """Split into runs of at most ``max_batch_messages`` and about ``max_batch_bytes``."""
        cfg = self.config
        n = len(positions)
        if n <= cfg.max_batch_messages and n == len(messages):
            try:  # the usual batch fits whole: one sum instead of a running total
                if sum(map(len, [m.body for m in messages])) + 160 * n <= cfg.max_batch_bytes:
                    return [positions]
            except TypeError:
                pass
        try:
            cum = list(itertools.accumulate(len(messages[i].body) + 160 for i in positions))
        except TypeError:  # a body without a length: encode_batch names it
            cum = list(range(1, len(positions) + 1))
        out, start = [], 0
        while start < n:
            base = cum[start - 1] if start else 0
            stop = bisect.bisect_right(cum, base + cfg.max_batch_bytes, start, n)
            stop = max(start + 1, min(stop, start + cfg.max_batch_messages))
            out.append(positions[start:stop])
            start = stop
        return out

    # ------------------------------------------------------------ routes and queues
    def _route(self, topic: str, refresh: bool = False) -> tuple[TopicRouteData, int]:
        """The topic's route and, for a topic the brokers will auto-create, its queue count."""
        route = self.ns.route(topic, refresh=refresh)
        if route is not None and route.queue_datas:
            self._synthetic.pop(topic, None)
            return route, 0
        synthetic = self._synthetic.get(topic)
        if synthetic is not None and not refresh:
            return synthetic
        template = self.ns.route(AUTO_CREATE_TOPIC_KEY, refresh=refresh)
        if template is None or not template.queue_datas:
            self.ns.require_route(topic, refresh=True)  # raises TopicNotFoundError
        assert template is not None
        n = self.config.default_topic_queue_nums
        qds = tuple(
            QueueData(
                q.broker_name,
                min(n, q.write_queue_nums),
                min(n, q.write_queue_nums),
                PERM_READ | PERM_WRITE,
            )
            for q in template.queue_datas
        )
        synthetic = (TopicRouteData(topic, qds, template.broker_datas), n)
        self._synthetic[topic] = synthetic
        return synthetic

    def _write_queues(self, route: TopicRouteData) -> list[MessageQueue]:
        cached = self._queue_cache.get(id(route))
        if cached is not None and cached[0] is route:
            return cached[1]
        live = {bd.broker_name for bd in route.broker_datas if bd.master_actor_name()}
        queues = [
            MessageQueue(route.topic, qd.broker_name, q)
            for qd in route.queue_datas
            if is_writeable(qd.perm) and qd.broker_name in live
            for q in range(qd.write_queue_nums)
        ]
        if not queues:
            if any(qd.broker_name in live for qd in route.queue_datas):
                raise PermissionDeniedError(
                    f"topic={route.topic!r}: no broker allows writing (perm forbids write)"
                )
            raise BrokerUnavailableError(f"topic={route.topic!r}: no live broker holds it")
        if len(self._queue_cache) > 1024:
            self._queue_cache.clear()
        self._queue_cache[id(route)] = (route, queues)
        return queues

    def _select(
        self, topic: str, avoid: str | None, sharding_key: str | None, refresh: bool = False
    ) -> tuple[MessageQueue, TopicRouteData, int]:
        route, auto_n = self._route(topic, refresh)
        queues = self._write_queues(route)
        if sharding_key is not None:
            return (
                queues[codec.index_key_hash(codec.java_hash(sharding_key)) % len(queues)],
                route,
                auto_n,
            )
        counter = self._counters.get(topic)
        if counter is None:
            counter = self._counters.setdefault(topic, itertools.count())
        start = next(counter)
        n = len(queues)
        if self.config.send_latency_fault_enable:
            for i in range(n):
                mq = queues[(start + i) % n]
                if mq.broker_name != avoid and self.fault.is_available(mq.broker_name):
                    return mq, route, auto_n
            others = sorted({q.broker_name for q in queues if q.broker_name != avoid})
            best = self.fault.least_bad(others or ([avoid] if avoid else []))
            for i in range(n):
                mq = queues[(start + i) % n]
                if mq.broker_name == best:
                    return mq, route, auto_n
        for i in range(n):
            mq = queues[(start + i) % n]
            if mq.broker_name != avoid:
                return mq, route, auto_n
        return queues[start % n], route, auto_n

    # ------------------------------------------------------------ sending
    def _send(
        self, chunk: _Chunk, mq: MessageQueue, route: TopicRouteData, auto_n: int
    ) -> tuple[Any, float]:
        ref = self._call(route, mq.broker_name, [chunk.batch.with_queue(mq.queue_id)], auto_n)
        if auto_n:
            self._synthetic.pop(chunk.topic, None)  # next time ask for the real route
            self.ns.invalidate(chunk.topic)
        return ref, time.monotonic()

    def _submit(
        self, chunk: _Chunk, avoid: str | None, sharding_key: str | None, refresh: bool = False
    ) -> tuple[MessageQueue, Any, float]:
        mq, route, auto_n = self._select(chunk.topic, avoid, sharding_key, refresh)
        return (mq, *self._send(chunk, mq, route, auto_n))

    def _finish(
        self,
        chunk: _Chunk,
        mq: MessageQueue | None,
        first: tuple[Any, float] | BaseException,
        timeout: float,
        sharding_key: str | None,
    ) -> tuple[_Chunk, MessageQueue, SendAck]:
        """Wait for a submitted chunk (``first`` is its ref and start time, or the error
        that kept it from being sent); on a Ray failure resend it to another broker."""
        retries = self.config.retry_times_when_send_failed
        last_exc: BaseException | None = None
        ref: Any = None
        started = 0.0
        if isinstance(first, BaseException):
            last_exc = first
        else:
            ref, started = first
        for attempt in range(retries + 1):
            if ref is None:
                avoid = mq.broker_name if mq is not None and sharding_key is None else None
                try:
                    mq, ref, started = self._submit(chunk, avoid, sharding_key, refresh=True)
                except Exception as exc:  # noqa: BLE001
                    if not _rpc.send_may_retry(exc):
                        raise
                    last_exc = exc
                    continue
            assert mq is not None
            try:
                ack = SendAck.from_wire(_rpc.get(ref, timeout))
            except Exception as exc:  # noqa: BLE001
                if not _rpc.send_may_retry(exc):
                    raise
                last_exc = exc
                ref = None
                self.fault.update(mq.broker_name, timeout, failed=True)
                self.ns.invalidate(chunk.topic)
                log.warning(
                    "send to %s failed (%s); attempt %d of %d",
                    mq,
                    type(exc).__name__,
                    attempt + 1,
                    retries + 1,
                )
                continue
            self.fault.update(mq.broker_name, time.monotonic() - started)
            return chunk, mq, ack
        raise BrokerUnavailableError(
            f"send of {len(chunk.batch)} message(s) to topic {chunk.topic!r} failed after "
            f"{retries + 1} attempt(s): {type(last_exc).__name__}: {last_exc}"
        ) from last_exc

    def _send_chunk_async(
        self,
        chunk: _Chunk,
        attempt: int,
        avoid: str | None,
        sharding_key: str | None,
        done: Callable[[Any, BaseException | None], None],
    ) -> None:
        retries = self.config.retry_times_when_send_async_failed

        def retry(exc: BaseException, mq: MessageQueue | None) -> None:
            if attempt < retries and _rpc.send_may_retry(exc):
                if mq is not None:
                    self.fault.update(mq.broker_name, 0.0, failed=True)
                self.ns.invalidate(chunk.topic)
                nxt = mq.broker_name if mq is not None and sharding_key is None else avoid
                try:
                    self._pool.submit(
                        self._send_chunk_async, chunk, attempt + 1, nxt, sharding_key, done
                    )
                except RuntimeError:  # closed meanwhile: no retry, the caller hears of it
                    done(None, exc)
            else:
                done(None, exc)

        try:
            mq, route, auto_n = self._select(chunk.topic, avoid, sharding_key, attempt > 0)
        except Exception as exc:  # noqa: BLE001
            retry(exc, None)
            return
        started = time.monotonic()

        def answered(ack: SendAck | None, exc: BaseException | None) -> None:
            if exc is not None or ack is None:
                retry(_rpc.cause_of(exc) if exc is not None else RuntimeError("no ack"), mq)
                return
            self.fault.update(mq.broker_name, time.monotonic() - started)
            done((chunk, mq, ack), None)

        if auto_n:  # this call creates the topic's queues: it goes alone
            try:
                ref, started = self._send(chunk, mq, route, auto_n)
            except Exception as exc:  # noqa: BLE001
                retry(exc, mq)
                return
            ref.future().add_done_callback(
                lambda fut: _answer_from(fut, answered)  # same path as a lane's answer
            )
            return
        self._lanes.send(
            mq.broker_name,
            chunk.batch.with_queue(mq.queue_id),
            functools.partial(self._send_wire, route, mq.broker_name),
            answered,
        )

    def _send_wire(self, route: TopicRouteData, broker_name: str, *batches: EncodedBatch) -> Any:
        """A lane's call: ``batches`` (bound for their queues already) to ``broker_name``,
        through the broker's shared ring when it runs on this node."""
        return self._call(route, broker_name, batches, 0)

    def _call(
        self,
        route: TopicRouteData,
        broker_name: str,
        batches: Sequence[EncodedBatch],
        auto_n: int,
    ) -> Any:
        """``broker.send`` of ``batches`` as one call: an ObjectRef, or a
        :class:`SharedCall` when it went through the broker's shared ring. A broker Ray
        cannot reach is marked failed and raises ``BrokerUnavailableError``."""
        try:
            broker = self.ns.broker(route, broker_name)
            parts = EncodedBatch.wire_parts(batches)
            size = sum(memoryview(p).nbytes for p in parts)
            # a call this large would go through Ray's object store: the ring replaces that
            ring = self._ring_for(route, broker_name) if size >= OUT_OF_BAND_BYTES else None
            call = self._send_shared(broker, ring, parts, size, auto_n) if ring else None
            return call or broker.send.remote(_arg(b"".join(parts)), auto_n)
        except (BrokerUnavailableError, RayError) as exc:
            self.fault.update(broker_name, 0.0, failed=True)
            raise BrokerUnavailableError(f"broker {broker_name!r}: {exc}") from exc

    def _ring_for(self, route: TopicRouteData, broker_name: str) -> SharedRing | None:
        """The shared ring of ``broker_name``'s master when it runs on this node."""
        if not self.config.shared_memory_send:
            return None
        bd = route.broker(broker_name)
        actor = bd.master_actor_name() if bd is not None else None
        if bd is None or actor is None or bd.node_ids.get(0) != self._node_id:
            return None
        with self._rings_lock:
            ring = self._rings.get(actor)
            if ring is None and actor not in self._ringless:
                try:
                    # a lane's calls in flight, and room for sync sends beside them
                    ring = self._rings[actor] = SharedRing(
                        self.config.max_in_flight_per_broker + 2, self._ring_slot_bytes
                    )
                except OSError as exc:  # no memfd here: Ray's object store it is
                    log.info("no shared ring for %s (%s): sending through Ray", actor, exc)
                    self._ringless.add(actor)
            return ring

    def _send_shared(
        self,
        broker: Any,
        ring: SharedRing,
        parts: list[Any],
        size: int,
        auto_n: int,
    ) -> SharedCall | None:
        """``broker.send_shared`` of a call's wire ``parts`` (``size`` bytes in all)
        written into a free slot of ``ring``, waited on as an ObjectRef is; ``None``
        when no slot is free."""
        offset = ring.write(parts, size)
        if offset is None:
            return None
        try:
            ref = broker.send_shared.remote(ring.ring_id, offset, size, auto_n)
        except BaseException:
            ring.release(offset)
            raise
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def answered(fut: concurrent.futures.Future[Any]) -> None:
            ring.release(offset)  # the call is over, answered or not: the slot is free
            try:
                wire = fut.result()
            except BaseException as exc:  # noqa: BLE001 - the lane hears of it
                out.set_exception(exc)
                return
            if wire is not None:
                out.set_result(wire)
                return
            self._drop_ring(ring)  # this broker cannot read it: Ray's object store
            try:
                again = broker.send.remote(_arg(b"".join(parts)), auto_n)
            except BaseException as exc:  # noqa: BLE001
                out.set_exception(exc)
                return
            again.future().add_done_callback(functools.partial(pass_on, out))

        ref.future().add_done_callback(answered)
        return SharedCall(out)

    def _drop_ring(self, ring: SharedRing) -> None:
        with self._rings_lock:
            for actor, r in list(self._rings.items()):
                if r is ring:
                    del self._rings[actor]
                    self._ringless.add(actor)
                    log.info(
                        "broker %s cannot read this producer's ring: sending through Ray", actor
                    )
        ring.close()

    @functools.cached_property
    def _node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    @property
    def _ring_slot_bytes(self) -> int:
        # a lane's call at most: its records, plus the wire head's per-record arrays
        # and unique keys (< 64 B a record), plus its topics
        return 2 * self.config.max_batch_bytes + 64 * 4 * self.config.max_batch_messages + (1 << 16)


def _close_rings(rings: dict[str, SharedRing]) -> None:
    for ring in list(rings.values()):
        ring.close()
    rings.clear()


def _answer_from(fut: concurrent.futures.Future[Any], answered: Any) -> None:
    try:
        ack = SendAck.from_wire(fut.result())
    except Exception as exc:  # noqa: BLE001 - retried by ``answered``
        answered(None, exc)
        return
    answered(ack, None)
