"""The push consumer on the brokers' subscription streams (``delivery="stream"``).

Where :mod:`.pull_service` keeps a held pull per broker and asks again after every
answer, this service opens one subscription (``actors.protocol.requests.subscribe``) on
each broker's connection for the queues it holds there (one per tag expression: the
broker filters a subscription's records by one), and the broker writes their new
records to it as it stores them. Records arrive on the client I/O thread and go
straight into the process queues and to the consume threads.

Credit: a subscription opens with a window of ``pull_batch_size`` messages (at most
``pull_threshold_for_queue``) and ``pull_threshold_size_for_queue_mib`` bytes; what its
queues take is given back (one CREDIT when half a window was taken, so at most one per
answer) unless one of them is over its threshold (messages, bytes, or for a concurrent
consumer its span): then that queue is ``PAUSED``, as a pull would leave it, and the
subscription gets no credit until consumption brings it back under (the consume service
asks for it with ``request``). A window the records used up before its credit came back
(the broker had to wait for it: the producer outruns one round trip of the credit)
doubles, up to ``WINDOW_GROWTH`` times the first and never past half of
``pull_threshold_for_queue``, so a fast topic is not throttled by the credit's round
trip while a slow one keeps the small window. So a slow listener's stream stops with its
queue at most a window and an answer past its threshold (a pull stops one answer past it).

Rebalance: a queue taken joins its broker's subscription (SUBSCRIPTION_UPDATE, from the
queue's next offset); a queue dropped leaves it on the consumer's next service tick
(what came for it meanwhile is not buffered). Every answer names the offset each queue's
records were read from, and a queue takes only an answer that starts at its own next
offset: whatever the broker wrote before an update reached it (a queue dropped and taken
again, an offset reset) is left out, and the queue is set again where it stands. So a
queue's records enter its buffer in order, each once.

A subscription ends with its connection, or with the broker's shutdown: its queues
subscribe again, on the broker's next connection, from their next offsets (a broker
that restarted is found again as the pulls find it, ``pull_retry_delay_s`` apart). A
broker refusing one queue of a shared subscription (a perm or topic change) refuses
the whole SUBSCRIBE: its queues then subscribe each alone, so one queue's trouble never
stalls the others. A broker without an open socket is waited for (its connection opens
meanwhile): streams are served on sockets only.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

from actors.client.pull_consumer import PullResult, PullStatus
from actors.client.push.context import PullContext
from actors.client.push.process_queue import (
    ProcessQueue,
    PullState,
)
from actors.client.push.read_service import ReadService
from actors.protocol import rpc as _rpc
from actors.protocol.connection import BrokerConnection
from actors.protocol.data_path import BrokerStub
from actors.protocol.requests.subscribe import (
    CREDIT,
    SUBSCRIBE,
    SUBSCRIPTION_UPDATE,
    UNSUBSCRIBE,
)
from actors.protocol.wire import pulls_from_wire
from rebalance import MessageQueue
from storage.errors import BrokerUnavailableError

log = logging.getLogger("raymq.actors.push_consumer")

_ADD, _ENDED, _REFUSED = range(3)
CONNECTING_RETRY_S = 0.1
"""How soon a queue whose broker has no open connection yet asks again."""
MAX_COUNT = 1024  # the most records of a queue a subscription's answer holds
WINDOW_GROWTH = 16
"""How many times its first window a subscription's credit window may grow to."""

Key = tuple[str, int]  # (topic, queue id), as the broker names a subscription's queues
StreamKey = tuple[str, str | None, MessageQueue | None]  # broker, tags, a queue alone


