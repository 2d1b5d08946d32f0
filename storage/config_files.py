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

_LOOKS = 3
"""Reads of a file that a concurrent write moved away under them, at most."""
_saving: dict[str, threading.Lock] = {}  # a file's path -> the lock its writes take
_saving_guard = threading.Lock()


def _lock_of(path: Path) -> threading.Lock:
    with _saving_guard:
        return _saving.setdefault(str(path), threading.Lock())


class JsonConfigFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, Any]:
        """The file's object; ``{}`` when absent; the backup when the file is damaged.

        A write in another thread or process moves the files while this reads them (the
        file to the backup, then the new one in its place): a file gone between the
        look and the read, or one that appeared after it, is looked for again."""
        backup = self.path.with_suffix(".json.bak")
        for _ in range(_LOOKS):
            read = False
            for candidate in (self.path, backup):
                try:
                    text = candidate.read_text(encoding="utf-8")
                except FileNotFoundError:
                    continue
                read = True
                try:
                    data = json.loads(text)
                except (ValueError, UnicodeDecodeError) as exc:
                    log.error("%s is damaged (%s), trying its backup", candidate, exc)
                    continue
                if not isinstance(data, dict):
                    raise StoreCorruptedError(f"{candidate}: expected a JSON object")
                return data
            if read:  # there, and damaged with its backup
                break
            if not self.path.exists():
                return {}
            # none there when looked at, the file there now: a first write just landed
        raise StoreCorruptedError(f"{self.path} and its backup are both unreadable")

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
