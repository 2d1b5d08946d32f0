"""Consumer offsets per (group, topic, queue) (RocketMQ's ``ConsumerOffsetManager``).

Kept in memory; persisted to ``config/consumerOffset.json`` in RocketMQ's
layout (``offsetTable`` → ``"topic@group"`` → queue id → offset) every few
seconds and at shutdown. A crash loses at most the commits since the last
save, which consumers then re-read (at-least-once).
"""

from __future__ import annotations

import logging
import threading

from storage.config_files import JsonConfigFile

log = logging.getLogger("raymq.actors.offsets")

TOPIC_GROUP_SEP = "@"


class ConsumerOffsetManager:
    def __init__(self, file: JsonConfigFile) -> None:
        self._file = file
        self._lock = threading.Lock()
        # one save at a time, its table taken inside: the newest table is the one saved
        # last, and a save that finds nothing changed since the last one writes nothing
        self._saving = threading.Lock()
        self._table: dict[tuple[str, str], dict[int, int]] = {}  # (topic, group) -> qid -> offset
        self._dirty = False
        saved = file.load()
        self.txn_markers = int(saved.get("txnMarkersApplied", 0) or 0)
        """The one-phase commit markers (``RMQ_SYS_TXN_COMMIT`` queue offsets) below which
        every marker's offsets are in this table (``actors.broker.transaction.one_phase``): saved with
        it, so a restart re-applies only those of later markers."""
        for key, queues in (saved.get("offsetTable") or {}).items():
            topic, sep, group = key.partition(TOPIC_GROUP_SEP)
            if not sep:
                log.error("ignoring offset key %r in %s", key, file.path)
                continue
            self._table[(topic, group)] = {int(q): int(o) for q, o in queues.items()}

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            self._table.setdefault((topic, group), {})[queue_id] = offset
            self._dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed one."""
        return self._table.get((topic, group), {}).get(queue_id, -1)

    def query_topic(self, group: str, topic: str) -> dict[int, int]:
        return dict(self._table.get((topic, group), {}))

    def groups(self) -> list[str]:
        return sorted({g for _, g in self._table})

    def topics_of(self, group: str) -> list[str]:
        return sorted(t for t, g in self._table if g == group)

    def remove_topic(self, topic: str) -> None:
        with self._lock:
            for key in [k for k in self._table if k[0] == topic]:
                del self._table[key]
            self._dirty = True

    def snapshot(self) -> dict[tuple[str, str], dict[int, int]]:
        """A copy of the table: (topic, group) -> queue id -> offset."""
        with self._lock:
            return {key: dict(queues) for key, queues in self._table.items()}

    def replace(self, table: dict[tuple[str, str], dict[int, int]]) -> None:
        """Take another broker's table as it is (a slave following its master)."""
        with self._lock:
            if table != self._table:
                self._table = {key: dict(queues) for key, queues in table.items()}
                self._dirty = True

    def mark_markers(self, below: int) -> None:
        """Every one-phase commit marker below ``below`` has its offsets in the table."""
        with self._lock:
            if below > self.txn_markers:
                self.txn_markers = below
                self._dirty = True

    def merge_max(self, table: dict[tuple[str, str], dict[int, int]]) -> int:
        """Keep the larger offset of each queue (commits a slave took while the master was
        gone); return how many queues moved forward."""
        moved = 0
        with self._lock:
            for key, queues in table.items():
                mine = self._table.setdefault(key, {})
                for qid, offset in queues.items():
                    if offset > mine.get(qid, -1):
                        mine[qid] = offset
                        moved += 1
            self._dirty |= moved > 0
        return moved

    def persist(self, force: bool = False) -> bool:
        """Save the table; False when nothing changed since the last save. Every commit
        made before the call is on disk when it returns. Callers in several threads (the
        periodic save, transactional commits) take turns, since two saves at once
        could rename each other's temp file away (FileNotFoundError to a commit that
        was stored) and leave the older table on disk."""
        with self._saving:
            with self._lock:
                if not (self._dirty or force):
                    return False
                data: dict[str, object] = {
                    "offsetTable": {
                        f"{t}{TOPIC_GROUP_SEP}{g}": {str(q): o for q, o in sorted(qs.items())}
                        for (t, g), qs in sorted(self._table.items())
                    }
                }
                if self.txn_markers:
                    data["txnMarkersApplied"] = self.txn_markers
                self._dirty = False
            try:
                self._file.save(data)
            except BaseException:
                with self._lock:
                    self._dirty = True  # not saved: the next call tries again
                raise
        return True
