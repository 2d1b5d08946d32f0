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

``auto_promote`` (off by default, as RocketMQ's controller mode is an opt-in): the keeper
watches each master/slave group's *current* master, as the NameServers register it (id 0:
its actor name and node; at first the configured master, then a promoted slave), and the
slaves registered beside it. When that master is dead with its node (Ray's verdict, so
its lease has long fenced it) and the NameServers have dropped it, the keeper promotes a
slave with the safety checks :meth:`actors.client.admin.Admin.promote` makes (the slave
holding the most; refused for a slave behind what a SYNC_MASTER acknowledged, or while a
slave does not answer). So a group whose promoted slave dies in turn gets a master again,
also when its configured master is back as a slave. It also waits while a slave that may
hold what the dead master acknowledged is not registered: every slave seen beside it
since the keeper saw it take over, or, for a master the keeper did not see take over
(its first rounds), every other member of the group's config: after the whole group went
down, a slave that came back first may lack what its master acknowledged with another
slave's copy, and promoting it would have the others cut that off when they return. A
member already gone when the master took over holds nothing it acknowledged. A refusal
is logged once and kept in :meth:`BrokerKeeper.status` (``refused``; ``masters`` is each
group's master as last registered). Each round asks the NameServers once, each call
bounded (``NS_CALL_TIMEOUT_S``, ``Admin.promote``'s timeouts): a NameServer that does
not answer costs a round. DLedger groups elect their own leader and are not touched.
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
from storage.errors import BrokerUnavailableError, InvalidConfigError, RayMQError

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

    @property
    def movable(self) -> bool:
        """Its spec names its node by something another node may have (a resource, an
        address, a name): the keeper may start it elsewhere once its node is dead."""
        return self.node is not None and self.node != self.node_id


@dataclass
class Reign:
    """A group's master as the NameServers last registered it, and the slaves registered
    beside it since the keeper first saw it master the group."""

    actor_name: str
    node_id: str
    slaves: set[str]
    watched: bool
    """The keeper saw it take over (so ``slaves`` holds every slave that may have its
    acknowledged messages); False for the master it found at its first rounds."""


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
        self._reigns: dict[str, Reign] = {}  # broker name -> its master as last registered
        self._ns_error: str | None = None  # why the NameServers did not answer last round
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
            if not kept.movable:
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

    def _groups(self) -> dict[str, list[KeptBroker]]:
        """The master/slave groups the keeper watches (DLedger groups elect their own)."""
        groups: dict[str, list[KeptBroker]] = {}
        for kept in self.brokers.values():
            if not kept.config.enable_dledger:
                groups.setdefault(kept.config.broker_name, []).append(kept)
        return groups

    def _cluster_info(self, nameservers: Sequence[str]) -> dict[str, Any] | None:
        """The NameServers' cluster info, or None when none answered (each call is
        bounded: the round is lost, not the keeper)."""
        if self._admin is None:
            self._admin = Admin(self.namespace, list(nameservers))
        try:
            info: dict[str, Any] = self._admin.ns.call("get_cluster_info")
        except Exception as exc:  # noqa: BLE001 - a NameServer down or slow: next round
            why = f"{type(exc).__name__}: {exc}"
            if self._ns_error != why:
                log.warning("keeper of %s: the NameServers did not answer: %s", self.namespace, why)
            self._ns_error = why
            return None
        self._ns_error = None
        return info

    def _watch(self, group: str, members: dict[int, Any]) -> Reign | None:
        """Remember the group's registered master (and the slaves beside it); the reign
        to judge when none is registered: the last one seen, else the configured master
        the keeper never saw register (its first rounds)."""
        registered = {m["actor_name"] for m in members.values()}
        reign = self._reigns.get(group)
        master = members.get(MASTER_ID)
        if master is not None:
            slaves = registered - {master["actor_name"]}
            if reign is not None and reign.actor_name == master["actor_name"]:
                reign.node_id = master["node_id"]  # the same master, maybe started elsewhere
                reign.slaves |= slaves
            else:
                if reign is not None:
                    log.info(
                        "keeper: %s now masters %s (was %s)",
                        master["actor_name"],
                        group,
                        reign.actor_name,
                    )
                self._reigns[group] = Reign(
                    master["actor_name"], master["node_id"], slaves, watched=reign is not None
                )
            return None
        if reign is not None:
            return reign
        configured = [
            k
            for k in self.brokers.values()
            if k.config.broker_name == group and k.config.broker_id == MASTER_ID
        ]
        if not configured:
            return None
        # kept: a slave promoted from here on is a master the keeper saw take over
        reign = Reign(configured[0].config.actor_name, configured[0].node_id, set(), False)
        self._reigns[group] = reign
        return reign

    def _promote_orphans(self, alive: set[str]) -> None:
        groups = self._groups()
        if not groups:
            return
        first = next(iter(groups.values()))[0]
        info = self._cluster_info(first.config.nameservers)
        if info is None:
            return
        for group, kept in groups.items():
            members = info["brokers"].get(group, {}).get("members", {})
            reign = self._watch(group, members)
            if reign is None:
                self._refused.pop(group, None)  # a master is registered (or none to watch)
                continue
            mine = self.brokers.get(reign.actor_name)  # a master the keeper starts
            if (
                reign.node_id in alive
                or reign.actor_name in self._starting
                or (mine is not None and mine.node_id in alive)
            ):
                self._refused.pop(group, None)  # its node lives: Ray or the keeper decides
                continue
            if not members:
                continue  # no slave left
            registered = {m["actor_name"] for m in members.values()}
            needed = (
                reign.slaves
                if reign.watched
                else {k.config.actor_name for k in kept} | reign.slaves
            )
            away = sorted(needed - registered - {reign.actor_name})
            try:
                if away:
                    raise PromotionRefusedError(
                        f"slave(s) {', '.join(away)} of {group} are not registered: one of "
                        "them may hold messages the master acknowledged that the others "
                        "lack; promoting when every slave is back (or by hand)"
                    )
                result = self._admin_promote(group)
            except (PromotionRefusedError, RayMQError) as exc:
                why = f"{type(exc).__name__}: {exc}"
                if self._refused.get(group) != why:
                    log.warning("keeper: no automatic promotion in %s: %s", group, why)
                self._refused[group] = why
                continue
            self._refused.pop(group, None)
            self.promotions.append({"broker_name": group, **result})
            # the group's master from now on, even if it dies before the next round
            name = str(result.get("broker", ""))
            node = next((m["node_id"] for m in members.values() if m["actor_name"] == name), "")
            self._reigns[group] = Reign(name, node, registered - {name}, watched=True)
            log.warning(
                "keeper: promoted a slave of %s (its master %s died with its node %s): %s",
                group,
                reign.actor_name,
                reign.node_id[:12],
                result,
            )

    def _admin_promote(self, group: str) -> dict[str, Any]:
        """``Admin.promote``; Ray failing the calls (a timeout, an actor gone) is a
        refusal for this round."""
        assert self._admin is not None
        try:
            return self._admin.promote(group)
        except (PromotionRefusedError, RayMQError):
            raise
        except Exception as exc:
            if not _rpc.is_retriable(exc):
                raise
            raise BrokerUnavailableError(
                f"promoting a slave of {group} failed on the way: {type(exc).__name__}"
            ) from exc

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
            "masters": {
                group: {"actor_name": r.actor_name, "node_id": r.node_id}
                for group, r in self._reigns.items()
            },
            "nameservers_error": self._ns_error,
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
