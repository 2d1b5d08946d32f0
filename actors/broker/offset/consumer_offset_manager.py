"""Consumer offsets per (group, topic, queue) (RocketMQ's ``ConsumerOffsetManager``).

Kept in memory; persisted to ``config/consumerOffset.json`` in RocketMQ's
layout (``offsetTable`` → ``"topic@group"`` → queue id → offset) every few
seconds and at shutdown. Between two saves every change is also appended to a
journal beside it (``consumerOffset.journal``, one JSON line per change), written
to the page cache as it is made, so a broker process that dies (SIGKILL) loses no
commit: opening the table replays the journal over the last save. :meth:`sync`
fsyncs the journal (the broker calls it before it answers a commit under
SYNC_FLUSH, so an acknowledged commit also outlives a power loss); otherwise the
journal reaches the disk at the next save. Each save starts a new journal and
removes the one the save covers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

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
        self._journal_path = file.path.with_suffix(".journal")
        self._covered_path = file.path.with_suffix(".journal.old")  # being saved
        replayed = sum(self._replay(p) for p in (self._covered_path, self._journal_path))
        if replayed:
            self._dirty = True
            log.info("%s: %d offset changes replayed from the journal", file.path, replayed)
        self._journal = self._open_journal()
        self._written = 0  # journal lines written, and of them fsynced
        self._synced = 0
        self._sync_lock = threading.Lock()

    # ------------------------------------------------------------ the journal
    def _open_journal(self) -> Any:
        self._journal_path.parent.mkdir(parents=True, exist_ok=True)
        return open(self._journal_path, "ab", buffering=0)  # noqa: SIM115 - kept open

    def _replay(self, path: Path) -> int:
        """Apply a journal's lines to the table; a torn last line (a crash mid-write) ends it."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return 0
        n = 0
        for line in raw.splitlines():
            try:
                entry = json.loads(line)
                if entry[0] == "c":
                    _, topic, group, qid, offset = entry
                    self._table.setdefault((topic, group), {})[int(qid)] = int(offset)
                elif entry[0] == "rm":
                    for key in [k for k in self._table if k[0] == entry[1]]:
                        del self._table[key]
                elif entry[0] == "clear":
                    self._table = {}
                elif entry[0] == "markers":
                    self.txn_markers = max(self.txn_markers, int(entry[1]))
                else:
                    raise ValueError(entry[0])
            except (ValueError, TypeError, IndexError, KeyError) as exc:
                log.error("%s: unreadable line %d (%s), replay stops there", path, n + 1, exc)
                break
            n += 1
        return n

    def _log(self, *entries: list[Any]) -> None:
        """Append changes to the journal (the caller holds ``_lock``)."""
        if not entries:
            return
        data = b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in entries)
        self._journal.write(data)
        self._written += 1

    def sync(self) -> None:
        """Every change made before the call is on disk when it returns (one fsync covers
        the changes of every caller waiting meanwhile). Saves rotate the journal only
        between syncs (they take ``_sync_lock`` too)."""
        with self._lock:
            target = self._written
        with self._sync_lock:
            if self._synced >= target:
                return
            with self._lock:
                written = self._written
            os.fsync(self._journal.fileno())
            self._synced = max(self._synced, written)

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            self._table.setdefault((topic, group), {})[queue_id] = offset
            self._log(["c", topic, group, queue_id, offset])
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
            self._log(["rm", topic])
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
                self._log(
                    ["clear"],
                    *(
                        ["c", t, g, q, o]
                        for (t, g), qs in self._table.items()
                        for q, o in qs.items()
                    ),
                )
                self._dirty = True

    def mark_markers(self, below: int) -> None:
        """Every one-phase commit marker below ``below`` has its offsets in the table."""
        with self._lock:
            if below > self.txn_markers:
                self.txn_markers = below
                self._log(["markers", below])
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
                        self._log(["c", key[0], key[1], qid, offset])
                        moved += 1
            self._dirty |= moved > 0
        return moved

    def persist(self, force: bool = False) -> bool:
        """Save the table; False when nothing changed since the last save. Every commit
        made before the call is on disk when it returns. Callers in several threads (the
        periodic save, transactional commits) take turns, since two saves at once
        could rename each other's temp file away (FileNotFoundError to a commit that
        was stored) and leave the older table on disk."""
        with self._saving, self._sync_lock:
            with self._lock:
                if not (self._dirty or force):
                    return False
                covered = self._rotate()
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
            if covered:
                with contextlib.suppress(FileNotFoundError):
                    self._covered_path.unlink()  # the save holds every change it had
        return True

    def _rotate(self) -> bool:
        """Start a new journal for the changes after the table a save is taking (the
        caller holds ``_saving``, ``_sync_lock`` and ``_lock``); the old one's changes go to the
        ``.journal.old`` the save removes once it is on disk. False: nothing to cover."""
        old = self._journal
        if old.tell() == 0 and not self._covered_path.exists():
            return False
        os.fsync(old.fileno())
        old.close()
        if self._covered_path.exists():  # a failed save's: the changes pile up in it
            with open(self._covered_path, "ab") as pile:
                pile.write(self._journal_path.read_bytes())
                pile.flush()
                os.fsync(pile.fileno())
            self._journal_path.unlink()
        else:
            os.replace(self._journal_path, self._covered_path)
        self._journal = self._open_journal()
        self._synced = self._written  # the rotated journal was fsynced above
        dir_fd = os.open(self._journal_path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the new journal's name, before a commit relies on it
        finally:
            os.close(dir_fd)
        return True
