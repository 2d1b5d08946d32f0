"""The GroupCoordinator: a consumer group's single view, one per group.

RocketMQ's clients rebalance on their own, each from the member list a broker
gives it; while their views differ two consumers can own one queue. Here a
group's coordinator holds the members and the queues, runs the group's
strategy (``rebalance``) and hands queues out so that a queue has one owner at
a time (the rules are in ``actors.coordinator.state``):

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

A coordinator is an object on an asyncio loop, not an actor of its own: the
namespace's coordinator host (``actors.coordinator.host``, the detached actor
``coordinators-0`` on the head node) runs the coordinators of many groups, each
made on its group's first call, and members reach it through the handle
:func:`actors.coordinator.host.coordinator_for` returns. Its loops catch their own
failures, so one group's trouble stays in that group.

It keeps its state in memory. If its host dies, its consumers give their queues up
(committing) and join the coordinator the first of them creates anew; that one
takes an epoch above every fence the brokers hold, so its tokens outrank the
old ones, and fences each queue before assigning it the first time.

Control plane: no message passes through it.
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
from actors.coordinator.fencing import BrokerSide, readable_queues
from actors.coordinator.offset_reset import reset_topic
from actors.coordinator.state import GroupEvent, GroupState, MemberView
from actors.coordinator.strategies import StrategySpec
from actors.namesrv.brokers import BrokerHandles
from actors.namesrv.client import NameServerClient
from actors.protocol.names import DEFAULT_NAMESPACE
from rebalance import MessageQueue
from storage.codec import validate_topic
from storage.errors import InvalidConfigError

log = logging.getLogger("raymq.actors.coordinator.coordinator")

WATCH_RETRY_S = 0.5
MAX_WATCH_RETRY_S = 10.0
MAX_TICK_S = 1.0
# Ray's resource on the head node only. A group's first consumer may create the
# coordinator host, and Ray would place it on that consumer's node, which may leave
# and take the coordinators with it; the head stays as long as the cluster.
HEAD_NODE_RESOURCE = "node:__internal_head__"


def quiet_blocking_get_warning() -> None:
    """In a coordinator host's (or the transaction coordinator's) own process: a group
    coordinator's NameServer calls block in an executor of its own (``_io_call``), never
    on the event loop, but Ray warns of any ``ray.get`` in an async actor's process,
    whatever the thread, so every coordinator printed a warning that is false for it.
    Ray reads its switch at each ``ray.get``; set here (not in a ``runtime_env``, which
    would keep the actor off Ray's prestarted workers)."""
    os.environ["RAY_WARN_BLOCKING_GET_INSIDE_ASYNC"] = "0"


__all__ = ["GroupCoordinator", "GroupEvent", "MemberView", "readable_queues"]


class GroupCoordinator(BrokerSide):
    """One consumer group's coordinator, on the event loop of the coordinator host that
    runs it (:class:`actors.coordinator.host.CoordinatorHost`); members reach it through
    the handle :func:`actors.coordinator_for` returns. Made inside a running event loop."""

    def __init__(
        self,
        group: str,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        config: CoordinatorConfig | None = None,
    ) -> None:
        self.group = group
        self.namespace = namespace
        self.config = config or CoordinatorConfig()
        self._nameservers = list(nameservers) if nameservers else None
        self._loop = asyncio.get_running_loop()  # the host's: made by one of its calls
        self._io = ThreadPoolExecutor(1, thread_name_prefix="coordinator-io")
        self.ns: NameServerClient | None = None
        self.handles: BrokerHandles  # made with ``ns``
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
        self.handles = BrokerHandles(self.ns)
        brokers = await self._io_call(self.handles.masters)
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
        """Stop the background loops and answer the polls held (its host calls this when
        the group's coordinator is shut down, and ``Cluster.shutdown`` before killing the
        host)."""
        self._closing = True
        for task in [*self._tasks, *self._watches.values()]:
            task.cancel()
        for event in self._polls.values():
            event.set()
        self._polls.clear()
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
