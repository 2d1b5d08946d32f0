"""The group coordinator's side that faces the brokers: the group's topics' routes (read
from the NameServers again on every route change and every ``route_refresh_s``), the
master handles they name, and the fences set on them before a queue changes owner (set
again on a broker that comes back as a new incarnation). ``GroupCoordinator``
(``actors.coordinator.coordinator``) is built on it; the rules are its docstring's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from actors.config.coordinator import CoordinatorConfig
from actors.coordinator.state import GroupState
from actors.namesrv.brokers import BrokerHandles
from actors.namesrv.client import NameServerClient
from actors.protocol.fencing import FencingToken
from actors.protocol.route import TopicRouteData
from actors.protocol.topic import is_readable
from rebalance import MessageQueue
from storage.errors import TopicNotFoundError

log = logging.getLogger("raymq.actors.coordinator.coordinator")

FENCE_RETRY_S = 0.2


def readable_queues(route: TopicRouteData) -> list[MessageQueue]:
    """The queues of ``route`` a consumer can read now: readable perm, live master."""
    live = {bd.broker_name for bd in route.broker_datas if bd.master_actor_name()}
    return sorted(
        MessageQueue(route.topic, qd.broker_name, q)
        for qd in route.queue_datas
        if is_readable(qd.perm) and qd.broker_name in live
        for q in range(qd.read_queue_nums)
    )


class BrokerSide:
    """Routes, broker handles and fences of one group's coordinator."""

    group: str
    config: CoordinatorConfig
    ns: NameServerClient | None
    handles: BrokerHandles
    state: GroupState
    _brokers: dict[str, Any]  # broker name -> master handle, from the routes
    _incarnations: dict[str, str]  # broker name -> incarnation we fenced on
    _closing: bool

    async def _io_call(self, fn: Any, *args: Any) -> Any:
        raise NotImplementedError

    async def _ensure_ready(self) -> None:
        raise NotImplementedError

    def _after(self) -> None:
        raise NotImplementedError

    def _topic_brokers(self, topic: str) -> dict[str, Any]:
        """The live masters holding ``topic``'s queues, by broker name."""
        assert self.ns is not None
        route = self.ns.require_route(topic, refresh=True)
        names = {qd.broker_name for qd in route.queue_datas}
        return {
            bd.broker_name: self.handles.broker(route, bd.broker_name)
            for bd in route.broker_datas
            if bd.broker_name in names and bd.master_actor_name()
        }

    async def _fence_loop(self) -> None:
        while self.state.to_fence and not self._closing:
            pending = self.state.pending_fences()
            by_broker: dict[str, dict[MessageQueue, FencingToken]] = {}
            for q, tok in pending.items():
                by_broker.setdefault(q.broker_name, {})[q] = tok
            results = await asyncio.gather(
                *(self._fence_on(name, fences) for name, fences in by_broker.items())
            )
            done: dict[MessageQueue, FencingToken | None] = {}
            for fences, ok in zip(by_broker.values(), results):
                if ok is None:
                    continue  # the broker did not answer: again shortly
                done.update({q: tok if ok else None for q, tok in fences.items()})
            if done:
                self.state.fence_done(done)
                self._after()
            if len(done) < len(pending):
                await asyncio.sleep(FENCE_RETRY_S)

    async def _fence_on(
        self, broker_name: str, fences: dict[MessageQueue, FencingToken]
    ) -> bool | None:
        """True: fenced. False: the broker is not in the routes (nobody can commit
        there). None: it did not answer."""
        handle = self._brokers.get(broker_name)
        if handle is None:
            await self._refresh_routes(set())
            handle = self._brokers.get(broker_name)
            if handle is None:
                return False
        table = {(q.topic, q.queue_id): tok for q, tok in fences.items()}
        try:
            await asyncio.wait_for(
                handle.fence_offsets.remote(self.group, table), self.config.fence_timeout_s
            )
        except Exception as exc:  # noqa: BLE001 - retried; a dead broker leaves the routes
            log.warning("group %s: fencing on %s failed: %s", self.group, broker_name, exc)
            self._brokers.pop(broker_name, None)
            return None
        log.info(
            "group %s: fenced %d queue(s) on %s at %s", self.group, len(table), broker_name, fences
        )
        return True

    async def _refence(self) -> None:
        """Set the recorded fences again on a broker that came back as a new incarnation."""
        by_broker: dict[str, dict[MessageQueue, FencingToken]] = {}
        for q, tok in self.state.fences.items():
            by_broker.setdefault(q.broker_name, {})[q] = tok
        for name, fences in by_broker.items():
            handle = self._brokers.get(name)
            if handle is None:
                continue
            try:
                incarnation = await asyncio.wait_for(handle.ping.remote(), 5.0)
            except Exception:  # noqa: BLE001 - next route change
                continue
            if self._incarnations.get(name) == incarnation:
                continue
            if await self._fence_on(name, fences):
                self._incarnations[name] = incarnation

    def _read_routes(
        self, topics: set[str]
    ) -> tuple[dict[str, list[MessageQueue]], dict[str, Any]]:
        assert self.ns is not None
        queues: dict[str, list[MessageQueue]] = {}
        brokers: dict[str, Any] = {}
        for topic in sorted(topics):
            try:
                route = self.ns.require_route(topic, refresh=True)
            except TopicNotFoundError:
                queues[topic] = []
                continue
            queues[topic] = readable_queues(route)
            for bd in route.broker_datas:
                if bd.master_actor_name():
                    with contextlib.suppress(Exception):
                        brokers[bd.broker_name] = self.handles.broker(route, bd.broker_name)
        return queues, brokers

    async def _refresh_routes(self, extra: set[str]) -> None:
        topics = self.state.topics() | extra
        if not topics or self.ns is None:
            return
        try:
            queues, brokers = await self._io_call(self._read_routes, topics)
        except Exception as exc:  # noqa: BLE001 - NameServers down: keep what we know
            log.warning("group %s: reading routes failed: %s", self.group, exc)
            return
        self._brokers = brokers
        if self.state.set_queues(queues) and self.state.members:
            self.state.rebalance("routes")
            self._after()

    async def _route_loop(self) -> None:
        """Re-read routes on every NameServer route change, and every route_refresh_s."""
        version = -1
        index = 0
        while not self._closing:
            try:
                await self._ensure_ready()
                assert self.ns is not None
                names = self.ns.nameservers
                handle = await self._io_call(self.ns._handle, names[index % len(names)])
                version = await asyncio.wait_for(
                    handle.wait_route_change.remote(version, self.config.route_refresh_s),
                    self.config.route_refresh_s + 10.0,
                )
                await self._refresh_routes(set())
                if self.state.fences:
                    await self._refence()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - try the next NameServer
                log.debug("group %s: route watch failed: %s", self.group, exc)
                index += 1
                version = -1
                await asyncio.sleep(1.0)
