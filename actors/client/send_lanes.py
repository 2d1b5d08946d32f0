"""Asynchronous batch sends, merged per broker while its calls are in flight.

``send_async(batch)`` called faster than a broker answers would cost one Ray call
per batch, and a call costs the producer and the broker ~1 ms of CPU each here,
whatever the batch holds. So each broker gets a lane: at most
``max_in_flight`` calls on the wire; batches that come meanwhile wait, and the
moment a call is answered everything waiting for that broker leaves as one call
(``EncodedBatch.wire_of``: each record keeps its own topic and queue). At a low
rate a batch leaves at once; at a high rate calls grow by themselves, as
Kafka's producer accumulator does.

The calls of a lane reach the broker in the order they were made only on a channel
that keeps it: the broker's socket (frames are read, and sends stored, in the order
written; a ring call is announced on it too). Through Ray (while the socket opens,
after it broke, ``data_path="ray"``) an async actor starts a call as soon as its
arguments are there, so a call whose batch went through the object store (100 KiB
or more) may be stored after a smaller one made later, and an idempotent queue's
run would be refused for the gap before it. So while one of its calls goes through
Ray, a lane makes no other: the next call leaves, merged, with its answer.

Each waiting batch keeps the queue it was given, so per-queue order and
RocketMQ's queue selection are unchanged, and each caller still gets its own
acknowledgement (the merged answer is cut back into parts). A merged call that
Ray could not deliver fails each part, which the producer retries on its own as
before. A merged call the broker refused (it checks a whole call before writing
any of it) is split: each part goes again alone, so an error reaches only the
batch it is about.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actors.protocol import rpc as _rpc
from actors.protocol.rpc import PendingCall
from actors.protocol.wire import SendAck
from storage.codec import EncodedBatch

log = logging.getLogger("raymq.actors.producer")

Submit = Callable[..., Any]
"""Sends its batches as one call to the lane's broker: the call's pending answer (a
:class:`PendingCall` on a channel that keeps the lane's order, else an ObjectRef or a
``PendingCall`` subclass)."""
OnAck = Callable[[SendAck | None, BaseException | None], None]


@dataclass(slots=True)
class _Waiting:
    batch: EncodedBatch  # bound for its queue (``with_queue``)
    submit: Submit
    on_done: OnAck
    alone: bool = False  # part of a refused merged call: goes by itself


class _Lane:
    """One broker's calls. ``lock`` covers its state and the making of its calls, so
    groups reach the wire in the order they were taken, and batches bound under it
    (:meth:`SendLanes.send`'s ``bind``) in the order they were numbered: an idempotent
    queue's runs arrive in sequence, whichever threads send and answer."""

    __slots__ = ("in_flight", "lock", "waiting")

    def __init__(self) -> None:
        self.in_flight = 0  # calls unanswered; a call through Ray counts as the lane's limit
        self.waiting: list[_Waiting] = []
        self.lock = threading.Lock()


class SendLanes:
    """One lane per broker name; see the module docstring."""

    def __init__(
        self, max_in_flight: int = 2, max_messages: int = 16384, max_bytes: int = 8 << 20
    ) -> None:
        self._max_in_flight = max_in_flight
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._lock = threading.Lock()  # the lanes' table
        self._lanes: dict[str, _Lane] = {}

    def _lane(self, broker: str) -> _Lane:
        lane = self._lanes.get(broker)
        if lane is None:
            with self._lock:
                lane = self._lanes.setdefault(broker, _Lane())
        return lane

    def send(
        self,
        broker: str,
        batch: EncodedBatch | Callable[[], EncodedBatch],
        submit: Submit,
        on_done: OnAck,
    ) -> None:
        """Send ``batch`` (bound for its queue) to ``broker`` now, or with the next call
        when the broker has ``max_in_flight`` calls unanswered. ``batch`` may be a
        function that binds it: called under the lane's lock (what it raises, the caller
        hears; nothing is queued). ``submit`` raising (no handle) fails this batch alone."""
        lane = self._lane(broker)
        with lane.lock:
            bound = batch() if callable(batch) else batch
            if lane.waiting or lane.in_flight >= self._max_in_flight:
                lane.waiting.append(_Waiting(bound, submit, on_done))
                group = None
            else:  # an idle lane (the usual single send at a low rate): it leaves now
                group = [_Waiting(bound, submit, on_done)]
                ref, exc, weight = self._call(lane, group)
        if group is None:
            self._pump(broker, lane)
        else:
            self._sent(broker, group, ref, exc, weight)

    def _pump(self, broker: str, lane: _Lane) -> None:
        while True:
            with lane.lock:
                if not lane.waiting or lane.in_flight >= self._max_in_flight:
                    return
                group = self._take(lane)
                ref, exc, weight = self._call(lane, group)
            self._sent(broker, group, ref, exc, weight)

    def _call(self, lane: _Lane, group: list[_Waiting]) -> tuple[Any, BaseException | None, int]:
        """``group`` submitted as one call, under ``lane.lock`` (so the next group cannot
        overtake it on the wire): its pending answer, or what kept it from the wire, and
        what it counts in ``lane.in_flight`` until answered (a call through Ray, not a
        socket's :class:`PendingCall`, counts as the limit: see the module doc)."""
        try:
            first = group[0]
            ref = (
                first.submit(first.batch)
                if len(group) == 1
                else first.submit(*[w.batch for w in group])
            )
        except BaseException as error:  # noqa: BLE001 - each part hears of it
            return None, error, 0
        weight = 1 if ref.__class__ is PendingCall else self._max_in_flight
        lane.in_flight += weight
        return ref, None, weight

    def _sent(
        self, broker: str, group: list[_Waiting], ref: Any, exc: BaseException | None, weight: int
    ) -> None:
        """After :meth:`_call`, outside the lock: the answer awaited, or the failure told."""
        if ref is None:
            self._finish(broker, group, None, exc, 0)
            return
        ref.future().add_done_callback(functools.partial(self._answered, broker, group, weight))

    def _take(self, lane: _Lane) -> list[_Waiting]:
        """The longest run of waiting batches within the call limits (at least one)."""
        count = size = 0
        for n, w in enumerate(lane.waiting):
            count += len(w.batch)
            size += len(w.batch.data)
            if n and (w.alone or count > self._max_messages or size > self._max_bytes):
                break
            if w.alone:
                n = 1
                break
        else:
            n = len(lane.waiting)
        group, lane.waiting = lane.waiting[:n], lane.waiting[n:]
        return group

    def _answered(self, broker: str, group: list[_Waiting], weight: int, fut: Any) -> None:
        try:
            ack = SendAck.from_wire(fut.result())
        except BaseException as exc:  # noqa: BLE001 - each part hears of it
            self._finish(broker, group, None, exc, weight)
            return
        self._finish(broker, group, ack, None, weight)

    def _finish(
        self,
        broker: str,
        group: list[_Waiting],
        ack: SendAck | None,
        exc: BaseException | None,
        weight: int,
    ) -> None:
        """``group``'s call is over (``weight``: what it counted in ``lane.in_flight``)."""
        refused = exc is not None and len(group) > 1 and not _rpc.send_may_retry(exc)
        lane = self._lanes[broker]
        with lane.lock:
            lane.in_flight -= weight
            if refused:
                lane.waiting[:0] = [dataclasses.replace(w, alone=True) for w in group]
        if refused:
            log.debug(
                "%s refused a merged call (%s): its %d parts go alone", broker, exc, len(group)
            )
            self._pump(broker, lane)
            return
        if len(group) == 1:  # the usual call at a low rate: the answer is all its own
            try:
                group[0].on_done(ack, exc)
            except Exception:  # noqa: BLE001 - one caller's callback must not stall the lane
                log.exception("send_async completion failed")
            self._pump(broker, lane)
            return
        first = 0
        for w in group:
            part = None
            if ack is not None:
                last = first + len(w.batch)
                part = SendAck(
                    ack.status,
                    ack.broker_name,
                    ack.store_host,
                    ack.queue_offsets[first:last],
                    ack.commitlog_offsets[first:last],
                )
                first = last
            try:
                w.on_done(part, exc)
            except Exception:  # noqa: BLE001 - one caller's callback must not stall the lane
                log.exception("send_async completion failed")
        self._pump(broker, lane)
