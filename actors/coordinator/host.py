"""The coordinator host: one detached actor runs the coordinators of many consumer groups.

A group's coordinator (:class:`~actors.coordinator.coordinator.GroupCoordinator`) is
control plane: no message passes through it, it holds the group's members and queue
owners and runs a few asyncio loops. An actor of its own per group would cost a whole
Ray worker process on the head node for each; instead the namespace's groups share a
host, the detached async actor ``coordinators-<i>`` (``coordinator_actor_name(group)``:
one host, ``coordinators-0``, per namespace) on the head node, ``num_cpus=0``. It holds
a dict group -> coordinator and makes a group's coordinator on the group's first call,
with that call's NameServers and config.

:func:`coordinator_for` finds or creates the host and returns a
:class:`CoordinatorHandle` bound to the host and the group, used as an actor handle
is: ``handle.join.remote(...)``, ``poll``, ``confirm``, ``leave``, ``reset_offsets``,
``status``, ``view``, ``ping`` and ``shutdown`` each return an ObjectRef (awaited in
async code, or given to ``ray.get``).

Groups stay apart in one host: each coordinator runs its own loops, which catch their
own failures, and its own executor for the NameServer calls that block; a call that
fails fails for its group only. If the host dies, every group in it recovers as one
group's coordinator does: Ray reports the actor dead to the members, which give their
queues up (committing) and join again through :func:`coordinator_for`, which creates
the host anew; each new coordinator takes an epoch above every fence its brokers hold.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayActorError

from actors.config.coordinator import CoordinatorConfig
from actors.coordinator.coordinator import (
    HEAD_NODE_RESOURCE,
    GroupCoordinator,
    quiet_blocking_get_warning,
)
from actors.coordinator.state import MemberView
from actors.namesrv.client import named_actors
from actors.protocol import rpc as _rpc
from actors.protocol.names import (
    DEFAULT_NAMESPACE,
    coordinator_actor_name,
    coordinator_host_names,
)
from rebalance import MessageQueue
from storage.errors import InvalidConfigError, RayMQError

log = logging.getLogger("raymq.actors.coordinator.host")

HOST_MAX_CONCURRENCY = 10_000
"""Calls a host serves at once: every member of every group it runs keeps one long poll
outstanding, besides joins, confirms and admin calls."""
LOOKUP_TIMEOUT_S = 30.0

__all__ = [
    "CoordinatorHandle",
    "CoordinatorHost",
    "GroupSpec",
    "coordinated_groups",
    "coordinator_for",
    "find_coordinator",
]


@dataclass(frozen=True)
class GroupSpec:
    """What a group's coordinator is made with, if a call finds none: the NameServers
    (None: discovered in the namespace) and the config (None: the defaults)."""

    nameservers: tuple[str, ...] | None = None
    config: CoordinatorConfig | None = None


def coordinator_for(
    group: str,
    namespace: str = DEFAULT_NAMESPACE,
    *,
    nameservers: Sequence[str] | None = None,
    config: CoordinatorConfig | None = None,
) -> CoordinatorHandle:
    """The handle of ``group``'s coordinator, in its coordinator host
    (``coordinator_actor_name(group)`` in ``namespace``: detached, on the head node),
    created if it does not run yet, and the group's coordinator in it, made now if it is
    not there (by this call, not waiting for it, or by the handle's first call that
    finds none). ``nameservers`` and ``config`` count only when this handle makes it."""
    if not isinstance(group, str) or not group:
        raise InvalidConfigError(f"consumer group={group!r}: must be a non-empty str")
    host = (
        ray.remote(CoordinatorHost)
        .options(
            name=coordinator_actor_name(group),
            namespace=namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            resources={HEAD_NODE_RESOURCE: 0.001},
            max_concurrency=HOST_MAX_CONCURRENCY,
        )
        .remote(namespace)
    )
    handle = CoordinatorHandle(
        host, group, GroupSpec(tuple(nameservers) if nameservers else None, config)
    )
    # made now with this call's settings, not waited for (calls from here queue behind)
    handle.open.remote().future().add_done_callback(lambda done: _opened(group, done))
    return handle


def _opened(group: str, done: Any) -> None:
    """The answer of :func:`coordinator_for`'s ``open``, read (an error left unread is
    printed by Ray as unhandled): a failure shows again in the handle's next call."""
    exc = done.exception()
    if exc is not None:
        log.info("group %s: making its coordinator failed: %s", group, type(exc).__name__)


