"""The broker's offset fences: a consumer that lost a queue cannot commit it any more.

Invariants of :class:`OffsetFenceTable`:

* a fence only rises (``raise_fences`` keeps the larger token);
* :meth:`check` refuses a whole commit when any of its queues has a token below
  that queue's fence, so a refused commit changes nothing (all or nothing, as
  ``Broker.commit_offsets`` is); a queue committed without a token (a
  ``PullConsumer``, an admin reset, an older client) is never refused.

The table is kept in memory, not persisted with ``consumerOffset.json``: that
file is written every few seconds and would not hold a fence set just before a
crash anyway, and the coordinator is the authority on fences: it keeps every
fence it set and pushes them again to a broker that comes back under a new
incarnation (see ``actors.coordinator.coordinator``). A stale commit can slip in only in
the moment between a broker's restart and that push, and then at worst
redelivers or skips what the stale owner itself consumed: the offset file stays
in RocketMQ's layout.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from actors.protocol.fencing import FencingToken, OffsetFencedError, check_token


class OffsetFenceTable:
    """Per (group, topic, queue id): the lowest fencing token a commit may carry."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fences: dict[str, dict[tuple[str, int], FencingToken]] = {}

    def raise_fences(self, group: str, fences: Mapping[tuple[str, int], FencingToken]) -> int:
        """Raise the fences of ``group``'s queues (never lowers one); return how many rose."""
        checked = {
            key: check_token(tok, f"{group}:{key[0]}:{key[1]}") for key, tok in fences.items()
        }
        raised = 0
        with self._lock:
            table = self._fences.setdefault(group, {})
            for key, tok in checked.items():
                if tok > table.get(key, (-1, -1)):
                    table[key] = tok
                    raised += 1
        return raised

    def check(
        self,
        group: str,
        offsets: Mapping[tuple[str, int], int],
        tokens: Mapping[tuple[str, int], FencingToken] | None,
    ) -> None:
        """Raise OffsetFencedError if a queue of ``offsets`` carries a token below its fence."""
        if not tokens:
            return
        table = self._fences.get(group)
        stale = []
        for key in offsets:
            tok = tokens.get(key)
            if tok is None:
                continue
            tok = check_token(tok, f"{group}:{key[0]}:{key[1]}")
            fence = table.get(key) if table else None
            if fence is not None and tok < fence:
                stale.append(f"{key[0]}:{key[1]} token {tok} < fence {fence}")
        if stale:
            raise OffsetFencedError(
                f"group {group!r}: offset commit refused, the committer no longer owns "
                f"{len(stale)} queue(s): {'; '.join(sorted(stale)[:8])}"
            )

    def snapshot(self, group: str) -> dict[tuple[str, int], FencingToken]:
        with self._lock:
            return dict(self._fences.get(group, {}))
