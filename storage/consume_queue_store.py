"""ConsumeQueueStore: every ConsumeQueue of a store, by (topic, queue id).

RocketMQ 5's ``ConsumeQueueStore`` (``DefaultMessageStore.consumeQueueTable``
before it). The facade, recovery and a slave's dispatch reach queues through
it, so none of them needs the others.

Invariant: at most one :class:`ConsumeQueue` per (topic, queue id), rooted at
``<root>/<topic>/<queue id>``; a queue is created on its first entry and found
on disk by :meth:`load`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path

from . import codec
from .consume_queue import ConsumeQueue

log = logging.getLogger("raymq.storage.consume_queue")

QueueKey = tuple[str, int]


class ConsumeQueueStore(Mapping[QueueKey, ConsumeQueue]):
    """The queues, as a read-only mapping ``(topic, queue id) -> ConsumeQueue``."""

    def __init__(self, root: Path, entries_per_file: int, *, preallocate: bool = True) -> None:
        self.root = root
        self.entries_per_file = entries_per_file
        self.preallocate = preallocate
        self._queues: dict[QueueKey, ConsumeQueue] = {}

    # -- the mapping
    def __getitem__(self, key: QueueKey) -> ConsumeQueue:
        return self._queues[key]

    def __iter__(self) -> Iterator[QueueKey]:
        return iter(self._queues)

    def __len__(self) -> int:
        return len(self._queues)

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._queues.get((topic, queue_id))

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            cq = self._queues[(topic, queue_id)] = ConsumeQueue(
                self.root, topic, queue_id, self.entries_per_file, preallocate=self.preallocate
            )
        return cq

    # -- start, upkeep, stop
    def load(self, commitlog_min: int) -> None:
        """Map every queue found under the root (skipping what is not a queue directory)."""
        if not self.root.exists():
            return
        for topic_dir in sorted(self.root.iterdir()):
            if not topic_dir.is_dir() or not codec.TOPIC_RE.fullmatch(topic_dir.name):
                log.warning("ignoring %s: not a topic directory", topic_dir)
                continue
            for qdir in sorted(topic_dir.iterdir()):
                if not qdir.is_dir() or not qdir.name.isdigit():
                    log.warning("ignoring %s: not a queue directory", qdir)
                    continue
                cq = self.find_or_create(topic_dir.name, int(qdir.name))
                cq.load(commitlog_min)

    def truncate_to_commitlog(self, commitlog_end: int) -> None:
        for cq in self._queues.values():
            cq.truncate_to_commitlog(commitlog_end)

    def mark_holes(self, spans: list[tuple[int, int]]) -> int:
        """Make every entry pointing into a damaged span a hole; return how many."""
        return sum(cq.mark_holes(spans) for cq in self._queues.values())

    def correct_min_offset(self, commitlog_min: int) -> None:
        for cq in self._queues.values():
            cq.correct_min_offset(commitlog_min)

    def delete_expired(self, commitlog_min: int) -> None:
        for cq in self._queues.values():
            cq.delete_expired(commitlog_min)

    def flush(self) -> None:
        for cq in list(self._queues.values()):
            cq.flush()

    def close(self) -> None:
        for cq in self._queues.values():
            cq.close()
