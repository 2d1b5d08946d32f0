"""The NameServer actor: the route table, broker liveness, nothing on the data path.

Several NameServers run side by side and never talk to each other; every
broker registers with each of them. A broker leaves the routes when it
unregisters, when its heartbeat is older than ``broker_expired_s`` (a scan every
``scan_interval_s``), or at once when Ray reports its actor dead: the
NameServer keeps one call pending on each broker (``Broker.wait_closed``), and
Ray fails that call as soon as the actor or its node dies.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import ray
from ray.exceptions import RayError

from actors.config.namesrv import NameServerConfig
from actors.namesrv.route_info import RouteInfoManager
from actors.protocol.route import BrokerRegistration, TopicRouteData

log = logging.getLogger("raymq.actors.namesrv.nameserver")


class NameServer:
    """Ray actor class (created by :func:`actors.start_cluster` as ``nameserver-<i>``)."""

    def __init__(self, config: NameServerConfig | None = None, index: int = 0) -> None:
        self.config = config or NameServerConfig()
        self.index = index
        self.routes = RouteInfoManager()
        self._watches: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._route_waiters: list[asyncio.Future[None]] = []
        self._started = time.time()
        # an async actor runs __init__ inside its event loop
        self._scanner = asyncio.get_event_loop().create_task(self._scan_loop())
        log.info("nameserver-%d started (broker_expired_s=%g)", index, self.config.broker_expired_s)

    # ------------------------------------------------------------ brokers
    async def register_broker(self, reg: BrokerRegistration) -> dict[str, Any]:
        """Add or refresh a broker and its topics; watch its actor for death. The answer
        names the group's master and its epoch; a master of an older epoch is refused
        (``accepted`` False) and learns who replaced it."""
        if not self.routes.accepts(reg):
            master, epoch = self.routes.master_of(reg.broker_name)
            log.warning(
                "refusing %s as master of %s in epoch %d: %s masters it in epoch %d",
                reg.actor_name,
                reg.broker_name,
                reg.master_epoch,
                master,
                epoch,
            )
            return {"nameserver": self.index, "new": False, "accepted": False, **self._master(reg)}
        before = self.routes.version
        is_new = self.routes.register(reg, time.monotonic())
        if self.routes.version != before:
            self._route_changed()
        key = (reg.broker_name, reg.broker_id)
        if reg.handle is not None and (is_new or key not in self._watches):
            old = self._watches.pop(key, None)
            if old is not None:
                old.cancel()
            self._watches[key] = asyncio.get_running_loop().create_task(
                self._watch(key, reg.incarnation, reg.handle)
            )
        return {"nameserver": self.index, "new": is_new, "accepted": True, **self._master(reg)}

    def _master(self, reg: BrokerRegistration) -> dict[str, Any]:
        master, epoch = self.routes.master_of(reg.broker_name)
        return {"master": master, "master_epoch": epoch}

    def _route_changed(self) -> None:
        waiters, self._route_waiters = self._route_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait_route_change(self, known_version: int, timeout_s: float = 30.0) -> int:
        """Long poll: the route table's version, once it differs from ``known_version``
        (or after ``timeout_s``). Clients hold one of these to drop cached routes as soon
        as a broker joins, leaves or a new master takes over."""
        if known_version == self.routes.version:
            fut = asyncio.get_running_loop().create_future()
            self._route_waiters.append(fut)
            try:
                await asyncio.wait_for(fut, min(max(timeout_s, 0.0), 300.0))
            except asyncio.TimeoutError:
                pass
            finally:
                if fut in self._route_waiters:
                    self._route_waiters.remove(fut)
        return self.routes.version

    async def unregister_broker(
        self, broker_name: str, broker_id: int, incarnation: str | None = None
    ) -> bool:
        removed = self.routes.unregister(broker_name, broker_id, incarnation)
        if removed:
            self._route_changed()
            task = self._watches.pop((broker_name, broker_id), None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        return removed

    async def _watch(self, key: tuple[str, int], incarnation: str, handle: Any) -> None:
        try:
            await handle.wait_closed.remote()
            reason = "actor shut down"
        except asyncio.CancelledError:
            raise
        except RayError as exc:
            reason = f"Ray reports the actor dead ({type(exc).__name__})"
        except Exception as exc:  # noqa: BLE001 - any failure of the watch means the broker is gone
            reason = f"watch failed ({type(exc).__name__}: {exc})"
        if self._watches.get(key) is asyncio.current_task():
            del self._watches[key]
        if self.routes.unregister(key[0], key[1], incarnation, reason=reason):
            self._route_changed()

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.scan_interval_s)
            expired = self.routes.scan_expired(time.monotonic(), self.config.broker_expired_s)
            if expired:
                self._route_changed()
            for name, bid in expired:
                task = self._watches.pop((name, bid), None)
                if task is not None:
                    task.cancel()

    # ------------------------------------------------------------ clients
    async def get_route(self, topic: str) -> TopicRouteData | None:
        return self.routes.route(topic)

    async def get_routes(self, topics: list[str]) -> dict[str, TopicRouteData | None]:
        return {t: self.routes.route(t) for t in topics}

    async def get_all_topics(self) -> list[str]:
        return self.routes.topics()

    async def get_cluster_info(self) -> dict[str, Any]:
        info = self.routes.cluster_info(time.monotonic())
        info["nameserver"] = self.index
        info["uptime_s"] = round(time.time() - self._started, 1)
        info["node_id"] = ray.get_runtime_context().get_node_id()
        info["pid"] = os.getpid()
        return info

    async def get_brokers(self) -> list[BrokerRegistration]:
        """Live brokers' registrations without their handles (for admin tools)."""
        import dataclasses

        return [dataclasses.replace(r, handle=None) for r in self.routes.brokers()]

    async def ping(self) -> int:
        return self.index
