"""Automatic batching of single asynchronous sends (the producer's accumulator).

``send_async(message)`` called many times a second must not cost one Ray call
per message: a call costs ~1 ms of client CPU here. Messages of one topic wait
in a buffer while ``max_in_flight`` batches of that topic are on the wire; the
moment one is answered, everything waiting goes out as the next batch. At a
low rate a message leaves at once (latency = one round trip); at a high rate
batches grow by themselves (throughput = batch size / round trip).

Order: messages of one topic leave in the order they were given; each batch
goes to one queue, chosen by the producer's usual selection.

What a message holds of the producer's async budget (``release``) is given back once
per answered batch, not by a callback on each message's future (a lock and a wake of
the budget's waiters each: a tenth of a single ``send_async``'s cost).

Short lists (``send_async([...])`` of one topic, :meth:`SendCoalescer.submit_list`)
wait here too, each kept whole and in order inside a batch, so a service sending a
few messages per call costs what one sending single messages does: one encode,
one call and, for an idempotent producer, one numbered run per batch, not per list.
The list's future gets its part of the batch's :class:`BatchSendResult`.

A batch refused as a whole (one message fails validation, or the broker refuses
it) is sent again one entry (a message, or a list) at a time, so each caller hears
about its own messages only; a batch Ray could not deliver was already retried by
the producer.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from actors.client.send_result import BatchSendResult
from actors.protocol import rpc as _rpc
from actors.protocol.shared_future import SharedFuture, new_lock, settle_all
from storage import Message

SendOne = Callable[[Message, Callable[[Any, BaseException | None], None]], None]
"""Sends one message and calls back ``(result, error)`` once it is answered."""

_Entry = tuple[Message | list[Message], concurrent.futures.Future[Any], int]
"""A message (or a list of them) waiting, the future its caller holds, the budget
bytes it holds."""


class SendCoalescer:
    def __init__(
        self,
        send_batch_async: Callable[[list[Message]], concurrent.futures.Future[Any]],
        max_in_flight: int = 2,
        max_batch: int = 4096,
        release: Callable[[int, int], None] | None = None,
        max_bytes: int = 4 << 20,
        send_one: SendOne | None = None,
    ) -> None:
        self._send = send_batch_async
        self._send_one = send_one  # a batch of one message, answered by a callback
        self._release = release  # (messages, bytes) of the budget, given back when answered
        self._max_in_flight = max_in_flight
        self._max_batch = max_batch
        self._max_bytes = max_bytes  # of bodies, with room for each record's head
        self._lock = threading.Lock()
        self._futures = new_lock()  # the lock its futures share
        self._pending: dict[str, list[_Entry]] = {}
        self._in_flight: dict[str, int] = {}

    def submit(self, message: Message, nbytes: int = 0) -> concurrent.futures.Future[Any]:
        """``message`` sent with its neighbours; ``nbytes`` of the budget it holds."""
        future = SharedFuture(self._futures)
        topic = message.topic
        with self._lock:
            waiting = self._pending.get(topic)
            if waiting is None:
                waiting = self._pending[topic] = []
            waiting.append((message, future, nbytes))
            if self._in_flight.get(topic, 0) >= self._max_in_flight:
                return future  # leaves with the next batch, when one is answered
        self._pump(topic)
        return future

    def submit_list(
        self, messages: list[Message], nbytes: int = 0
    ) -> concurrent.futures.Future[Any]:
        """``messages`` (of one topic, a short list) sent whole inside a batch with its
        neighbours: a future of their :class:`BatchSendResult`; ``nbytes`` of the budget."""
        future = SharedFuture(self._futures)
        topic = messages[0].topic
        with self._lock:
            self._pending.setdefault(topic, []).append((messages, future, nbytes))
        self._pump(topic)
        return future

    def _take(self, waiting: list[_Entry]) -> int:
        """How many waiting entries make the next batch: within ``max_batch`` messages
        and ``max_bytes`` (at least one entry; a list is never cut)."""
        count = size = 0
        for n, (m, _, nbytes) in enumerate(waiting):
            k = len(m) if m.__class__ is list else 1
            count += k
            size += nbytes + _RECORD_HEAD * k
            if n and (count > self._max_batch or size > self._max_bytes):
                return n
        return len(waiting)

    def _pump(self, topic: str) -> None:
        while True:
            with self._lock:
                waiting = self._pending.get(topic)
                if not waiting or self._in_flight.get(topic, 0) >= self._max_in_flight:
                    return
                n = self._take(waiting)
                batch, self._pending[topic] = waiting[:n], waiting[n:]
                self._in_flight[topic] = self._in_flight.get(topic, 0) + 1
            if n == 1 and self._send_one is not None and batch[0][0].__class__ is Message:
                # the usual batch at a low rate, one message: its result without a batch's
                entry = batch[0]
                answered = functools.partial(self._one_answered, topic, entry)
                try:
                    self._send_one(entry[0], answered)  # type: ignore[arg-type]
                except BaseException as exc:  # noqa: BLE001 - its validation error, its own
                    self._finish(topic, batch, None, exc)
                continue
            try:
                sent = self._send(_flat(batch))
            except BaseException as exc:  # noqa: BLE001 - validation errors go to each future
                self._finish(topic, batch, None, exc)
                continue

            sent.add_done_callback(functools.partial(self._answered, topic, batch))

    def _answered(
        self,
        topic: str,
        batch: list[_Entry],
        sent: concurrent.futures.Future[Any],
    ) -> None:
        exc = sent.exception()
        self._finish(topic, batch, None if exc is not None else sent.result(), exc)

    def _one_answered(
        self, topic: str, entry: _Entry, result: Any, exc: BaseException | None
    ) -> None:
        """:meth:`_finish` of a batch of one message sent by ``send_one``: its result
        (a ``SendResult``) or error, straight to its future."""
        with self._lock:
            self._in_flight[topic] -= 1
        if self._release is not None:
            self._release(1, entry[2])
        settle_all(self._futures, [(entry[1], result, exc)])
        self._pump(topic)

    def _finish(
        self,
        topic: str,
        batch: list[_Entry],
        results: Any,
        exc: BaseException | None,
    ) -> None:
        with self._lock:
            self._in_flight[topic] -= 1
        if exc is not None and len(batch) > 1 and _refused(exc):
            for entry in batch:
                self._alone(entry)
            self._pump(topic)
            return
        if self._release is not None:
            if len(batch) == 1:  # the usual batch at a low rate: one message
                m, _, nbytes = batch[0]
                self._release(len(m) if m.__class__ is list else 1, nbytes)
            else:
                count = sum(len(m) if m.__class__ is list else 1 for m, _, _ in batch)
                self._release(count, sum(n for _, _, n in batch))
        if exc is not None:
            settle_all(self._futures, [(future, None, exc) for _, future, _ in batch])
        else:
            settle_all(self._futures, list(_outcomes(batch, results)))  # outside its lock
        self._pump(topic)

    def _alone(self, entry: _Entry) -> None:
        """A message (or a list) by itself, its answer (or error) into its future."""
        message, future, nbytes = entry
        many = message.__class__ is list

        def settle(result: Any = None, exc: BaseException | None = None) -> None:
            if self._release is not None:
                self._release(len(message) if many else 1, nbytes)  # type: ignore[arg-type]
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(result)

        try:
            sent = self._send(message if many else [message])  # type: ignore[arg-type,list-item]
        except BaseException as exc:  # noqa: BLE001 - this message's own error
            settle(exc=exc)
            return

        def answered(done: concurrent.futures.Future[Any]) -> None:
            exc = done.exception()
            if exc is not None:
                settle(exc=exc)
            else:
                settle(done.result() if many else done.result()[0])

        sent.add_done_callback(answered)


_RECORD_HEAD = 192
"""What a record takes beyond its body, about (its fixed head, topic, message id):
a batch's ``max_bytes`` counts it, so the batch is encoded as one chunk."""


def _outcomes(
    batch: list[_Entry], results: Any
) -> Iterator[tuple[concurrent.futures.Future[Any], Any, None]]:
    """Each entry's future and its share of the batch's ``results``."""
    each: list[Any] | None = None  # expanded once, for the single messages only
    at = 0
    for m, future, _ in batch:
        if m.__class__ is list:
            yield future, _part(results, at, at + len(m)), None
            at += len(m)
        else:
            if each is None:
                each = list(results)
            yield future, each[at], None
            at += 1


def _flat(batch: list[_Entry]) -> list[Message]:
    out: list[Message] = []
    for m, _, _ in batch:
        if m.__class__ is list:
            out.extend(m)  # type: ignore[arg-type]
        else:
            out.append(m)  # type: ignore[arg-type]
    return out


def _part(results: Any, start: int, stop: int) -> Any:
    """A list's share of its batch's results."""
    if isinstance(results, BatchSendResult):
        return results.part(start, stop)
    return results[start:stop]


def _refused(exc: BaseException) -> bool:
    """Refused for what the batch holds, not lost on the way (the producer retried that)."""
    return not _rpc.send_may_retry(exc)
