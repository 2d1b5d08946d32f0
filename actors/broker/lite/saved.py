"""The lite subscription tables of a broker saved beside the lite offsets:
``<store>/lite/subscriptions.json``, written whole and atomically
(:func:`storage.atomic_file.write_atomically`) by
:class:`~actors.broker.lite.consumers.LiteConsumers` when they changed.

The file holds, per consumer group and parent, each lite topic's subscribers in the
order they came (the first owns it, :mod:`actors.broker.lite.groups`), and ``at``: in a
Raft group, where the last consumer state record the tables hold ends in the CommitLog
(the changes after it are replayed from the log at start); 0 elsewhere.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from actors.broker.lite.groups import LiteGroup
from storage.atomic_file import write_atomically

VERSION = 1
FILE = "subscriptions.json"

Key = tuple[str, str]  # (group, parent)
Part = dict[str, tuple[str, ...]]  # lite topic -> its subscribers, the owner first


class SavedTablesError(ValueError):
    """The file does not hold subscription tables."""


def part_of(g: LiteGroup) -> Part:
    """What the file keeps of one group's table: a copy of the dict, its tuples shared
    (a change replaces a tuple, never changes one), taken under the tables' lock."""
    return dict(g.subscribers)


class SavedTables:
    """The subscription tables' file of one lite store."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE

    def write(self, at: int, parts: Iterable[tuple[Key, Part]]) -> None:
        """Replace the file with these tables (atomically: a reader finds the old file
        or the new one, whole)."""
        doc = {
            "version": VERSION,
            "at": at,
            "groups": [
                {"group": group, "parent": parent, "subscribers": part}
                for (group, parent), part in parts
                if part
            ],
        }
        text = json.dumps(doc, separators=(",", ":"))
        write_atomically(self.path, text)

    def read(self) -> tuple[int, dict[Key, LiteGroup]] | None:
        """``(at, tables)`` as saved, every client counting as heard from now; None
        without a file. ``OSError`` when it cannot be read, :class:`SavedTablesError`
        when it holds no tables."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            doc = json.loads(raw)
        except ValueError as exc:  # UnicodeDecodeError is one
            raise SavedTablesError(f"not JSON: {exc}") from None
        try:
            return _tables(doc)
        except TypeError as exc:  # an unhashable client name
            raise SavedTablesError(str(exc)) from None

    def set_aside(self) -> Path | None:
        """Move an unreadable file out of the way (kept for a look); where it went."""
        aside = self.path.with_name(self.path.name + ".corrupt")
        try:
            os.replace(self.path, aside)
        except OSError:
            return None
        return aside


def _tables(doc: Any) -> tuple[int, dict[Key, LiteGroup]]:
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise SavedTablesError(f"not a version {VERSION} object")
    at, groups = doc.get("at"), doc.get("groups")
    if isinstance(at, bool) or not isinstance(at, int) or at < 0:
        raise SavedTablesError(f"at={at!r}: an int >= 0")
    if not isinstance(groups, list):
        raise SavedTablesError("groups: a list")
    now = time.monotonic()
    out: dict[Key, LiteGroup] = {}
    for entry in groups:
        if not isinstance(entry, dict):
            raise SavedTablesError(f"a group entry {entry!r}: an object")
        group, parent, subs = entry.get("group"), entry.get("parent"), entry.get("subscribers")
        if not isinstance(group, str) or not isinstance(parent, str) or not isinstance(subs, dict):
            raise SavedTablesError(f"a group entry of {group!r}: group, parent, subscribers")
        g = out.setdefault((group, parent), LiteGroup())
        _fill(g, group, subs, now)
    return at, out


def _fill(g: LiteGroup, group: str, subs: dict[str, Any], now: float) -> None:
    """One group's table from its saved subscribers (checked)."""
    subscribers, owner, subscribed = g.subscribers, g.owner, g.subscribed
    for name, clients in subs.items():
        if type(clients) is not list or not clients:
            raise SavedTablesError(f"lite topic {name!r} of group {group!r}: its clients")
        held = tuple(clients)
        subscribers[name] = held
        owner[name] = held[0]
        for c in held:
            mine = subscribed.get(c)
            if mine is None:
                if type(c) is not str:
                    raise SavedTablesError(f"lite topic {name!r} of group {group!r}: client {c!r}")
                mine = subscribed[c] = set()
            mine.add(name)
    # a client twice in a lite topic's list would be dropped once and own it still
    if sum(len(m) for m in subscribed.values()) != sum(len(c) for c in subscribers.values()):
        raise SavedTablesError(f"group {group!r}: a client twice among a lite topic's subscribers")
    for c in subscribed:
        g.seen[c] = now
