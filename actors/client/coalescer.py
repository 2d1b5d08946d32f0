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

A batch refused as a whole (one message fails validation, or the broker refuses
it) is sent again one message at a time, so each caller hears about its own
message only; a batch Ray could not deliver was already retried by the producer.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Callable
from typing import Any

from actors.protocol import rpc as _rpc
from storage import Message

_Entry = tuple[Message, concurrent.futures.Future[Any], int]
"""A message waiting, the future its caller holds, the budget bytes it holds."""


class SendCoalescer:
    def __init__(
        self,
        send_batch_async: Callable[[list[Message]], concurrent.futures.Future[Any]],
        max_in_flight: int = 2,
        max_batch: int = 4096,
        release: Callable[[int, int], None] | None = None,
    ) -> None:
        self._send = send_batch_async
        self._release = release  # (messages, bytes) of the budget, given back when answered
        self._max_in_flight = max_in_flight
        self._max_batch = max_batch
        self._lock = threading.Lock()
        self._pending: dict[str, list[_Entry]] = {}
        self._in_flight: dict[str, int] = {}

    def submit(self, message: Message, nbytes: int = 0) -> concurrent.futures.Future[Any]:
        """``message`` sent with its neighbours; ``nbytes`` of the budget it holds."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            self._pending.setdefault(message.topic, []).append((message, future, nbytes))
        self._pump(message.topic)
        return future

    def _pump(self, topic: str) -> None:
        while True:
            with self._lock:
                waiting = self._pending.get(topic)
                if not waiting or self._in_flight.get(topic, 0) >= self._max_in_flight:
                    return
                batch, self._pending[topic] = (
                    waiting[: self._max_batch],
                    waiting[self._max_batch :],
                )
                self._in_flight[topic] = self._in_flight.get(topic, 0) + 1
            try:
                sent = self._send([m for m, _, _ in batch])
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
            self._release(len(batch), sum(n for _, _, n in batch))
        for i, (_, future, _) in enumerate(batch):
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(results[i])
        self._pump(topic)

    def _alone(self, entry: _Entry) -> None:
        """A message by itself, its answer (or error) into its future."""
        message, future, nbytes = entry

        def settle(result: Any = None, exc: BaseException | None = None) -> None:
            if self._release is not None:
                self._release(1, nbytes)
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(result)

        try:
            sent = self._send([message])
        except BaseException as exc:  # noqa: BLE001 - this message's own error
            settle(exc=exc)
            return

        def answered(done: concurrent.futures.Future[Any]) -> None:
            exc = done.exception()
            if exc is not None:
                settle(exc=exc)
            else:
                settle(done.result()[0])

        sent.add_done_callback(answered)


def _refused(exc: BaseException) -> bool:
    """Refused for what the batch holds, not lost on the way (the producer retried that)."""
    return not _rpc.send_may_retry(exc)
