"""Dropping redeliveries a listener has acknowledged already (``dedup_window_s``).

RocketMQ delivers at least once: after a lost consume ack, a rebalance or a crash
before offsets were committed, a message comes again, and RocketMQ leaves the
deduplication to each listener, keyed by the message id. A push consumer with
``dedup_window_s`` does it for listeners that cannot be idempotent: it remembers
the ids (``MessageExt.msg_id``, the producer's ``UNIQ_KEY``) of messages its
listener acknowledged within the window, at most ``dedup_max_ids`` of them (the
oldest go first), and hands a redelivery of one of those straight to "consumed".
A redelivery to another consumer of the group, or after the window, still arrives:
this narrows duplicates, it does not make delivery exactly once (the transactions
issue does, for topic-to-topic pipelines).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable


class DedupWindow:
    def __init__(self, window_s: float, max_ids: int) -> None:
        self.window_s = window_s
        self.max_ids = max_ids
        self._acked: OrderedDict[str, float] = OrderedDict()  # id -> when, oldest first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._acked)

    def seen(self, msg_id: str) -> bool:
        """Whether ``msg_id`` was acknowledged within the window."""
        with self._lock:
            when = self._acked.get(msg_id)
            return when is not None and time.monotonic() - when <= self.window_s

    def acked(self, msg_ids: Iterable[str]) -> None:
        now = time.monotonic()
        with self._lock:
            acked = self._acked
            for msg_id in msg_ids:
                acked[msg_id] = now
                acked.move_to_end(msg_id)
            while acked and (
                len(acked) > self.max_ids or now - next(iter(acked.values())) > self.window_s
            ):
                acked.popitem(last=False)
