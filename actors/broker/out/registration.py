"""A broker's registration with every NameServer (RocketMQ's ``BrokerOuterAPI``).

A registration carries the broker's address, node, incarnation, its topic configs
and, through its role, the id it registers as and its master epoch. It is sent on a
heartbeat (``heartbeat_interval_s``), at once when a part asks for it (a topic
created, a role taken), and withdrawn on a clean shutdown. A NameServer that does
not answer is simply tried again on the next round: a registration nobody
refreshes expires on its own (``broker_expired_s``). Until a NameServer first answers
a registration (a cluster starting its NameServers and brokers at once), the next
round comes after :data:`FIRST_RETRY_S` instead of a whole heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import ray

from actors.broker.ha import Replication
from actors.broker.runtime import BrokerRuntime
from actors.protocol.route import BrokerRegistration

log = logging.getLogger("raymq.actors.broker.broker")

FIRST_RETRY_S = 0.5
"""Seconds between rounds while no NameServer has answered the broker's registration yet."""


class Registration:
    """Registers one broker with its NameServers and keeps it registered."""

    def __init__(self, runtime: BrokerRuntime, role: Replication) -> None:
        self.rt = runtime
        self.role = role
        self._task: asyncio.Task[None] | None = None
        self._taken = False  # a NameServer answered a registration of this broker

    def start(self) -> None:
        self._task = self.rt.loop.create_task(self._heartbeat_loop())

    def registration(self) -> BrokerRegistration:
        rt, c = self.rt, self.rt.config
        return BrokerRegistration(
            cluster=c.cluster_name,
            broker_name=c.broker_name,
            broker_id=self.role.registered_id,
            broker_addr=rt.addr,
            actor_name=c.actor_name,
            namespace=c.namespace,
            node_id=rt.node_id,
            incarnation=rt.incarnation,
            topic_configs=rt.topics.snapshot(),
            handle=ray.get_runtime_context().current_actor,
            master_epoch=self.role.master_epoch,
            data_addr=rt.data_addr,
            grpc_addr=rt.grpc_addr,
        )

    async def _register_one(self, name: str, reg: BrokerRegistration) -> dict[str, Any] | None:
        try:
            timeout = self.rt.config.register_timeout_s  # a GCS that does not answer: next beat
            handle = await asyncio.wait_for(self.rt.run(self.rt.nameserver, name), timeout)
            return await asyncio.wait_for(handle.register_broker.remote(reg), timeout)
        except Exception as exc:  # noqa: BLE001 - a NameServer being down is normal
            self.rt.forget_nameserver(name)
            log.debug("register with %s failed: %s", name, exc)
            return None

    async def register_all(self) -> int:
        """Register with every NameServer now; return how many took it."""
        await self.role.ready()
        reg = self.registration()
        answers = await asyncio.gather(
            *(self._register_one(n, reg) for n in self.rt.config.nameservers)
        )
        got = [a for a in answers if a is not None]
        self._taken = self._taken or bool(got)
        self.role.on_registered(got)  # e.g. a deposed master learns of its successor
        return sum(1 for a in got if a.get("accepted", True))

    async def _heartbeat_loop(self) -> None:
        rt = self.rt
        while not rt.closing:
            try:
                await self.register_all()
            except Exception:  # noqa: BLE001
                log.exception("registration round failed")
            beat = rt.config.heartbeat_interval_s
            wait_s = beat if self._taken else min(beat, FIRST_RETRY_S)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(rt.registration_due.wait(), wait_s)
            rt.registration_due.clear()

    def stop(self) -> None:
        """No more heartbeats (a clean shutdown begins)."""
        self.rt.registration_due.set()
        if self._task is not None:
            self._task.cancel()

    async def unregister_all(self) -> None:
        """Leave every NameServer's routes (a clean shutdown): best effort, 2 s each."""
        for name in self.rt.config.nameservers:
            with contextlib.suppress(Exception):
                handle = await self.rt.run(self.rt.nameserver, name)
                await asyncio.wait_for(
                    handle.unregister_broker.remote(
                        self.rt.config.broker_name, self.role.registered_id, self.rt.incarnation
                    ),
                    2.0,
                )