class _Stream:
    """One SUBSCRIBE on one broker connection. Under ``lock`` (reentrant: a request's
    future may settle in the call that sends it): its queues, its id once the broker
    named it, what waits for that id, the credit owed to the broker, the queues over
    their thresholds, and the adds in flight."""

    def __init__(self, key: StreamKey, conn: BrokerConnection) -> None:
        self.key = key
        self.conn = conn
        self.lock = threading.RLock()
        self.sid: int | None = None
        self.queues: dict[Key, ProcessQueue] = {}
        self.waiting_add: dict[Key, int] = {}  # updates before the broker named it
        self.waiting_drop: set[Key] = set()
        self.adding: dict[Key, int] = {}  # SUBSCRIPTION_UPDATE adds not answered yet
        self.paused: set[Key] = set()
        self.owed = 0
        self.owed_bytes = 0
        self.window = 0  # its credit window (messages), grown when it ran dry
        self.ended = False
        self.closing = False  # this consumer ended it
        self.read: Any = None  # what the SUBSCRIBE's last answer says


class StreamService(ReadService[tuple[int, Any]]):
    """The :class:`~actors.client.push.context.Pulls` of a ``delivery="stream"`` consumer."""

    def __init__(self, consumer: PullContext) -> None:
        super().__init__(consumer, "stream")
        cfg = consumer.config
        self.window = max(1, min(cfg.pull_batch_size, cfg.pull_threshold_for_queue))
        self.max_window = max(
            self.window, min(self.window * WINDOW_GROWTH, cfg.pull_threshold_for_queue // 2)
        )
        self.window_bytes = self._max_bytes
        self._max_count = min(cfg.pull_batch_size, MAX_COUNT)
        self._lock = threading.Lock()
        self._streams: dict[StreamKey, _Stream] = {}  # the live ones
        self._of: dict[ProcessQueue, _Stream] = {}  # which stream a queue is in
        self._alone: set[MessageQueue] = set()

    # ------------------------------------------------------------ Pulls
    def stop(self) -> None:
        """Ends every subscription (its records from here on are not buffered)."""
        super().stop()
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
            self._of.clear()
        for stream in streams:
            with stream.lock:
                stream.closing = True
                if stream.sid is not None and not stream.ended:
                    _send(stream, UNSUBSCRIBE, stream.sid, oneway=True)

    def request(self, pq: ProcessQueue) -> None:
        """Stream ``pq`` (a queue taken, or one whose stream ended), or resume it where
        it was paused over its threshold (any thread)."""
        with self._lock:
            stream = self._of.get(pq)
        if stream is not None and not stream.ended:
            self._resume(stream, pq)
        else:
            self._events.put((_ADD, pq))

    def check_stuck(self, now: float) -> None:
        """On the consumer's service tick: queues dropped (a rebalance, a reset) leave
        their subscriptions."""
        with self._lock:
            gone = [(pq, s) for pq, s in self._of.items() if pq.dropped]
            for pq, _ in gone:
                del self._of[pq]
        for pq, stream in gone:
            key = (pq.mq.topic, pq.mq.queue_id)
            with stream.lock:
                if stream.queues.get(key) is not pq:
                    continue  # taken again meanwhile: the new queue stands there
                del stream.queues[key]
                stream.paused.discard(key)
                stream.adding.pop(key, None)
                if stream.sid is None:
                    stream.waiting_add.pop(key, None)
                    stream.waiting_drop.add(key)
                elif not stream.ended:
                    _send(stream, SUBSCRIPTION_UPDATE, stream.sid, drop=[list(key)], oneway=True)
                self._renew(stream, force=True)

    # ------------------------------------------------------------ the service thread
    def _loop(self) -> None:
        while True:
            events = self._round()
            adds: list[ProcessQueue] = []
            for ev in events:
                if ev is None or self._stopped:
                    return
                kind, payload = ev
                try:
                    if kind == _ADD:
                        adds.append(payload)
                    elif kind == _ENDED:
                        self._ended(*payload)
                    elif kind == _REFUSED:
                        self._refused(*payload)
                except Exception:  # noqa: BLE001 - the thread must survive a bad event
                    log.exception("stream service: handling event %d failed", kind)
            if adds:
                try:
                    self._add(adds)
                except Exception:  # noqa: BLE001 - asked again later
                    log.exception("stream service: subscribing %d queues failed", len(adds))
                    for pq in adds:
                        self._retry_later(pq, self.c.config.pull_retry_delay_s)

    def _add(self, pqs: list[ProcessQueue]) -> None:
        """Subscribe ``pqs`` on their brokers: into the live subscription of their broker
        and tags, or in a new one."""
        c = self.c
        groups: dict[StreamKey, tuple[BrokerConnection, dict[Key, tuple[ProcessQueue, int]]]] = {}
        for pq in pqs:
            with self._lock:
                live = self._of.get(pq)
                if live is not None and not live.ended:
                    continue  # streamed already
            with pq.lock:
                if pq.dropped or self._stopped:
                    continue
                if self._paused(pq):
                    continue
                pq.state = PullState.PULLING
                offset = pq.next_offset
            mq = pq.mq
            try:
                stub = c.broker_for(mq)
            except Exception as exc:  # noqa: BLE001 - no route now
                self._failed([pq], exc)
                continue
            conn = stub.connection() if isinstance(stub, BrokerStub) else None
            if conn is None:  # it opens meanwhile
                self._retry_later(pq, CONNECTING_RETRY_S)
                continue
            expression, tags = c.subscription_of(mq.topic)
            skey = (
                stub.actor_name,
                None if tags is None else expression,
                mq if mq in self._alone else None,
            )
            entry = groups.setdefault(skey, (conn, {}))
            if entry[0] is not conn:
                self._retry_later(pq, CONNECTING_RETRY_S)  # a newer connection: next round
                continue
            entry[1][(mq.topic, mq.queue_id)] = (pq, offset)
        for skey, (conn, queues) in groups.items():
            with self._lock:
                stream = self._streams.get(skey)
            if stream is not None and not stream.ended and stream.conn is conn:
                self._join(stream, queues)
            else:
                self._open(skey, conn, queues)

    def _open(
        self, skey: StreamKey, conn: BrokerConnection, queues: dict[Key, tuple[ProcessQueue, int]]
    ) -> None:
        c = self.c
        stream = _Stream(skey, conn)
        stream.window = self.window
        stream.queues = {key: pq for key, (pq, _) in queues.items()}
        with self._lock:
            self._streams[skey] = stream
            for pq in stream.queues.values():
                self._of[pq] = stream
        header, parts, stream.read = SUBSCRIBE.encode(
            c.group,
            {key: offset for key, (_, offset) in queues.items()},
            tags=skey[1],
            credit=self.window,
            credit_bytes=self.window_bytes,
            max_count=self._max_count,
            client_id=c.client_id,
        )
        c.stats.add("subscribes")
        fut = conn.stream(header, lambda h, b: self._on_answer(stream, h, b), parts)
        fut.add_done_callback(lambda f: self._events.put((_ENDED, (stream, f))))

    def _join(self, stream: _Stream, queues: dict[Key, tuple[ProcessQueue, int]]) -> None:
        with self._lock:
            for pq, _ in queues.values():
                self._of[pq] = stream
        with stream.lock:
            for key, (pq, _) in queues.items():
                stream.queues[key] = pq
                stream.paused.discard(key)
                stream.waiting_drop.discard(key)
            self._set(stream, {key: offset for key, (_, offset) in queues.items()})

    def _set(self, stream: _Stream, offsets: dict[Key, int]) -> None:
        """Tell the broker where ``offsets``' queues go on (``stream.lock`` held)."""
        if stream.ended or not offsets:
            return
        if stream.sid is None:
            stream.waiting_add.update(offsets)
            return
        for key in offsets:
            stream.adding[key] = stream.adding.get(key, 0) + 1
        fut = _send(stream, SUBSCRIPTION_UPDATE, stream.sid, add=offsets)
        fut.add_done_callback(lambda f: self._update_answered(stream, offsets, f))

    def _update_answered(self, stream: _Stream, offsets: dict[Key, int], fut: Future[Any]) -> None:
        with stream.lock:
            for key in offsets:
                left = stream.adding.get(key, 0) - 1
                if left > 0:
                    stream.adding[key] = left
                else:
                    stream.adding.pop(key, None)
        if fut.exception() is not None and not stream.ended:
            self._events.put((_REFUSED, (stream, list(offsets), fut.exception())))

    def _refused(self, stream: _Stream, keys: list[Key], exc: BaseException) -> None:
        """A SUBSCRIPTION_UPDATE the broker refused: its queues subscribe each alone."""
        cause = _rpc.cause_of(exc)
        pqs = []
        with stream.lock:
            for key in keys:
                pq = stream.queues.pop(key, None)
                if pq is not None:
                    stream.paused.discard(key)
                    pqs.append(pq)
        with self._lock:
            for pq in pqs:
                if self._of.get(pq) is stream:
                    del self._of[pq]
        for pq in pqs:
            with pq.lock:
                if pq.dropped:
                    continue
                pq.state = PullState.IDLE
            if len(keys) > 1 and not _rpc.is_retriable(cause):
                self._alone.add(pq.mq)
                self._events.put((_ADD, pq))
            else:
                self._failed([pq], cause)

    def _ended(self, stream: _Stream, fut: Future[Any]) -> None:
        """A subscription ended: unless this consumer ended it, its queues subscribe
        again (alone, when the broker refused them together)."""
        with stream.lock:
            stream.ended = True
            queues = list(stream.queues.values())
        with self._lock:
            if self._streams.get(stream.key) is stream:
                del self._streams[stream.key]
            mine = [pq for pq in queues if self._of.get(pq) is stream]
            for pq in mine:
                del self._of[pq]
        if self._stopped or stream.closing or not mine:
            return
        exc = fut.exception()
        cause = _rpc.cause_of(exc) if exc is not None else None
        self.c.stats.add("streams_ended")
        if cause is not None and not _rpc.is_retriable(cause) and len(mine) > 1:
            log.debug("a subscription was refused (%s): its %d queues go alone", cause, len(mine))
            for pq in mine:
                self._alone.add(pq.mq)
                with pq.lock:
                    if not pq.dropped:
                        pq.state = PullState.IDLE
                self._events.put((_ADD, pq))
            return
        if cause is None:  # the broker ended it (its shutdown)
            header, body = fut.result()
            cause = BrokerUnavailableError(
                f"{stream.key[0]} ended the subscription: {stream.read(header, body)!r:.80}"
            )
        self._failed(mine, cause)

    def _failed(self, pqs: list[ProcessQueue], exc: BaseException) -> None:
        c = self.c
        log.log(
            self._read_failed(pqs, exc),
            "%d queues: subscription failed (%s: %s); again in %.1fs",
            len(pqs),
            type(exc).__name__,
            exc,
            c.config.pull_retry_delay_s,
        )
        for pq in pqs:
            self._retry_later(pq, c.config.pull_retry_delay_s)

    def _retry_later(self, pq: ProcessQueue, delay_s: float) -> None:
        with pq.lock:
            if pq.dropped:
                return
            pq.state = PullState.WAITING
        self.c.scheduler.call_later(delay_s, self._events.put, (_ADD, pq))

    # ------------------------------------------------------------ credit
    def _resume(self, stream: _Stream, pq: ProcessQueue) -> None:
        """A paused queue back under its thresholds: the credit it held back is given."""
        key = (pq.mq.topic, pq.mq.queue_id)
        with stream.lock:
            with pq.lock:
                if pq.dropped or pq.state is not PullState.PAUSED:
                    return
                if self._over_threshold(pq):
                    return
                pq.state = PullState.PULLING
            stream.paused.discard(key)
            self._renew(stream, force=True)

    def _renew(self, stream: _Stream, force: bool = False) -> None:
        """Give the broker back what the queues took, once half a window was taken (or
        ``force``: a queue resumed), unless a queue is over its thresholds (``stream.lock``
        held). A window taken whole while no queue held the credit back (the broker ran
        out of it before it came back) grows."""
        if stream.sid is None or stream.ended or stream.paused:
            return
        owed, owed_bytes = stream.owed, stream.owed_bytes
        if not (owed or owed_bytes):
            return
        if not force and owed >= stream.window and stream.window < self.max_window:
            grown = min(2 * stream.window, self.max_window)
            owed += grown - stream.window
            stream.window = grown
            self.c.stats.add("credit_windows_grown")
        if force or 2 * owed >= stream.window or 2 * owed_bytes >= self.window_bytes:
            stream.owed = stream.owed_bytes = 0
            _send(stream, CREDIT, stream.sid, owed, max(owed_bytes, 0), oneway=True)
            self.c.stats.add("credits")

    # ------------------------------------------------------------ the I/O thread
    def _on_answer(self, stream: _Stream, header: dict[str, Any], body: Any) -> None:
        """One of the stream's answers (on the client I/O thread)."""
        if "s" in header:  # it is open: what waited for its id goes now
            with stream.lock:
                stream.sid = int(header["s"])
                if stream.waiting_drop:
                    drop = [list(k) for k in stream.waiting_drop]
                    stream.waiting_drop.clear()
                    _send(stream, SUBSCRIPTION_UPDATE, stream.sid, drop=drop, oneway=True)
                adds, stream.waiting_add = stream.waiting_add, {}
                self._set(stream, adds)
            return
        if self._stopped:
            return
        keys, starts = header.get("k") or [], header.get("p") or []
        raws = pulls_from_wire(bytes(body))
        ready: list[ProcessQueue] = []
        with stream.lock:
            for (topic, qid), start, raw in zip(keys, starts, raws):
                stream.owed += raw.count
                stream.owed_bytes += len(raw.data)
                key = (topic, qid)
                pq = stream.queues.get(key)
                if pq is not None and self._take(stream, pq, key, start, raw):
                    ready.append(pq)
            self._renew(stream)
        for pq in ready:
            self.c.consume.dispatch(pq)

    def _take(self, stream: _Stream, pq: ProcessQueue, key: Key, start: int, raw: Any) -> bool:
        """One queue's records (``stream.lock`` held); True when some were buffered."""
        with pq.lock:
            if pq.dropped:
                return False
            expected = pq.next_offset
        if start != expected:  # written before an update reached the broker
            if not stream.adding.get(key):  # nothing on its way sets it: set it here
                self._set(stream, {key: expected})
            return False
        _, tags = self.c.subscription_of(pq.mq.topic)
        result = PullResult(pq.mq, raw, tags, self.c.config.check_crc)
        status = result.status
        messages = result.messages if status is PullStatus.FOUND else []  # decoded unlocked
        added, reset = 0, False
        with pq.lock:
            if pq.dropped or pq.next_offset != expected:
                return False
            added = pq.take_result(result, messages)
            # an illegal offset: the broker left the queue out until it is given again
            reset = status is PullStatus.OFFSET_ILLEGAL
            pq.last_pull = time.monotonic()
            if pq.state is PullState.PULLING and self._over_threshold(pq):
                pq.state = PullState.PAUSED
                stream.paused.add(key)
                self.c.stats.add("flow_control_pauses")
            offset = pq.next_offset
        if reset:
            self._set(stream, {key: offset})
        if added:
            self.c.stats.add("pulled", added)
        return added > 0


def _send(stream: _Stream, request: Any, *args: Any, oneway: bool = False, **kwargs: Any) -> Any:
    """``request`` on the stream's connection; its future (settled at once when oneway)."""
    header, parts, _ = request.encode(*args, **kwargs)
    return stream.conn.request(header, parts, oneway=oneway)
