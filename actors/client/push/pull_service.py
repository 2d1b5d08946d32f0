"""The push consumer's pulling (RocketMQ's ``PullMessageService``).

One thread drives every assigned queue: it keeps one long-polling pull in
flight per queue and is woken by an event queue, never by polling: a pull's
answer arrives through its ObjectRef's future, a rebalance or a consume task
asks for a pull by putting an event. A queue whose buffer passes the
threshold (``pull_threshold_for_queue`` messages or
``pull_threshold_size_for_queue_mib``, or for a concurrent consumer buffered
offsets spanning more than ``CONSUME_CONCURRENTLY_MAX_SPAN``) is paused until
consumption brings it back under; a failed pull is retried after
``pull_retry_delay_s``.

Pulls that are due together leave together: the thread takes every event
waiting, and the queues to pull on one broker (with one subscription
expression) go as one ``pull_packed`` call, which the broker holds until any of
them has a message. RocketMQ sends a request per queue, which costs little on
its own transport; a Ray call costs each side ~1 ms of CPU here, which at the
default pull batch of 32 held push consumption to half of what ``pull_many``
read. A broker refusing one queue of a shared call (a perm or topic change)
fails the call: each of its queues is then pulled alone until it is answered
again, so one queue's trouble never stalls the others.

A small answer (up to ``INLINE_ANSWER_BYTES``) is buffered and handed to the
consume threads by the thread that completed it (the client I/O loop, over the
socket), not by this thread: the listener hears of a message one thread wake
sooner. The pulls it makes due leave from that thread too, when their routes and
broker handles are cached (no Ray call can block the I/O loop): the broker holds
the next pull again without waiting for this thread to wake, so a message that
arrives meanwhile is not left waiting for it. Otherwise an event carries them
here; errors and large answers (whose decoding would hold the I/O loop up) come
here as before. ``RAYMQ_PUSH_INLINE_ANSWERS=0`` and ``RAYMQ_PUSH_ISSUE_INLINE=0``
turn these off (diagnostic switches, to compare both ways in one benchmark).
"""

from __future__ import annotations

import logging
import os
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
from actors.protocol.data_path import BrokerStub
from actors.protocol.wire import pull_request_to_wire, pulls_from_wire
from rebalance import MessageQueue

log = logging.getLogger("raymq.actors.push_consumer")

_PULL, _RETRY, _DONE, _EXPIRE, _DUE = range(5)
INLINE_ANSWER_BYTES = 64 << 10
_INLINE = os.environ.get("RAYMQ_PUSH_INLINE_ANSWERS", "1") != "0"
_ISSUE_INLINE = os.environ.get("RAYMQ_PUSH_ISSUE_INLINE", "1") != "0"
_SPIN_GUARD_S = 0.1  # a pull that comes back empty this fast was not held: wait a little

Due = list[tuple[ProcessQueue, tuple[PullState, ...]]]  # queues to pull, from which states


