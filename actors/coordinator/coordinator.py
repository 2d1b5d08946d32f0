"""The GroupCoordinator actor: one per consumer group, the group's single view.

RocketMQ's clients rebalance on their own, each from the member list a broker
gives it; while their views differ two consumers can own one queue. Here a
detached actor named ``coordinator-<group>`` holds the members and the
queues, runs the group's strategy (``rebalance``) and hands queues out so that
a queue has one owner at a time (the rules are in ``actors.coordinator.state``):

* a queue whose owner must change is first revoked: the owner stops pulling
  it, lets its batch in flight finish, commits its offset and confirms; only
  then does the next owner get it and start from that offset;
* an owner that does not confirm within ``revoke_timeout_s``, dies (Ray
  reports its actor gone), or goes silent past its session timeout is fenced:
  the brokers holding its queues refuse its commits from then on
  (``Broker.fence_offsets``), then its queues are handed on.

An offset reset of the group (``reset_offsets``, what ``Admin.reset_offset`` calls for a
group that has a coordinator) goes through it, as RocketMQ's broker tells every client
(``RESET_CONSUMER_CLIENT_OFFSET``): the brokers write the new offsets and fence the
queues in one step, then every owner is given its queues again under a newer token and
starts from the reset offsets (``actors.coordinator.offset_reset``).

Members talk to it with a handful of calls, never one per message:
``join`` once, ``poll`` held open as a long poll that doubles as the
heartbeat (it returns as soon as the member's view changes), ``confirm`` after
a revoke, ``leave`` at shutdown. It reads the subscribed topics' readable
queues from the NameServers, again on every route change
(``NameServer.wait_route_change``) and every ``route_refresh_s``.

It keeps its state in memory. If it dies, its consumers give their queues up
(committing) and join the coordinator the first of them creates anew; that one
takes an epoch above every fence the brokers hold, so its tokens outrank the
old ones, and fences each queue before assigning it the first time.

A control-plane actor: no message passes through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayActorError

from actors.config.coordinator import CoordinatorConfig
from actors.coordinator.offset_reset import reset_topic
from actors.coordinator.state import GroupEvent, GroupState, MemberView
from actors.coordinator.strategies import StrategySpec
from actors.namesrv.client import NameServerClient
from actors.protocol.fencing import FencingToken
from actors.protocol.names import DEFAULT_NAMESPACE, coordinator_actor_name
from actors.protocol.route import TopicRouteData
from actors.protocol.topic import is_readable
from rebalance import MessageQueue
from storage.codec import validate_topic
from storage.errors import InvalidConfigError, TopicNotFoundError

log = logging.getLogger("raymq.actors.coordinator.coordinator")

ACTOR_MAX_CONCURRENCY = 1000
FENCE_RETRY_S = 0.2
WATCH_RETRY_S = 0.5
MAX_WATCH_RETRY_S = 10.0
MAX_TICK_S = 1.0
# Ray's resource on the head node only. The group's first consumer creates the
# coordinator, and Ray would place it on that consumer's node, which may leave
# and take the coordinator with it; the head stays as long as the cluster.
HEAD_NODE_RESOURCE = "node:__internal_head__"


def quiet_blocking_get_warning() -> None:
    """In a coordinator's own process: its NameServer calls block in an executor of its
    own (``_io_call``), never on the event loop, but Ray warns of any ``ray.get`` in an
    async actor's process, whatever the thread, so every coordinator printed a warning
    that is false for it. Ray reads its switch at each ``ray.get``; set here (not in a
    ``runtime_env``, which would keep the actor off Ray's prestarted workers)."""
    os.environ["RAY_WARN_BLOCKING_GET_INSIDE_ASYNC"] = "0"


__all__ = ["GroupCoordinator", "GroupEvent", "MemberView", "coordinator_for", "readable_queues"]


def readable_queues(route: TopicRouteData) -> list[MessageQueue]:
    """The queues of ``route`` a consumer can read now: readable perm, live master."""
    live = {bd.broker_name for bd in route.broker_datas if bd.master_actor_name()}
    return sorted(
        MessageQueue(route.topic, qd.broker_name, q)
        for qd in route.queue_datas
        if is_readable(qd.perm) and qd.broker_name in live
        for q in range(qd.read_queue_nums)
    )


def coordinator_for(
    group: str,
    namespace: str = DEFAULT_NAMESPACE,
    *,
    nameservers: Sequence[str] | None = None,
    config: CoordinatorConfig | None = None,
) -> Any:
    """The handle of ``group``'s coordinator, created (detached, ``coordinator-<group>``
    in ``namespace``, on the head node) if it does not run yet; ``config`` counts only
    when this call creates it."""
    if not isinstance(group, str) or not group:
        raise InvalidConfigError(f"consumer group={group!r}: must be a non-empty str")
    return (
        ray.remote(GroupCoordinator)
        .options(
            name=coordinator_actor_name(group),
            namespace=namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            resources={HEAD_NODE_RESOURCE: 0.001},
            max_concurrency=ACTOR_MAX_CONCURRENCY,
        )
        .remote(group, namespace, list(nameservers) if nameservers else None, config)
    )


class GroupCoordinator:
    """Ray actor class; use :func:`coordinator_for` to find or create one."""

    def __init__(
        self,
        group: str,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        config: CoordinatorConfig | None = None,
    ) -> None:
        quiet_blocking_get_warning()
        self.group = group
        self.namespace = namespace
        self.config = config or CoordinatorConfig()
        self._nameservers = list(nameservers) if nameservers else None
        self._loop = asyncio.get_event_loop()  # an async actor runs __init__ in its loop
        self._io = ThreadPoolExecutor(1, thread_name_prefix="coordinator-io")
        self.ns: NameServerClient | None = None
        self.state = GroupState(
            group, time.time_ns() // 1_000_000, self.config.revoke_timeout_s, self.config.log_size
        )
        self._ready: asyncio.Future[None] | None = None
        self._wake = asyncio.Event()
        self._polls: dict[str, asyncio.Event] = {}
        self._watches: dict[str, asyncio.Task[None]] = {}
        # members whose actor Ray reported dead or whose consumer closed: a call they
        # sent before that (a join in flight) must not bring them back: client id -> when,
        # forgotten after config.forget_gone_s
        self._gone: dict[str, float] = {}
        self._brokers: dict[str, Any] = {}  # broker name -> master handle, from the routes
        self._incarnations: dict[str, str] = {}  # broker name -> incarnation we fenced on
        self._fence_task: asyncio.Task[None] | None = None
        self._closing = False
        self._tasks = [
            self._loop.create_task(self._tick_loop()),
            self._loop.create_task(self._route_loop()),
        ]
        log.info("coordinator of group %s started in namespace %s", group, namespace)

    # ------------------------------------------------------------ startup
    async def _io_call(self, fn: Any, *args: Any) -> Any:
        return await self._loop.run_in_executor(self._io, fn, *args)

    async def _ensure_ready(self) -> None:
        """Connect to the NameServers and start the epoch above any fence the group's
        brokers hold (a coordinator restarted elsewhere must out-rank its predecessor)."""
        if self._ready is None:
            self._ready = self._loop.create_future()
            try:
                await self._start()
                self._ready.set_result(None)
            except BaseException as exc:
                self._ready.set_exception(exc)
                self._ready = None
                raise
        await asyncio.shield(self._ready)

    async def _start(self) -> None:
        from actors.namesrv.client import discover_nameservers

        names = self._nameservers or await self._io_call(discover_nameservers, self.namespace)
        self.ns = NameServerClient(names, self.namespace, self.config.route_refresh_s)
        brokers = await self._io_call(self.ns.master_brokers)
        self._brokers.update(brokers)
        highest = 0
        for name, handle in brokers.items():
            try:
                fences = await asyncio.wait_for(
                    handle.offset_fences.remote(self.group), self.config.fence_timeout_s
                )
            except Exception as exc:  # noqa: BLE001 - a broker down holds no fence we need
                log.debug("group %s: fences of %s unknown: %s", self.group, name, exc)
                continue
            highest = max([highest, *(epoch for epoch, _ in fences.values())])
        if highest >= self.state.epoch:
            self.state.epoch = highest + 1
        log.info("group %s: coordinator epoch %d", self.group, self.state.epoch)

    # ------------------------------------------------------------ members' calls
    async def join(
        self,
        client_id: str,
        topics: Sequence[str],
        *,
        session_timeout_s: float = 30.0,
        strategy: str = "averagely",
        strategy_options: dict[str, Any] | None = None,
        machine_room: str | None = None,
        actor_handle: Any = None,
    ) -> MemberView:
        """Join (or re-join) the group consuming ``topics``; returns the member's view.
        The first member sets the group's ``strategy``; a member naming another is
        refused. ``actor_handle``: the actor hosting the member, which must have a
        ``wait_closed()`` method that returns when the member shuts down; the member
        is then dropped the moment Ray reports that actor dead."""
        if not isinstance(client_id, str) or not client_id:
            raise InvalidConfigError(f"client_id={client_id!r}: must be a non-empty str")
        if client_id in self._gone:
            raise InvalidConfigError(
                f"{client_id} closed or its actor died: it cannot rejoin (a new consumer "
                "has a new client id)"
            )
        if isinstance(topics, str) or not topics:
            raise InvalidConfigError(f"topics={topics!r}: must be a non-empty list of topics")
        topics = [validate_topic(t) for t in topics]
        if not isinstance(session_timeout_s, (int, float)) or session_timeout_s <= 0:
            raise InvalidConfigError(f"session_timeout_s={session_timeout_s!r}: must be > 0")
        if actor_handle is not None and not hasattr(actor_handle, "wait_closed"):
            raise InvalidConfigError(
                f"actor_handle of {client_id}: the actor has no wait_closed() method to watch"
            )
        spec = StrategySpec(strategy, dict(strategy_options or {}))
        self.state.check_join(spec, machine_room, client_id)
        await self._ensure_ready()
        new_topics = set(topics) - set(self.state.queues)
        if new_topics:
            await self._refresh_routes(new_topics)
        changed = self.state.join(
            client_id,
            topics,
            spec,
            room=machine_room,
            session_timeout_s=float(session_timeout_s),
            watched=actor_handle is not None,
        )
        if actor_handle is not None and client_id not in self._watches:
            self._watches[client_id] = self._loop.create_task(self._watch(client_id, actor_handle))
        if changed:
            log.info("group %s: %s joined for %s", self.group, client_id, sorted(topics))
            self.state.rebalance()
        self._after()
        task = self._fence_task
        if task is not None and not task.done():  # the first owners: fenced, then assigned
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(task), self.config.fence_timeout_s)
        return self.state.view(client_id)

    async def poll(
        self, client_id: str, known_version: int = -1, timeout_s: float = 10.0
    ) -> MemberView:
        """The member's view as soon as its version differs from ``known_version``, or
        after ``timeout_s`` (at most half its session timeout). Counts as a heartbeat;
        a member keeps one poll outstanding."""
        if not self.state.heartbeat(client_id):
            return self.state.view(client_id)
        member = self.state.members[client_id]
        if member.version == known_version:
            wait_s = min(max(float(timeout_s), 0.0), member.session_timeout_s / 2)
            event = self._polls.setdefault(client_id, asyncio.Event())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), wait_s)
        return self.state.view(client_id)

    async def confirm(self, client_id: str, queues: Sequence[MessageQueue]) -> MemberView:
        """The member stopped consuming ``queues`` and committed their offsets."""
        if self.state.confirm(client_id, queues):
            self.state.reconcile()
        self._after()
        return self.state.view(client_id)

    async def leave(self, client_id: str, released: Sequence[MessageQueue] = ()) -> bool:
        """Leave the group; ``released`` are the queues the member committed and stopped
        (handed on at once), the rest of its queues are fenced first."""
        removed = self.state.remove(client_id, "leave", released)
        if removed:
            log.info("group %s: %s left", self.group, client_id)
            self._unwatch(client_id)
            self.state.rebalance()
        self._after()
        return removed

    # ------------------------------------------------------------ offset resets
    async def reset_offsets(
        self,
        topic: str,
        timestamp_ms: int | None = None,
        offsets: Mapping[MessageQueue, int] | None = None,
    ) -> dict[MessageQueue, int]:
        """Move the group on ``topic`` to the first message stored at or after
        ``timestamp_ms``, or to explicit ``offsets``, on every broker holding the topic,
        and restart its owners from there (see the module's docstring). Returns the
        offsets written."""
        validate_topic(topic)
        if (timestamp_ms is None) == (offsets is None):
            raise InvalidConfigError("reset_offsets: give timestamp_ms or offsets (one of them)")
        await self._ensure_ready()
        brokers = await self._io_call(self._topic_brokers, topic)
        try:
            return await reset_topic(
                self.state, brokers, topic, timestamp_ms, offsets, self.config.fence_timeout_s
            )
        finally:
            self._after()  # the owners told to start again

    def _topic_brokers(self, topic: str) -> dict[str, Any]:
        """The live masters holding ``topic``'s queues, by broker name."""
        assert self.ns is not None
        route = self.ns.require_route(topic, refresh=True)
        names = {qd.broker_name for qd in route.queue_datas}
        return {
            bd.broker_name: self.ns.broker(route, bd.broker_name)
            for bd in route.broker_datas
            if bd.broker_name in names and bd.master_actor_name()
        }

    # ------------------------------------------------------------ introspection
    async def status(self) -> dict[str, Any]:
        """Members, generation, strategy, target and current assignment, pending revokes
        and fences, the generation log (oldest first) and the Ray node it runs on."""
        out = self.state.status()
        out["namespace"] = self.namespace
        out["node_id"] = ray.get_runtime_context().get_node_id()
        out["config"] = self.config
        out["gone_tracked"] = len(self._gone)
        return out

    async def view(self, client_id: str) -> MemberView:
        return self.state.view(client_id)

    async def ping(self) -> str:
        return self.group

    async def shutdown(self) -> None:
        """Stop the background loops (``Cluster.shutdown`` calls this before killing)."""
        self._closing = True
        for task in [*self._tasks, *self._watches.values()]:
            task.cancel()
        self._io.shutdown(wait=False)

    # ------------------------------------------------------------ after every change
    def _after(self) -> None:
        """Wake the polls of members whose view changed; start fencing if due."""
        for cid in self.state.take_changed():
            event = self._polls.pop(cid, None)
            if event is not None:
                event.set()
        if self.state.to_fence and (self._fence_task is None or self._fence_task.done()):
            self._fence_task = self._loop.create_task(self._fence_loop())
        self._wake.set()

    def _drop(self, client_id: str, event: str) -> None:
        if self.state.remove(client_id, event):
            log.warning("group %s: %s dropped (%s)", self.group, client_id, event)
            self._unwatch(client_id)
            self.state.rebalance()
            self._after()

    def _unwatch(self, client_id: str) -> None:
        task = self._watches.pop(client_id, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _watch(self, client_id: str, handle: Any) -> None:
        """Keep one ``wait_closed`` call pending on the member's actor: it returns when
        the consumer shuts down, and Ray fails it with ActorDiedError when the actor
        dies. An actor Ray cannot reach for now is not dead: watched again, backing off
        (each attempt may leave a call waiting on the actor)."""
        backoff = WATCH_RETRY_S
        while True:
            try:
                await handle.wait_closed.remote()
                reason = "its consumer closed"
                break
            except asyncio.CancelledError:
                raise
            except ActorDiedError as exc:
                reason = f"Ray reports its actor dead ({type(exc).__name__})"
                break
            except RayActorError as exc:  # unavailable for now; the session timeout holds
                log.info(
                    "group %s: %s unreachable (%s); watching it again",
                    self.group,
                    client_id,
                    type(exc).__name__,
                )
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, MAX_WATCH_RETRY_S)
            except Exception as exc:  # noqa: BLE001 - wait_closed itself failed
                log.error(
                    "group %s: watching %s failed (%s: %s); its session timeout still applies",
                    self.group,
                    client_id,
                    type(exc).__name__,
                    exc,
                )
                return
        self._gone[client_id] = time.monotonic()
        if self._watches.get(client_id) is asyncio.current_task():
            del self._watches[client_id]
            log.warning("group %s: %s is gone: %s", self.group, client_id, reason)
            self._drop(client_id, "dead")

    # ------------------------------------------------------------ timers
    async def _tick_loop(self) -> None:
        """Sessions and revokes that run out."""
        while not self._closing:
            try:
                for cid in self.state.expired():
                    self._drop(cid, "expired")
                self._forget_gone()
                self.state.reconcile()
                self._after()
            except Exception:  # noqa: BLE001 - the loop must survive a bad round
                log.exception("group %s: coordinator tick failed", self.group)
            self._wake.clear()
            delay = min(max(self.state.next_deadline() - time.monotonic(), 0.005), MAX_TICK_S)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    def _forget_gone(self) -> None:
        """Drop the oldest departed members once ``forget_gone_s`` has passed (the dict
        keeps insertion order, which is the order they left in)."""
        horizon = time.monotonic() - self.config.forget_gone_s
        while self._gone:
            cid, at = next(iter(self._gone.items()))
            if at > horizon:
                return
            del self._gone[cid]

    # ------------------------------------------------------------ fencing
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

    # ------------------------------------------------------------ routes
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
                        brokers[bd.broker_name] = self.ns.broker(route, bd.broker_name)
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
