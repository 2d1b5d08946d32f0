"""The in-memory table of lite topics: numpy columns indexed by lite topic id.

Per id, 40 bytes: generation, parent id (-1: a free id), last index entry, next offset
(the topic's message count), last write time and where it was created (the CommitLog
position :mod:`storage.lite.names` records). Ids are dense (freed ids are given again),
so a million lite topics take 40 MB here, plus the name dictionary.
"""

from __future__ import annotations

import numpy as np


class LiteTable:
    def __init__(self, capacity: int = 1024) -> None:
        self.size = 0  # ids ever given: [0, size)
        self.gen = np.zeros(capacity, dtype=np.uint32)
        self.parent = np.full(capacity, -1, dtype=np.int32)
        self.last = np.full(capacity, -1, dtype=np.int64)
        self.next_off = np.zeros(capacity, dtype=np.int64)
        self.last_ms = np.zeros(capacity, dtype=np.int64)
        self.born = np.full(capacity, -1, dtype=np.int64)
        self._views()

    def _views(self) -> None:
        """Memoryviews of the columns a single put reads and writes: an item of one is
        a Python int, read or written at a fraction of a numpy scalar's cost. Made
        again whenever :meth:`ensure` replaces the columns."""
        self.gen_v = self.gen.data
        self.last_v = self.last.data
        self.next_off_v = self.next_off.data
        self.last_ms_v = self.last_ms.data

    def ensure(self, n: int) -> None:
        """Room for ids [0, n)."""
        cap = len(self.gen)
        if n <= cap:
            self.size = max(self.size, n)
            return
        new = max(n, cap * 2)
        for name, fill in (
            ("gen", 0),
            ("parent", -1),
            ("last", -1),
            ("next_off", 0),
            ("last_ms", 0),
            ("born", -1),
        ):
            old = getattr(self, name)
            grown = np.full(new, fill, dtype=old.dtype)
            grown[:cap] = old
            setattr(self, name, grown)
        self._views()
        self.size = max(self.size, n)

    def memory_bytes(self) -> int:
        return sum(
            a.nbytes
            for a in (self.gen, self.parent, self.last, self.next_off, self.last_ms, self.born)
        )