class PullMessageService(ReadService[tuple[int, Any, Any]]):
    def __init__(self, consumer: PullContext) -> None:
        super().__init__(consumer, "pull")
        self._alone: set[MessageQueue] = set()  # refused in a shared call: pulled by itself

    def request(self, pq: ProcessQueue) -> None:
        """Pull ``pq`` now if it is idle or paused (any thread)."""
        self._events.put((_PULL, pq, None))

    def check_stuck(self, now: float) -> None:
        """Give up pulls that outlived the long-polling time plus the timeout."""
        limit = self.c.config.pull_suspend_s + self.c.config.pull_timeout_s
        for pq in self.c.process_queues():
            if pq.state is PullState.PULLING and now - pq.pull_started > limit:
                self._events.put((_EXPIRE, pq, pq.pull_gen))

    # ------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while True:
            events = self._round()
            due: Due = []
            for ev in events:
                if ev is None or self._stopped:
                    return
                try:
                    self._handle(ev, due)
                except Exception:  # noqa: BLE001 - keep pulling the other queues
                    log.exception("pull service: handling %s failed", ev[0])
                    for pq in _queues_of(ev):
                        self._retry_later(pq, None)
            try:
                self._issue(due)
            except Exception:  # noqa: BLE001 - the thread must survive a bad round
                log.exception("pull service: issuing %d pulls failed", len(due))
                for pq, _ in due:
                    self._retry_later(pq, None)

    def _handle(self, ev: tuple[int, Any, Any], due: Due) -> None:
        kind, pq, payload = ev
        if kind == _DONE:
            members, started, fut = payload
            self._on_done(members, started, fut, due)
        elif kind == _PULL:
            due.append((pq, (PullState.IDLE, PullState.PAUSED)))
        elif kind == _RETRY:
            due.append((pq, (PullState.WAITING,)))
        elif kind == _DUE:  # pulls an answer handled on its own thread made due
            due.extend(payload)
        elif kind == _EXPIRE:
            with pq.lock:
                if pq.pull_gen != payload or pq.state is not PullState.PULLING:
                    return
                pq.state = PullState.IDLE
                pq.pull_gen += 1
            log.warning("%s: a pull got no answer in time; pulling again", pq)
            due.append((pq, (PullState.IDLE,)))

    def _issue(
        self, due: Due, handles: dict[MessageQueue, Any] | None = None, inline: bool = False
    ) -> None:
        """One ``pull_packed`` call per broker and subscription for the queues in ``due``
        that are still in one of the states they were due from (``handles``: their
        brokers, found already; ``inline``: on the thread that got the last answer)."""
        c = self.c
        calls: dict[tuple[Any, ...], list[tuple[ProcessQueue, int, int]]] = {}
        for pq, from_states in due:
            with pq.lock:
                if pq.dropped or self._stopped or pq.state not in from_states:
                    continue
                if self._paused(pq):
                    continue
                pq.state = PullState.PULLING
                pq.pull_gen += 1
                gen, offset = pq.pull_gen, pq.next_offset
            mq = pq.mq
            expression, tags = c.subscription_of(mq.topic)
            key = (
                mq.broker_name,
                None if tags is None else expression,
                mq if mq in self._alone else None,
            )
            calls.setdefault(key, []).append((pq, gen, offset))
        for (_, expression, _), members in calls.items():
            try:
                mq = members[0][0].mq
                broker = handles[mq] if handles is not None else c.broker_for(mq)
                ref = broker.pull_packed.remote(
                    pull_request_to_wire(
                        c.group,
                        [(pq.mq.topic, pq.mq.queue_id, offset) for pq, _, offset in members],
                        c.config.pull_batch_size,
                        expression,
                        c.config.pull_suspend_s,
                        c.client_id,
                    )
                )
            except Exception as exc:  # noqa: BLE001 - no route or handle now
                for pq, gen, _ in members:
                    self._failed(pq, gen, exc)
                continue
            started = time.monotonic()
            for pq, _, _ in members:
                pq.pull_started = started
            c.stats.add("pulls")
            if inline:
                c.stats.add("pulls_inline")
            out = [(pq, gen) for pq, gen, _ in members]
            ref.future().add_done_callback(
                lambda fut, out=out, started=started: self._answered(out, started, fut)
            )

    def _answered(
        self, members: list[tuple[ProcessQueue, int]], started: float, fut: Future[Any]
    ) -> None:
        """A pull's answer, on the thread that completed it: a small one is handled here
        (see the module doc), anything else by the pull thread."""
        if not _INLINE or self._stopped or fut.exception() is not None:
            self._events.put((_DONE, None, (members, started, fut)))
            return
        try:
            small = memoryview(fut.result()).nbytes <= INLINE_ANSWER_BYTES
        except TypeError:
            small = False
        if not small:
            self._events.put((_DONE, None, (members, started, fut)))
            return
        due: Due = []
        try:
            self._on_done(members, started, fut, due)
        except Exception:  # noqa: BLE001 - as the loop does: pull these queues again later
            log.exception("pull service: handling an answer failed")
            for pq, _ in members:
                self._retry_later(pq, None)
            return
        if not due:
            return
        handles = self._cached_handles(due) if _ISSUE_INLINE else None
        if handles is None:  # a route or a handle to look up (a Ray call): the pull thread's
            self._events.put((_DUE, None, due))
            return
        try:
            self._issue(due, handles, inline=True)
        except Exception:  # noqa: BLE001 - as the loop does: pull these queues again later
            log.exception("pull service: issuing %d pulls failed", len(due))
            for pq, _ in due:
                self._retry_later(pq, None)

    def _cached_handles(self, due: Due) -> dict[MessageQueue, Any] | None:
        """The broker of every queue in ``due`` if none needs a Ray call to find or to
        call (a cached route and handle, an open socket), else None."""
        handles = {}
        for pq, _ in due:
            handle = self.c.cached_broker_for(pq.mq)
            if not isinstance(handle, BrokerStub) or not handle.on_socket():
                return None
            handles[pq.mq] = handle
        return handles

    def _on_done(
        self,
        members: list[tuple[ProcessQueue, int]],
        started: float,
        fut: Future[Any],
        due: Due,
    ) -> None:
        try:
            raws = pulls_from_wire(fut.result())
        except Exception as exc:  # noqa: BLE001
            cause = _rpc.cause_of(exc)
            if len(members) > 1 and not _rpc.is_retriable(cause):
                # one queue's refusal failed them all: each asks again by itself
                log.debug(
                    "a shared pull was refused (%s): its %d queues go alone", cause, len(members)
                )
                for pq, gen in members:
                    self._alone.add(pq.mq)
                    with pq.lock:
                        if pq.dropped or gen != pq.pull_gen or pq.state is not PullState.PULLING:
                            continue
                        pq.state = PullState.IDLE
                    due.append((pq, (PullState.IDLE,)))
                return
            for pq, gen in members:
                self._failed(pq, gen, cause)
            return
        # an empty answer that came fast was not held, unless a sibling's message ended it
        spun = time.monotonic() - started < _SPIN_GUARD_S
        answers = []
        for (pq, gen), raw in zip(members, raws):
            self._alone.discard(pq.mq)
            spun = spun and not raw.count
            answers.append((pq, gen, raw))
        for pq, gen, raw in answers:
            self._take(pq, gen, raw, spun, due)

    def _take(self, pq: ProcessQueue, gen: int, raw: Any, spun: bool, due: Due) -> None:
        """One queue's answer: buffer its messages and pull it again."""
        with pq.lock:
            if pq.dropped or gen != pq.pull_gen or pq.state is not PullState.PULLING:
                return
        _, tags = self.c.subscription_of(pq.mq.topic)
        result = PullResult(pq.mq, raw, tags, self.c.config.check_crc)
        status = result.status
        messages = result.messages if status is PullStatus.FOUND else []  # decoded unlocked
        added = 0
        with pq.lock:
            if pq.dropped or gen != pq.pull_gen:
                return
            pq.state = PullState.IDLE
            pq.last_pull = time.monotonic()
            added = pq.take_result(result, messages)
        if added:
            self.c.stats.add("pulled", added)
            self.c.consume.dispatch(pq)
        if status is PullStatus.NO_NEW_MSG and spun:
            with pq.lock:
                if pq.state is PullState.IDLE:
                    pq.state = PullState.WAITING
            self.c.scheduler.call_later(_SPIN_GUARD_S, self._events.put, (_RETRY, pq, None))
            return
        due.append((pq, (PullState.IDLE,)))

    def _failed(self, pq: ProcessQueue, gen: int, exc: BaseException) -> None:
        c = self.c
        log.log(
            self._read_failed([pq], exc),
            "%s: pull failed (%s: %s); again in %.1fs",
            pq,
            type(exc).__name__,
            exc,
            c.config.pull_retry_delay_s,
        )
        with pq.lock:
            if pq.dropped or gen != pq.pull_gen:
                return
        self._retry_later(pq, gen)

    def _retry_later(self, pq: ProcessQueue, gen: int | None) -> None:
        with pq.lock:
            if pq.dropped or (gen is not None and gen != pq.pull_gen):
                return
            pq.state = PullState.WAITING
        self.c.scheduler.call_later(
            self.c.config.pull_retry_delay_s, self._events.put, (_RETRY, pq, None)
        )


def _queues_of(ev: tuple[int, Any, Any]) -> list[ProcessQueue]:
    """The queues an event is about (a pull's answer may be several queues')."""
    kind, pq, payload = ev
    if kind == _DONE:
        return [member for member, _ in payload[0]]
    if kind == _DUE:
        return [member for member, _ in payload]
    return [pq]
