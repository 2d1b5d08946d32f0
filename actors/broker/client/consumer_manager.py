"""Which clients consume for which group (RocketMQ's ``ConsumerManager``).

A client counts as a member while it has pulled, committed or heartbeated
within ``channel_expired_s``, or within the session timeout its heartbeats
name (``ttl_s``: a push consumer asks to be dropped a few missed heartbeats
after it dies rather than minutes later); the member list is what a group's
rebalance will read.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ConsumerManager:
    def __init__(self, expired_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.expired_s = expired_s
        self._clock = clock
        self._groups: dict[str, dict[str, tuple[float, frozenset[str]]]] = {}
        self._ttl: dict[tuple[str, str], float] = {}  # (group, client) -> its session timeout

    def touch(
        self,
        group: str,
        client_id: str,
        topics: frozenset[str] = frozenset(),
        ttl_s: float | None = None,
    ) -> None:
        if not client_id:
            return
        members = self._groups.setdefault(group, {})
        old = members.get(client_id)
        members[client_id] = (self._clock(), topics | old[1] if old else topics)
        if ttl_s is not None and ttl_s > 0:
            self._ttl[(group, client_id)] = min(float(ttl_s), self.expired_s)

    def unregister(self, group: str, client_id: str) -> None:
        self._groups.get(group, {}).pop(client_id, None)
        self._ttl.pop((group, client_id), None)

    def members(self, group: str) -> list[str]:
        now = self._clock()
        members = self._groups.get(group, {})
        ttl = self._ttl
        for cid in [
            c
            for c, (seen, _) in members.items()
            if now - seen > ttl.get((group, c), self.expired_s)
        ]:
            del members[cid]
            ttl.pop((group, cid), None)
        return sorted(members)

    def groups(self) -> list[str]:
        return sorted(g for g in self._groups if self.members(g))
