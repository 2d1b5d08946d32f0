"""Consumer groups' offsets in lite topics: per group one int64 column by lite topic id.

A group's committed offset in a lite topic is ``off[lid]``, valid while ``gen[lid]`` is
the lite topic's generation (an expired topic's id given to a new one reads as "no
offset" for every group, without a pass over the groups). A million lite topics cost
12 bytes each per group that consumed any of them. The columns are saved to
``offsets.npz`` at each flush that follows a change (atomically: a temp file renamed).
Outside a Raft group a commit after the last flush is lost with a crash, and those
messages come again; in a Raft group the commit is a record of the group's log, which
the store applies again at open (:mod:`storage.lite.store`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .. import codec


class LiteOffsets:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._off: dict[str, np.ndarray] = {}
        self._gen: dict[str, np.ndarray] = {}
        self.changed = False
        if path.exists():
            with np.load(path) as data:
                for key in data.files:
                    kind, group = key.split(":", 1)
                    (self._off if kind == "off" else self._gen)[group] = data[key].copy()

    def get(self, group: str, lid: int, gen: int) -> int:
        off = self._off.get(group)
        if off is None or lid >= len(off) or self._gen[group][lid] != gen:
            return -1
        return int(off[lid])

    def commit(self, group: str, lid: int, gen: int, offset: int) -> None:
        off = self._off.get(group)
        if off is None:
            codec.validate_topic(group)  # a group's name follows the topic rule
            off = self._off[group] = np.full(0, -1, dtype=np.int64)
            self._gen[group] = np.zeros(0, dtype=np.uint32)
        if lid >= len(off):
            size = max(lid + 1, 2 * len(off), 1024)
            grown = np.full(size, -1, dtype=np.int64)
            grown[: len(off)] = off
            gens = np.zeros(size, dtype=np.uint32)
            gens[: len(off)] = self._gen[group]
            off = self._off[group] = grown
            self._gen[group] = gens
        off[lid] = offset
        self._gen[group][lid] = gen
        self.changed = True

    def groups(self) -> list[str]:
        return sorted(self._off)

    def snapshot(self) -> dict[str, np.ndarray] | None:
        """Copies of the columns if changed since the last snapshot (the caller holds
        the lite store's lock; copying is a memcpy), else None."""
        if not self.changed:
            return None
        self.changed = False
        arrays = {f"off:{g}": a.copy() for g, a in self._off.items()}
        arrays.update({f"gen:{g}": a.copy() for g, a in self._gen.items()})
        return arrays

    def write(self, arrays: dict[str, np.ndarray]) -> None:
        """Save a snapshot (outside the lock: writes go on meanwhile)."""
        tmp = self.path.with_name(self.path.name + ".tmp.npz")
        savez: Any = np.savez
        with open(tmp, "wb") as f:
            savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
