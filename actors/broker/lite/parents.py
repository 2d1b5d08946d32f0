"""The LITE parents of a broker: topics of type LITE with their quota of lite topics and
the TTL of a lite topic after its last write, kept in ``config/liteParents.json`` (their
TopicConfig with the other topics), and the listings of their lite topics.

A Raft follower copies its leader's parents every ``slave_sync_interval_s``, so it serves
them as the leader did once it leads; it refuses to create one itself
(``BrokerUnavailableError``), since its leader would never learn of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from actors.broker.ha import DLedgerReplication
from actors.broker.runtime import BrokerRuntime
from actors.protocol.topic import TopicConfig
from storage.codec import validate_topic
from storage.errors import BrokerUnavailableError, InvalidConfigError, InvalidMessageError
from storage.lite import LiteStore

log = logging.getLogger("raymq.actors.broker.lite")

_FILE = "liteParents"


class LiteParents:
    REQUESTS = ("create_parent", "parents", "topics", "describe_parent", "topics_page")
    """The coroutines a Broker serves as Ray methods named ``lite_<name>``."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        store: LiteStore,
        admin: Any,
        raft: DLedgerReplication | None,
    ) -> None:
        self.rt = runtime
        self.store = store
        self.admin = admin
        self._file = runtime.store.config_file(_FILE)
        for parent, spec in (self._file.load() or {}).items():
            store.declare_parent(parent, quota=spec["quota"], ttl_ms=spec["ttlMs"])
        self._raft = raft
        self._following: asyncio.Task[None] | None = None
        self.caught_up: Callable[[], Awaitable[None]] | None = None
        """Awaited before a listing: a Raft leader's lite store takes what its group
        committed first (set by the processor)."""
        if raft is not None:
            self._following = runtime.loop.create_task(self._follow(raft))

    def close(self) -> None:
        if self._following is not None:
            self._following.cancel()

    async def create_parent(
        self,
        parent: str,
        quota: int | None = None,
        ttl_ms: int | None = None,
        queues: int = 1,
    ) -> dict[str, Any]:
        """Create ``parent`` as a topic of type LITE (or change its quota and TTL). In a
        Raft group only the leader creates one: a follower refuses
        (``BrokerUnavailableError``) and changes nothing."""
        validate_topic(parent)
        for name, value in (("quota", quota), ("ttl_ms", ttl_ms)):
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise InvalidConfigError(f"{name}={value!r}: must be an int > 0")
        raft = self._raft
        if raft is not None and not raft.node.is_leader:
            raise BrokerUnavailableError(
                f"broker {self.rt.config.actor_name} does not lead its Raft group "
                f"(leader: {raft.node.leader_id or 'being elected'}): create LITE topic "
                f"{parent!r} on the leader"
            )
        if parent in self.store.parents():
            used = self.store.count(parent)
            if quota is not None and quota < used:
                raise InvalidConfigError(
                    f"quota={quota} for LITE topic {parent!r}: below the {used} lite topics "
                    "it holds now"
                )
        await self.admin.create_topic(TopicConfig(parent, queues, queues))
        self.store.declare_parent(parent, quota=quota, ttl_ms=ttl_ms)
        p = self.store.parent_settings(parent)
        saved = self._file.load() or {}
        saved[parent] = {"quota": p["quota"], "ttlMs": p["ttl_ms"]}
        await self.rt.run(self._file.save, saved)
        return {"parent": parent, **p}

    async def parents(self) -> dict[str, dict[str, int]]:
        return dict(self._file.load() or {})

    async def _follow(self, raft: DLedgerReplication) -> None:
        """A Raft follower takes its leader's LITE parents (quota and TTL), so that it
        serves them as the leader did once it leads."""
        interval = self.rt.config.slave_sync_interval_s
        while True:
            await asyncio.sleep(interval)
            if raft.node.is_leader or self.rt.closing:
                continue
            try:
                handle = await raft.leader_handle()
                if handle is None:
                    continue
                theirs = await asyncio.wait_for(handle.lite_parents.remote(), 10.0)
                await self._take(theirs)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the next turn asks again
                log.debug("lite parents not copied from the Raft leader: %s", exc)

    async def _take(self, theirs: dict[str, dict[str, int]]) -> None:
        saved = self._file.load() or {}
        if all(saved.get(name) == spec for name, spec in theirs.items()):
            return
        for name, spec in theirs.items():
            self.store.declare_parent(name, quota=spec["quota"], ttl_ms=spec["ttlMs"])
            saved[name] = dict(spec)
        await self.rt.run(self._file.save, saved)

    async def _ready(self) -> None:
        if self.caught_up is not None:
            await self.caught_up()

    async def topics(self, parent: str) -> list[str]:
        await self._ready()
        return await self.rt.run(self.store.lite_topics, parent)

    async def describe_parent(self, parent: str) -> dict[str, int]:
        """A parent's quota, TTL and live lite topics (``NotALiteParentError`` for a
        topic of another type)."""
        await self._ready()
        return self.store.parent_settings(parent)

    async def topics_page(self, parent: str, after: str = "", limit: int = 100) -> dict[str, Any]:
        """The live lite topics of ``parent`` sorted by name, the first ``limit`` after
        ``after``: ``{"lite_topics", "total", "remaining"}`` (``remaining``: the names
        after ``after``, this page's included)."""
        if not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidMessageError(f"limit={limit!r}: an int from 1 to 10000")
        if not isinstance(after, str):
            raise InvalidMessageError(f"after={after!r}: a lite topic name or ''")
        await self._ready()
        page, total, remaining = await self.rt.run(
            self.store.lite_topics_page, parent, after, limit
        )
        return {"lite_topics": page, "total": total, "remaining": remaining}
