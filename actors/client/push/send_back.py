"""Sending failed messages back to their brokers, many per call.

Consume tasks hand failed batches here and go on; one thread takes everything
waiting (after a short linger, so a burst of failures shares a call), groups
it by broker and makes one ``consumer_send_msg_back`` call per broker. A
message the broker stored (to the retry topic or the DLQ) is done with; one it
could not take (the call failed, the original expired) is consumed again
locally after ``local_retry_delay_s``: a message is never dropped here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from actors.client.push.context import SendBackContext
from actors.client.push.process_queue import ProcessQueue
from actors.protocol import rpc as _rpc
from actors.protocol.wire import SENT_TO_DLQ, SENT_TO_RETRY
from storage.message import MessageExt

log = logging.getLogger("raymq.actors.push_consumer")

LINGER_S = 0.002
MAX_PER_CALL = 4096
CALL_TIMEOUT_S = 10.0


class SendBackService:
    def __init__(self, consumer: SendBackContext) -> None:
        self.c = consumer
        self._items: list[tuple[ProcessQueue, MessageExt]] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._busy = False
        self._thread = threading.Thread(
            target=self._loop, name=f"raymq-sendback-{consumer.group}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def submit(self, pq: ProcessQueue, batch: Sequence[MessageExt]) -> None:
        with self._cond:
            self._items.extend((pq, m) for m in batch)
            self._cond.notify()

    def stop(self, timeout_s: float) -> None:
        """Send what is waiting, then stop."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (self._items or self._busy) and time.monotonic() < deadline:
                self._cond.wait(0.05)
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=max(0.1, deadline - time.monotonic()))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._stopped:
                    self._cond.wait()
                if self._stopped and not self._items:
                    return
                self._busy = True
            time.sleep(LINGER_S)
            with self._cond:
                items, self._items = self._items[:MAX_PER_CALL], self._items[MAX_PER_CALL:]
            try:
                self._send(items)
            except Exception:  # noqa: BLE001 - never lose them: retry locally
                log.exception("group %s: send-back round failed", self.c.group)
                self._fail(items)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _send(self, items: list[tuple[ProcessQueue, MessageExt]]) -> None:
        c = self.c
        by_broker: dict[str, list[tuple[ProcessQueue, MessageExt]]] = {}
        for pq, m in items:
            by_broker.setdefault(pq.mq.broker_name, []).append((pq, m))
        calls: list[tuple[str, Any, list[tuple[ProcessQueue, MessageExt]]]] = []
        for broker, entries in by_broker.items():
            try:
                handle = c.broker_for(entries[0][0].mq)
                ref = handle.consumer_send_msg_back.remote(
                    c.group,
                    [m.commitlog_offset for _, m in entries],
                    c.config.max_reconsume_times,
                )
            except Exception as exc:  # noqa: BLE001
                log.warning("group %s: send-back to %s failed: %s", c.group, broker, exc)
                self._fail(entries)
                continue
            calls.append((broker, ref, entries))
        if calls:
            _rpc.wait([ref for _, ref, _ in calls], CALL_TIMEOUT_S)
        for broker, ref, entries in calls:
            try:
                outcome = _rpc.get(ref, 0.001)
            except Exception as exc:  # noqa: BLE001 - retried locally
                mq = entries[0][0].mq
                c.forget_route(mq.topic, mq.broker_name if _rpc.is_retriable(exc) else None)
                log.warning(
                    "group %s: send-back of %d message(s) to %s failed (%s: %s); "
                    "they will be consumed again here",
                    c.group,
                    len(entries),
                    broker,
                    type(exc).__name__,
                    exc,
                )
                self._fail(entries)
                continue
            done = [
                (pq, m) for (pq, m), o in zip(entries, outcome) if o in (SENT_TO_RETRY, SENT_TO_DLQ)
            ]
            c.stats.add("sent_back", len(done))
            c.stats.add("sent_to_dlq", sum(1 for o in outcome if o == SENT_TO_DLQ))
            c.stats.add("send_back_calls")
            self._forget(done)
            if len(done) < len(entries):
                kept = [
                    (pq, m)
                    for (pq, m), o in zip(entries, outcome)
                    if o not in (SENT_TO_RETRY, SENT_TO_DLQ)
                ]
                self._fail(kept)

    def _forget(self, entries: list[tuple[ProcessQueue, MessageExt]]) -> None:
        for pq, batch in _by_queue(entries).items():
            self.c.consume.forget(pq, batch)

    def _fail(self, entries: list[tuple[ProcessQueue, MessageExt]]) -> None:
        self.c.stats.add("send_back_failures", len(entries))
        for pq, batch in _by_queue(entries).items():
            self.c.consume.retry_locally(pq, batch, self.c.config.local_retry_delay_s)


def _by_queue(
    entries: list[tuple[ProcessQueue, MessageExt]],
) -> dict[ProcessQueue, list[MessageExt]]:
    out: dict[ProcessQueue, list[MessageExt]] = {}
    for pq, m in entries:
        out.setdefault(pq, []).append(m)
    return out
