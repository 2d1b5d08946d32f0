"""The keeper: a cluster's brokers come back where their disks are.

A broker is pinned to the node whose local disk holds its store. Ray restarts a
broker's actor on that node when its process dies (``max_restarts``), but not when the
node itself dies: the actor is then dead for good (its pinned node is gone) and its
name is free. RocketMQ's operators restart a broker on its machine once the machine is
back; the keeper (one actor per cluster, on the head node beside the NameServers) does
that for a broker whose :class:`~actors.config.cluster.BrokerSpec` names its node by a
custom resource, an address or a node name: when the broker's node is dead, its name is
free, and a live node matches the spec again (the machine rebooted into Ray, or a new
node mounted its disk), the keeper starts the broker there from the same config, and
the broker recovers its store (a master that a promotion deposed meanwhile comes back
as a slave and cuts off what the new master never had). A broker pinned by node id, or
to the caller's node, is never moved: no other node can be that one.

The keeper leaves alone a broker whose node lives (Ray or an operator decides) and a
name someone else took (a broker started by hand).

``auto_promote`` (off by default, as RocketMQ's controller mode is an opt-in): when a
master/slave group's master is dead with its node (Ray's verdict, so its lease has
long fenced it) and the NameServers have dropped it, the keeper promotes a slave with
the safety checks :meth:`actors.client.admin.Admin.promote` makes (the slave holding
the most; refused for a slave behind what a SYNC_MASTER acknowledged, or while a slave
does not answer). It also waits while a slave of the group's config is not registered:
after the whole group went down, a slave that came back first may lack what its master
acknowledged with another slave's copy, and promoting it would have the others cut that
off when they return. A refusal is logged once and kept in :meth:`BrokerKeeper.status`
(``refused``). DLedger groups elect their own leader and are not touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.client.admin import Admin
from actors.config.broker import BrokerConfig
from actors.keeper.placement import resolve_node, start_broker_actor
from actors.protocol import rpc as _rpc
from actors.protocol.errors import PromotionRefusedError
from actors.protocol.names import MASTER_ID
from storage.errors import InvalidConfigError, RayMQError

log = logging.getLogger("raymq.actors.keeper")

KEEPER_ACTOR_NAME = "raymq-keeper"


@dataclass
class KeptBroker:
    """One broker the keeper watches: its config, the node its spec names (``None``:
    the node it was started on, for good) and the node it runs on."""

    config: BrokerConfig
    node: str | None
    node_id: str
    restarts: int = 0
    waiting: str | None = None
    """Why it is down and not started again yet (None while it runs)."""


class BrokerKeeper:
    """See the module doc. Started by :func:`start_keeper`; it tends the brokers every
    ``interval_s`` once :meth:`ready` was called."""

    def __init__(
        self,
        namespace: str,
        brokers: Sequence[KeptBroker],
        *,
        max_restarts: int = -1,
        interval_s: float = 2.0,
        auto_promote: bool = False,
    ) -> None:
        if not interval_s > 0:
            raise InvalidConfigError(f"keeper interval_s={interval_s!r}: must be > 0")
        self.namespace = namespace
        self.brokers = {b.config.actor_name: b for b in brokers}
        self.max_restarts = max_restarts
        self.interval_s = interval_s
        self.auto_promote = auto_promote
        self.promotions: list[dict[str, Any]] = []
        # actor name -> (the ping of the broker it started, the node it started it on)
        self._starting: dict[str, tuple[Any, str]] = {}
        self._refused: dict[str, str] = {}  # broker name -> why the last promotion was refused
        self._admin: Admin | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    async def ready(self) -> bool:
        """Starts tending (on the actor's loop) and answers once it has."""
        if self._task is None and not self._stopped:
            self._task = asyncio.get_running_loop().create_task(self._loop())
        return True

    async def _loop(self) -> None:
        while not self._stopped:
            try:
                await asyncio.to_thread(self.tend)
            except Exception:  # noqa: BLE001 - the GCS unreachable a moment: next round
                log.exception("keeper of %s: a round failed", self.namespace)
            await asyncio.sleep(self.interval_s)

    def tend(self) -> list[str]:
        """One round: the brokers started again (by actor name)."""
        nodes = ray.nodes()
        alive = {n["NodeID"] for n in nodes if n.get("Alive")}
        self._settle_starts()
        started = []
        for name, kept in self.brokers.items():
            if name in self._starting:
                continue
            if kept.node_id in alive:
                kept.waiting = None
                continue
            if self._registered(name):
                continue  # its node is dead but Ray has not given up on it, or it runs elsewhere
            if kept.node is None or kept.node == kept.node_id:
                kept.waiting = f"pinned to node {kept.node_id[:12]}, which is gone"
                continue
            try:
                target = resolve_node(kept.node, nodes)
            except InvalidConfigError:
                why = f"no live node has {kept.node!r} (its node is gone)"
                if kept.waiting != why:
                    log.warning("broker %s is down: %s; waiting for one", name, why)
                kept.waiting = why
                continue
            log.warning(
                "broker %s: its node %s is dead; starting it on node %s (%r) from its store",
                name,
                kept.node_id[:12],
                target[:12],
                kept.node,
            )
            handle = start_broker_actor(kept.config, target, self.max_restarts)
            self._starting[name] = (handle.ping.remote(), target)
            kept.node_id, kept.waiting = target, None
            kept.restarts += 1
            started.append(name)
        if self.auto_promote:
            self._promote_orphans(alive)
        return started

    def _settle_starts(self) -> None:
        """The brokers started in earlier rounds that answered, or failed to start."""
        for name, (ref, target) in list(self._starting.items()):
            done, _ = ray.wait([ref], timeout=0)
            if not done:
                continue
            del self._starting[name]
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - e.g. its store still locked: again later
                self.brokers[name].node_id = ""  # unknown: the next round starts it again
                self.brokers[name].waiting = f"starting it failed: {type(exc).__name__}: {exc}"
                log.warning("broker %s did not start on node %s: %s", name, target[:12], exc)
            else:
                log.info("broker %s is back on node %s", name, target[:12])

    def _registered(self, name: str) -> bool:
        try:
            ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            return False
        return True

    def _promote_orphans(self, alive: set[str]) -> None:
        masters = [
            kept
            for kept in self.brokers.values()
            if kept.config.broker_id == MASTER_ID and not kept.config.enable_dledger
        ]
        if not any(m.node_id not in alive for m in masters):
            self._refused.clear()  # every master is up: nothing is waiting
            return
        if self._admin is None:
            self._admin = Admin(self.namespace, list(masters[0].config.nameservers))
        info = self._admin.ns.call("get_cluster_info")
        for master in masters:
            group = master.config.broker_name
            if master.node_id in alive or master.config.actor_name in self._starting:
                self._refused.pop(group, None)
                continue
            members = info["brokers"].get(group, {}).get("members", {})
            if not members or MASTER_ID in members:
                continue  # no slave left, or a master registered (promoted already)
            registered = {m["actor_name"] for m in members.values()}
            away = sorted(
                kept.config.actor_name
                for kept in self.brokers.values()
                if kept.config.broker_name == group
                and kept is not master
                and kept.config.actor_name not in registered
            )
            try:
                if away:
                    raise PromotionRefusedError(
                        f"slave(s) {', '.join(away)} of {group} are not registered: one of "
                        "them may hold messages the master acknowledged that the others "
                        "lack; promoting when every slave is back (or by hand)"
                    )
                result = self._admin.promote(group)
            except (PromotionRefusedError, RayMQError) as exc:
                why = f"{type(exc).__name__}: {exc}"
                if self._refused.get(group) != why:
                    log.warning("keeper: no automatic promotion in %s: %s", group, why)
                self._refused[group] = why
                continue
            self._refused.pop(group, None)
            self.promotions.append({"broker_name": group, **result})
            log.warning(
                "keeper: promoted a slave of %s (its master's node is dead): %s", group, result
            )

    async def status(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "auto_promote": self.auto_promote,
            "brokers": {
                name: {
                    "node": kept.node,
                    "node_id": kept.node_id,
                    "restarts": kept.restarts,
                    "waiting": kept.waiting,
                    "starting": name in self._starting,
                }
                for name, kept in self.brokers.items()
            },
            "promotions": list(self.promotions),
            "refused": dict(self._refused),
        }

    async def shutdown(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


def start_keeper(
    namespace: str,
    brokers: Sequence[KeptBroker],
    node_id: str,
    *,
    max_restarts: int = -1,
    interval_s: float = 2.0,
    auto_promote: bool = False,
) -> Any:
    """The cluster's keeper, started on ``node_id`` (the head's, beside the NameServers);
    it tends from when its process is up (not waited for here)."""
    handle: Any = _rpc.service_actor(
        BrokerKeeper,
        KEEPER_ACTOR_NAME,
        namespace,
        max_restarts=-1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(
        namespace,
        list(brokers),
        max_restarts=max_restarts,
        interval_s=interval_s,
        auto_promote=auto_promote,
    )
    # not waited for: a cluster is up without it, and it tends from its first round
    handle.ready.remote()
    return handle
