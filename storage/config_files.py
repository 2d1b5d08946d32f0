"""The store's ``config/*.json`` files, written atomically.

A write goes to ``name.json.tmp``, is fsynced, the previous file is kept as
``name.json.bak`` and the temp file is renamed over the original
(:func:`storage.atomic_file.write_atomically`), so a crash leaves either the old or
the new content, never a torn file. Writes of one file from several threads take
turns (they share the temp file's name).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from .atomic_file import write_atomically
from .errors import StoreCorruptedError

log = logging.getLogger("raymq.storage.config_files")

_saving: dict[str, threading.Lock] = {}  # a file's path -> the lock its writes take
_saving_guard = threading.Lock()


def _lock_of(path: Path) -> threading.Lock:
    with _saving_guard:
        return _saving.setdefault(str(path), threading.Lock())


class JsonConfigFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, Any]:
        """The file's object; ``{}`` when absent; the backup when the file is damaged."""
        for candidate in (self.path, self.path.with_suffix(".json.bak")):
            if not candidate.exists():
                continue
            try:
                data = json.loads(candidate.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                log.error("%s is damaged (%s), trying its backup", candidate, exc)
                continue
            if not isinstance(data, dict):
                raise StoreCorruptedError(f"{candidate}: expected a JSON object")
            return data
        if self.path.exists():
            raise StoreCorruptedError(f"{self.path} and its backup are both unreadable")
        return {}

    def save(self, data: dict[str, Any]) -> None:
        text = json.dumps(data, indent=2, sort_keys=True)
        with _lock_of(self.path):
            self._write(text)

    def _write(self, text: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(
            self.path,
            text,
            tmp=self.path.with_suffix(".json.tmp"),
            backup=self.path.with_suffix(".json.bak"),
        )
