"""A broker's master epochs and runtime role, in ``config/haState.json``.

Each promotion of a slave starts a new master epoch at the new master's
CommitLog end. A member's epoch list names, for the bytes of its own
CommitLog, which epoch's master wrote them: ``[(epoch, start offset), ...]``
with epochs and start offsets ascending. Two members agree on their
CommitLogs up to their *consistent point*: the end, in both, of the newest
epoch they share. A slave that joins a master cuts its CommitLog back to that
point before it replicates (a deposed master drops the tail nobody
acknowledged), the way Kafka's leader epochs and RocketMQ 5's controller do.

The file also keeps the role a broker took at runtime (a promoted slave stays
master, a deposed master stays slave, across restarts), the highest epoch
it has heard of, so a promotion always starts a newer epoch, and, on a slave, the
highest offset its master said a SYNC_MASTER acknowledged (``confirmed``, with the
master's epoch then): after the whole group went down, a slave restarted behind
that offset still knows it, and refuses a promotion that would lose it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from storage.config_files import JsonConfigFile

log = logging.getLogger("raymq.actors.ha")

Epochs = list[tuple[int, int]]


def _normal(epochs: Sequence[Sequence[int]], end: int) -> Epochs:
    out = [(int(e), int(s)) for e, s in epochs]
    if not out and end > 0:
        out = [(0, 0)]  # a log written before any epoch was recorded
    return out


def _ends(epochs: Epochs, end: int) -> dict[int, tuple[int, int]]:
    """epoch -> (start, end) within a log that ends at ``end``."""
    spans = {}
    for i, (epoch, start) in enumerate(epochs):
        stop = epochs[i + 1][1] if i + 1 < len(epochs) else end
        spans[epoch] = (start, min(stop, end))
    return spans


def consistent_point(
    mine: Sequence[Sequence[int]], my_end: int, theirs: Sequence[Sequence[int]], their_end: int
) -> int:
    """The offset up to which two logs with these epochs hold the same bytes."""
    a = _ends(_normal(mine, my_end), my_end)
    b = _ends(_normal(theirs, their_end), their_end)
    for epoch in sorted(set(a) & set(b), reverse=True):
        (start_a, end_a), (start_b, end_b) = a[epoch], b[epoch]
        if start_a == start_b:
            return max(0, min(end_a, end_b))
    return 0


class HAState:
    """``config/haState.json``: runtime role, epochs of this log, highest epoch heard of."""

    def __init__(self, file: JsonConfigFile) -> None:
        self._file = file
        data = file.load()
        self.role: str | None = data.get("role")
        self.epochs: Epochs = [(int(e), int(s)) for e, s in data.get("epochs", [])]
        self.max_epoch: int = int(data.get("maxEpoch", self.epochs[-1][0] if self.epochs else 0))
        confirmed = data.get("confirmed") or (0, 0)
        self.confirmed_epoch, self.confirmed = int(confirmed[0]), int(confirmed[1])
        """The highest acknowledged SYNC_MASTER offset a master told this slave of, and
        that master's epoch (saved by :meth:`save`, which the slave calls at most about
        once a second: see ``HAClient``)."""

    def save(self) -> None:
        self._file.save(
            {
                "role": self.role,
                "epochs": [list(e) for e in self.epochs],
                "maxEpoch": self.max_epoch,
                "confirmed": [self.confirmed_epoch, self.confirmed],
            }
        )

    @property
    def epoch(self) -> int:
        """The epoch of this log's newest bytes (0 before any promotion)."""
        return self.epochs[-1][0] if self.epochs else 0

    def ensure_started(self, end: int) -> None:
        """A master with no recorded epoch writes in epoch 0 from the start."""
        if not self.epochs:
            self.epochs = _normal([], end) or [(0, 0)]
            self.save()

    def begin_epoch(self, start: int) -> int:
        """Start a new master epoch at ``start`` (a promotion); return it."""
        epoch = max(self.max_epoch, self.epoch) + 1
        self.epochs = [(e, s) for e, s in self.epochs if s <= start] + [(epoch, start)]
        self.max_epoch = epoch
        self.save()
        return epoch

    def adopt(self, master_epochs: Sequence[Sequence[int]], end: int) -> None:
        """Follow the master's epochs for the bytes this log holds (up to ``end``)."""
        mine = [(int(e), int(s)) for e, s in master_epochs if int(s) <= end]
        top = max((int(e) for e, _ in master_epochs), default=0)
        if mine != self.epochs or top > self.max_epoch:
            self.epochs = mine
            self.max_epoch = max(self.max_epoch, top)
            self.save()

    def truncated(self, end: int) -> None:
        """The log was cut back to ``end``: forget epochs that began after it, and a
        confirmed offset past it (the master that cut it never had those bytes)."""
        kept = [(e, s) for e, s in self.epochs if s <= end]
        if kept != self.epochs or self.confirmed > end:
            self.epochs = kept
            self.confirmed = min(self.confirmed, end)
            self.save()

    def set_role(self, role: str) -> None:
        if role != self.role:
            self.role = role
            self.save()