def find_coordinator(
    group: str, namespace: str = DEFAULT_NAMESPACE, timeout_s: float = LOOKUP_TIMEOUT_S
) -> CoordinatorHandle | None:
    """The handle of ``group``'s coordinator if one runs, else None; it never makes one
    (its calls fail if the group's coordinator is gone)."""
    try:
        host = ray.get_actor(coordinator_actor_name(group), namespace=namespace)
    except ValueError:
        return None
    try:
        if not _rpc.get(host.has_group.remote(group), timeout_s):
            return None
    except RayActorError:  # the host died: its groups have no coordinator until one joins
        return None
    return CoordinatorHandle(host, group, None)


def coordinated_groups(
    namespace: str = DEFAULT_NAMESPACE, timeout_s: float = LOOKUP_TIMEOUT_S
) -> list[str]:
    """The groups whose coordinator runs in ``namespace``, sorted (a host that does not
    answer counts none)."""
    running = set(named_actors(namespace))
    refs: list[Any] = []
    for name in coordinator_host_names():
        if name not in running:
            continue
        try:
            refs.append(ray.get_actor(name, namespace=namespace).groups.remote())
        except ValueError:
            continue
    groups: set[str] = set()
    for ref in refs:
        try:
            groups.update(_rpc.get(ref, timeout_s))
        except Exception as exc:  # noqa: BLE001 - a host down holds no coordinator
            log.warning("a coordinator host did not list its groups: %s", exc)
    return sorted(groups)


class _Call:
    """One method of a group's coordinator: ``.remote(*args, **kwargs)`` calls it on the
    host, naming the group, and returns the ObjectRef."""

    __slots__ = ("_handle", "_method")

    def __init__(self, handle: CoordinatorHandle, method: str) -> None:
        self._handle = handle
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        h = self._handle
        return getattr(h.host, self._method).remote(h.group, h.spec, *args, **kwargs)


class CoordinatorHandle:
    """A consumer group's coordinator as its callers see it: its methods are called as
    an actor's are (``handle.poll.remote(client_id, version, timeout_s)`` returns an
    ObjectRef), and each call goes to the group's coordinator host naming the group.
    ``spec``: what the group's coordinator is made with if a call finds none (None: a
    call then fails). Picklable: it can be passed to actors."""

    __slots__ = ("group", "host", "spec")

    def __init__(self, host: Any, group: str, spec: GroupSpec | None) -> None:
        self.host = host
        self.group = group
        self.spec = spec

    def __repr__(self) -> str:
        return f"CoordinatorHandle(group={self.group!r}, host={self.host!r})"

    def __getstate__(self) -> tuple[Any, str, GroupSpec | None]:
        return self.host, self.group, self.spec

    def __setstate__(self, state: tuple[Any, str, GroupSpec | None]) -> None:
        self.host, self.group, self.spec = state

    @property
    def open(self) -> _Call:
        """Make the group's coordinator if it is not there (answers None)."""
        return _Call(self, "open")

    @property
    def join(self) -> _Call:
        """:meth:`GroupCoordinator.join`."""
        return _Call(self, "join")

    @property
    def poll(self) -> _Call:
        """:meth:`GroupCoordinator.poll`."""
        return _Call(self, "poll")

    @property
    def confirm(self) -> _Call:
        """:meth:`GroupCoordinator.confirm`."""
        return _Call(self, "confirm")

    @property
    def leave(self) -> _Call:
        """:meth:`GroupCoordinator.leave`."""
        return _Call(self, "leave")

    @property
    def reset_offsets(self) -> _Call:
        """:meth:`GroupCoordinator.reset_offsets`."""
        return _Call(self, "reset_offsets")

    @property
    def status(self) -> _Call:
        """:meth:`GroupCoordinator.status`."""
        return _Call(self, "status")

    @property
    def view(self) -> _Call:
        """:meth:`GroupCoordinator.view`."""
        return _Call(self, "view")

    @property
    def ping(self) -> _Call:
        """The group's name, once its coordinator runs."""
        return _Call(self, "ping")

    @property
    def shutdown(self) -> _Call:
        """Stop the group's coordinator and drop it from its host: its members find it
        gone from their view, and the next call makes a new one, which outranks it."""
        return _Call(self, "shutdown_group")


