"""Delayed delivery: RocketMQ's ScheduleMessageService.

A message put with ``delay_level`` n is stored in ``SCHEDULE_TOPIC_XXXX``,
queue n - 1, with its real topic and queue in ``REAL_TOPIC``/``REAL_QID``; its
ConsumeQueue entry's tag field holds the delivery time (store time + the
level's delay). One pass per level moves every due message, in queue order, to
its real topic with the same unique key, keys, tags, born time and reconsume
count.

Invariant: ``delayOffset.json`` names, per level, the first schedule-queue
offset not yet delivered. It is written after each delivered batch; at start
the service skips entries whose delivered copy is already in the real topic
(found by unique key), so a crash between the two neither loses nor repeats a
delivery.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from . import codec
from .config_files import JsonConfigFile
from .message import Message, MessageExt, copied, to_real_topic
from .services import DeliveryStore, ServiceThread

log = logging.getLogger("raymq.storage.schedule")

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
_HIDDEN = (codec.PROP_DELAY, codec.PROP_REAL_TOPIC, codec.PROP_REAL_QID)
_BATCH = 256


class ScheduleStore(DeliveryStore, Protocol):
    """What delayed delivery uses of a store: what every delivery service does, and its
    config files."""

    def config_file(self, name: str) -> JsonConfigFile: ...


def level_for_delay(seconds: float, levels_ms: Sequence[int]) -> int:
    """The smallest delay level whose delay is at least ``seconds`` (rounded up), 0 for none."""
    if seconds <= 0:
        return 0
    wanted = math.ceil(seconds * 1000)
    for level, delay in enumerate(levels_ms, 1):
        if delay >= wanted:
            return level
    return len(levels_ms)


def to_schedule(m: MessageExt, level: int, queue_id: int | None = None) -> Message:
    """The schedule-topic copy of a message put with a delay level (to ``queue_id``
    when given: the queue the batch was sent to, which its records' field may not show)."""
    props = {k: v for k, v in m.properties.items() if k not in _HIDDEN}
    props[codec.PROP_REAL_TOPIC] = m.topic
    props[codec.PROP_REAL_QID] = str(m.queue_id if queue_id is None else queue_id)
    return copied(m, SCHEDULE_TOPIC, level - 1, props, delay_level=level)


def as_message(m: MessageExt) -> Message:
    """A stored message as a producer would have built it (same unique key)."""
    return copied(m, m.topic, m.queue_id, m.properties)


def restore(m: MessageExt) -> Message:
    """The message a due schedule entry delivers to its real topic."""
    return to_real_topic(m, _HIDDEN)


def born_of(messages: Sequence[MessageExt]) -> list[tuple[int, str, int]]:
    return [(m.born_timestamp, m.born_host, m.reconsume_times) for m in messages]


class ScheduleMessageService(ServiceThread):
    name = "schedule"

    def __init__(self, store: ScheduleStore, interval_s: float = 0.05) -> None:
        super().__init__(interval_s)
        self.store = store
        self.levels_ms = store.config.delay_levels_ms
        self._file = store.config_file("delayOffset")
        table = self._file.load().get("offsetTable", {})
        self.offsets: dict[int, int] = {int(k): int(v) for k, v in table.items()}
        self._skip_delivered()

    def _persist(self) -> None:
        self._file.save({"offsetTable": {str(k): v for k, v in sorted(self.offsets.items())}})

    def _skip_delivered(self) -> None:
        """Advance past entries already delivered before a crash (found by unique key)."""
        changed = False
        for level in range(1, len(self.levels_ms) + 1):
            cq = self.store.find_consume_queue(SCHEDULE_TOPIC, level - 1)
            if cq is None:
                continue
            offset = max(self.offsets.get(level, 0), cq.min_offset)
            while (entry := cq.entry(offset)) is not None:
                if entry[1] == 0:  # a hole: its record was damaged and set aside
                    offset += 1
                    continue
                m = self.store.commitlog.message_at(entry[0])
                uk = m.properties.get(codec.PROP_UNIQ_KEY)
                real = m.properties.get(codec.PROP_REAL_TOPIC)
                if (
                    not uk
                    or not real
                    or not any(
                        x.store_timestamp >= m.store_timestamp
                        for x in self.store.query_by_key(real, uk, max_count=16)
                    )
                ):
                    break
                offset += 1
            if offset != self.offsets.get(level, 0):
                log.info(
                    "level %d: %d entries were delivered before the restart",
                    level,
                    offset - self.offsets.get(level, 0),
                )
                self.offsets[level] = offset
                changed = True
        if changed:
            try:
                self._persist()
            except OSError as exc:  # a full disk: found again at the next start
                log.warning("could not record the delivered offsets: %s", exc)

    def run_once(self) -> int:
        """Deliver every due message; return how many were delivered."""
        now = self.store.now_ms()
        return sum(self._deliver(level, now) for level in range(1, len(self.levels_ms) + 1))

    def _deliver(self, level: int, now_ms: int) -> int:
        cq = self.store.find_consume_queue(SCHEDULE_TOPIC, level - 1)
        if cq is None:
            return 0
        offset = max(self.offsets.get(level, 0), cq.min_offset)
        delivered = 0
        while True:
            entries = cq.read(offset, _BATCH)
            if not len(entries):
                break
            due = entries["tag"] <= now_ms
            count = len(due) if due.all() else int(np.argmin(due))
            if count == 0:
                break
            due_entries = entries[:count][entries["size"][:count] > 0]  # holes: nothing to send
            data = self.store.commitlog.read_runs(due_entries["offset"], due_entries["size"])
            originals = codec.decode_records(data, check_crc=False)
            if originals:
                batch = codec.encode_batch(
                    [restore(m) for m in originals],
                    max_message_size=self.store.config.max_message_size,
                    born=born_of(originals),
                )
                self.store._put_encoded(batch)
            offset += count
            delivered += count
            self.offsets[level] = offset
            self._persist()
        return delivered

    def pending(self) -> dict[int, int]:
        """Messages waiting per level."""
        out = {}
        for level in range(1, len(self.levels_ms) + 1):
            cq = self.store.find_consume_queue(SCHEDULE_TOPIC, level - 1)
            if cq is not None:
                out[level] = cq.max_offset - max(self.offsets.get(level, 0), cq.min_offset)
        return out
