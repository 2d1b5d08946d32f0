"""Micro-batch stream checkpoints a broker keeps for ``actors.bridge.streaming`` (pure Python, no Ray).

One entry per (group, topic): the stream's latest batch — its id, its planned
offset ranges and whether it finished — in the broker's
``config/streamCheckpoint.json``, saved (fsynced) on every change, because the
stream writes a plan *before* the batch runs and must find it after any crash.

Invariant: ``load`` returns exactly the last checkpoint ``save`` returned from
for that (group, topic), or ``None`` if there was none.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

from storage.config_files import JsonConfigFile

_SEP = "@"


class StreamCheckpoints:
    def __init__(self, file: JsonConfigFile) -> None:
        self._file = file
        self._lock = threading.Lock()
        self._table: dict[str, dict[str, Any]] = dict(file.load().get("checkpoints") or {})

    def save(self, group: str, topic: str, checkpoint: dict[str, Any]) -> None:
        with self._lock:
            self._table[f"{topic}{_SEP}{group}"] = copy.deepcopy(checkpoint)
            self._file.save({"checkpoints": self._table})

    def load(self, group: str, topic: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._table.get(f"{topic}{_SEP}{group}")
            return copy.deepcopy(found) if found is not None else None