class CoordinatorHost:
    """Ray actor class: the coordinators of the consumer groups that
    ``coordinator_actor_name`` maps to it; use :func:`coordinator_for` to reach one."""

    def __init__(self, namespace: str = DEFAULT_NAMESPACE) -> None:
        quiet_blocking_get_warning()
        self.namespace = namespace
        self._groups: dict[str, GroupCoordinator] = {}
        log.info("coordinator host started in namespace %s", namespace)

    def _group(self, group: str, spec: GroupSpec | None) -> GroupCoordinator:
        """``group``'s coordinator, made from ``spec`` if there is none (on this actor's
        event loop: every method runs there)."""
        coord = self._groups.get(group)
        if coord is not None:
            return coord
        if not isinstance(group, str) or not group:
            raise InvalidConfigError(f"consumer group={group!r}: must be a non-empty str")
        if spec is None:
            raise RayMQError(f"group={group!r} has no coordinator in namespace {self.namespace!r}")
        if not isinstance(spec, GroupSpec):
            raise InvalidConfigError(f"spec={spec!r}: must be a GroupSpec")
        coord = GroupCoordinator(group, self.namespace, spec.nameservers, spec.config)
        self._groups[group] = coord
        return coord

    # ------------------------------------------------------------ a group's calls
    async def open(self, group: str, spec: GroupSpec | None) -> None:
        self._group(group, spec)

    async def join(
        self, group: str, spec: GroupSpec | None, client_id: str, topics: Sequence[str], **kw: Any
    ) -> MemberView:
        return await self._group(group, spec).join(client_id, topics, **kw)

    async def poll(
        self,
        group: str,
        spec: GroupSpec | None,
        client_id: str,
        known_version: int = -1,
        timeout_s: float = 10.0,
    ) -> MemberView:
        return await self._group(group, spec).poll(client_id, known_version, timeout_s)

    async def confirm(
        self, group: str, spec: GroupSpec | None, client_id: str, queues: Sequence[MessageQueue]
    ) -> MemberView:
        return await self._group(group, spec).confirm(client_id, queues)

    async def leave(
        self,
        group: str,
        spec: GroupSpec | None,
        client_id: str,
        released: Sequence[MessageQueue] = (),
    ) -> bool:
        return await self._group(group, spec).leave(client_id, released)

    async def reset_offsets(
        self,
        group: str,
        spec: GroupSpec | None,
        topic: str,
        timestamp_ms: int | None = None,
        offsets: Mapping[MessageQueue, int] | None = None,
    ) -> dict[MessageQueue, int]:
        return await self._group(group, spec).reset_offsets(topic, timestamp_ms, offsets)

    async def status(self, group: str, spec: GroupSpec | None) -> dict[str, Any]:
        return await self._group(group, spec).status()

    async def view(self, group: str, spec: GroupSpec | None, client_id: str) -> MemberView:
        return await self._group(group, spec).view(client_id)

    async def ping(self, group: str, spec: GroupSpec | None) -> str:
        return await self._group(group, spec).ping()

    async def shutdown_group(self, group: str, spec: GroupSpec | None = None) -> bool:
        """Stop ``group``'s coordinator and forget it; False if it had none."""
        coord = self._groups.pop(group, None)
        if coord is None:
            return False
        await coord.shutdown()
        log.info("coordinator of group %s shut down", group)
        return True

    # ------------------------------------------------------------ the host
    async def has_group(self, group: str) -> bool:
        return group in self._groups

    async def groups(self) -> list[str]:
        """The groups whose coordinator runs here, sorted."""
        return sorted(self._groups)

    async def shutdown(self) -> None:
        """Stop every group's coordinator (``Cluster.shutdown`` calls this before it
        kills the host)."""
        groups, self._groups = self._groups, {}
        results = await asyncio.gather(
            *(coord.shutdown() for coord in groups.values()), return_exceptions=True
        )
        for group, result in zip(groups, results):
            if isinstance(result, BaseException):
                log.warning("group %s: coordinator shutdown failed: %s", group, result)
