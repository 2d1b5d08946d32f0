"""One consumer group's membership and queue ownership, as its coordinator holds them.

Pure Python, no Ray: :class:`actors.coordinator.coordinator.GroupCoordinator` wraps one
:class:`GroupState` and does the I/O (routes, fencing calls on brokers, the
members' long polls). Every change of members, subscriptions or queues is a
new ``generation``; the group's strategy then gives a ``target`` owner to
every queue, and ownership moves toward it one safe step at a time.

Invariants:

* ``owners`` gives a queue at most one owner. A queue is assigned only while it
  has none: its last owner confirmed the revoke (it stopped, finished or
  abandoned its batch, committed), left after committing it, or was fenced on
  the queue's broker (``fence_done``). The log records exactly these steps, so
  replaying it shows one owner per queue at every instant.
* an owner is never told to revoke twice and never loses a queue silently: it
  is either told (``revoking``) and confirms, or it is fenced after
  ``revoke_timeout_s`` (or at once when it died or went silent), and only then
  is the queue handed on.
* a queue's fencing tokens (``(epoch, generation)`` of its assignments) only
  grow, and a fence is set to the token of the assignment that follows it, so
  a fenced owner's commits are refused by the broker and the new owner's pass.
* a queue this coordinator never assigned is fenced before its first
  assignment: after a coordinator restart its old owner is unknown.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from actors.protocol.fencing import FencingToken
from rebalance import STRATEGY_NAMES, AllocateStrategy, MessageQueue, assign, get_strategy
from storage.errors import InvalidConfigError

log = logging.getLogger("raymq.actors.coordinator.coordinator")

MACHINE_ROOM_STRATEGIES = ("machine_room", "machine_room_nearby")
DEFAULT_ROOM = "DEFAULT"


class GroupEvent(NamedTuple):
    """One line of the generation log. ``event`` is one of join, leave, dead (Ray
    reported the member's actor gone or closed), expired (silent past its session
    timeout), routes (the queues changed), revoke, confirm, fence, assign."""

    time: float  # time.monotonic() of the coordinator's host
    generation: int
    event: str
    queue: MessageQueue | None
    from_id: str | None
    to_id: str | None


@dataclass(frozen=True)
class MemberView:
    """What one member is to do: consume ``owned``, give up ``revoke`` (stop, let the
    batch in flight finish, commit with the token, then ``confirm``). Any queue it
    holds that is in neither was fenced: drop it without committing. ``member``
    False: the coordinator does not know this client (join again)."""

    client_id: str
    member: bool
    version: int
    generation: int
    owned: dict[MessageQueue, FencingToken] = field(default_factory=dict)
    revoke: dict[MessageQueue, FencingToken] = field(default_factory=dict)
    revoke_timeout_s: float = 10.0


@dataclass
class Member:
    client_id: str
    topics: frozenset[str]
    room: str | None
    session_timeout_s: float
    last_seen: float
    watched: bool = False
    version: int = 0


@dataclass(frozen=True)
class StrategySpec:
    """A strategy by name and options, as members give it at join."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def same_as(self, other: StrategySpec) -> bool:
        return self.name == other.name and _comparable(self.options) == _comparable(other.options)

    def describe(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in sorted(_comparable(self.options).items()))
        return f"{self.name!r}" + (f" ({opts})" if opts else "")


def _comparable(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options with callables (a room resolver, an inner strategy) named, not compared
    by identity: the same function pickled to two members is two objects."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if callable(value) and not isinstance(value, type):
            value = (
                f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', repr(value))}"
            )
        elif isinstance(value, (set, frozenset, list, tuple)):
            value = tuple(sorted(map(str, value)))
        out[key] = value
    return out


def broker_room(mq: MessageQueue) -> str:
    """A queue's machine room from its broker name, ``<room>@<broker>`` as RocketMQ's
    machine-room strategies read it (``DEFAULT`` without a room)."""
    room, sep, _ = mq.broker_name.partition("@")
    return room if sep and room else DEFAULT_ROOM


def build_strategy(spec: StrategySpec, rooms: Mapping[str, str | None]) -> AllocateStrategy:
    """The strategy object for ``spec``, with members' ``rooms`` filled in where the
    strategy needs them. Raises InvalidConfigError for a bad name or options."""
    if spec.name not in STRATEGY_NAMES:
        raise InvalidConfigError(
            f"rebalance strategy={spec.name!r}: unknown; one of {', '.join(STRATEGY_NAMES)}"
        )
    if spec.name == "config":
        raise InvalidConfigError(
            "rebalance strategy='config' gives every member the same queues: a coordinated "
            "group needs one owner per queue (use it with coordinated=False)"
        )
    options = dict(spec.options)
    if spec.name in MACHINE_ROOM_STRATEGIES:
        missing = sorted(cid for cid, room in rooms.items() if not room)
        if missing:
            raise InvalidConfigError(
                f"rebalance strategy={spec.name!r} needs each member's machine_room; "
                f"none given by {missing[:5]}"
            )
    if spec.name == "machine_room":
        options.setdefault("consumer_idcs", sorted({r for r in rooms.values() if r}))
    elif spec.name == "machine_room_nearby":
        options.setdefault("inner", "averagely")
        options.setdefault("broker_room", broker_room)
        member_rooms = dict(rooms)
        options["consumer_room"] = lambda cid: member_rooms.get(cid) or DEFAULT_ROOM
    try:
        return get_strategy(spec.name, **options)
    except (TypeError, ValueError) as exc:
        raise InvalidConfigError(f"rebalance strategy={spec.name!r}: {exc}") from None


class GroupState:
    """Members, the target assignment, owners, revokes in progress, fences to set."""

    def __init__(
        self,
        group: str,
        epoch: int,
        revoke_timeout_s: float,
        log_size: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group = group
        self.epoch = epoch
        self.revoke_timeout_s = revoke_timeout_s
        self.clock = clock
        self.generation = 0
        self.strategy: StrategySpec | None = None
        self.members: dict[str, Member] = {}
        self.queues: dict[str, tuple[MessageQueue, ...]] = {}
        self.target: dict[MessageQueue, str] = {}
        self.owners: dict[MessageQueue, tuple[str, FencingToken]] = {}
        self.revoking: dict[MessageQueue, float] = {}  # queue -> deadline of its confirm
        self.to_fence: dict[MessageQueue, str | None] = {}  # queue -> the owner fenced off
        self.fences: dict[MessageQueue, FencingToken] = {}  # every fence set, to set again
        self.assigned_once: set[MessageQueue] = set()
        self.changed: set[str] = set()  # members whose view changed since take_changed()
        self.log: deque[GroupEvent] = deque(maxlen=log_size)

    # ------------------------------------------------------------ bookkeeping
    def token(self) -> FencingToken:
        return (self.epoch, self.generation)

    def _event(
        self,
        event: str,
        queue: MessageQueue | None = None,
        from_id: str | None = None,
        to_id: str | None = None,
    ) -> None:
        self.log.append(GroupEvent(self.clock(), self.generation, event, queue, from_id, to_id))

    def _touch(self, cid: str | None) -> None:
        m = self.members.get(cid) if cid is not None else None
        if m is not None:
            m.version += 1
        if cid is not None:
            self.changed.add(cid)

    def take_changed(self) -> set[str]:
        changed, self.changed = self.changed, set()
        return changed

    def topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.topics}

    # ------------------------------------------------------------ membership
    def check_join(self, spec: StrategySpec, room: str | None) -> None:
        """Raise InvalidConfigError unless a member with ``spec`` and ``room`` may join."""
        if self.strategy is not None and self.members and not self.strategy.same_as(spec):
            raise InvalidConfigError(
                f"group {self.group!r} rebalances with strategy {self.strategy.describe()}; "
                f"a member cannot join with {spec.describe()} (all members must agree)"
            )
        rooms = {cid: m.room for cid, m in self.members.items()}
        rooms["<joining>"] = room
        build_strategy(spec, rooms)

    def join(
        self,
        cid: str,
        topics: Iterable[str],
        spec: StrategySpec,
        *,
        room: str | None = None,
        session_timeout_s: float = 30.0,
        watched: bool = False,
    ) -> bool:
        """Add or update a member; True when the group changed (a new generation is due)."""
        self.check_join(spec, room)
        now = self.clock()
        self.strategy = self.strategy if self.members else spec
        topics = frozenset(topics)
        old = self.members.get(cid)
        if old is not None:
            old.last_seen = now
            old.session_timeout_s = session_timeout_s
            old.watched = old.watched or watched
            if old.topics == topics and old.room == room:
                return False
            old.topics, old.room = topics, room
            self._event("join", from_id=None, to_id=cid)
            return True
        self.members[cid] = Member(cid, topics, room, session_timeout_s, now, watched)
        self._event("join", to_id=cid)
        return True

    def heartbeat(self, cid: str) -> bool:
        m = self.members.get(cid)
        if m is None:
            return False
        m.last_seen = self.clock()
        return True

    def remove(self, cid: str, event: str, released: Iterable[MessageQueue] = ()) -> bool:
        """Take a member out (``event``: leave, dead, expired). Queues it ``released``
        (committed) are free at once; its other queues are fenced before they move."""
        if self.members.pop(cid, None) is None:
            return False
        self._event(event, from_id=cid)
        self.changed.add(cid)
        released = set(released)
        for q, (owner, _) in list(self.owners.items()):
            if owner != cid:
                continue
            self.revoking.pop(q, None)
            if q in released and q not in self.to_fence:
                del self.owners[q]
                self._event("confirm", q, cid)
            else:
                self.to_fence[q] = cid
        if not self.members:
            self.strategy = None
        return True

    def expired(self) -> list[str]:
        now = self.clock()
        return [c for c, m in self.members.items() if now - m.last_seen > m.session_timeout_s]

    def confirm(self, cid: str, queues: Iterable[MessageQueue]) -> int:
        """``cid`` stopped consuming ``queues`` and committed them: they are free."""
        self.heartbeat(cid)
        freed = 0
        for q in queues:
            owner = self.owners.get(q)
            if owner is None or owner[0] != cid or q in self.to_fence:
                continue  # already fenced or never ours: nothing to confirm
            del self.owners[q]
            self.revoking.pop(q, None)
            self._event("confirm", q, cid)
            self._touch(cid)
            freed += 1
        return freed

    # ------------------------------------------------------------ queues and the target
    def set_queues(self, queues: Mapping[str, Sequence[MessageQueue]]) -> bool:
        """The readable queues of some topics; True when any topic's set changed."""
        changed = False
        for topic, qs in queues.items():
            new = tuple(sorted(set(qs)))
            if self.queues.get(topic, ()) != new:
                self.queues[topic] = new
                changed = True
        return changed

    def _compute_target(self) -> dict[MessageQueue, str]:
        if not self.members or self.strategy is None:
            return {}
        strategy = build_strategy(self.strategy, {cid: m.room for cid, m in self.members.items()})
        target: dict[MessageQueue, str] = {}
        for topic in sorted(self.topics()):
            queues = self.queues.get(topic, ())
            cids = [cid for cid, m in self.members.items() if topic in m.topics]
            if not queues or not cids:
                continue
            for cid, share in assign(strategy, self.group, queues, cids).items():
                for q in share:
                    if target.setdefault(q, cid) != cid:
                        log.error("group %s: strategy gave %s to two members", self.group, q)
        return target

    def rebalance(self, reason: str = "") -> None:
        """A new generation: recompute the target and move toward it."""
        self.generation += 1
        if reason:
            self._event(reason)
        self.target = self._compute_target()
        log.info(
            "group %s: generation %d, %d member(s), %d queue(s) targeted",
            self.group,
            self.generation,
            len(self.members),
            len(self.target),
        )
        self.reconcile()

    def reconcile(self) -> None:
        """Revoke what must move, fence who overstayed, assign what is free."""
        now = self.clock()
        for q, (owner, _) in self.owners.items():
            if q in self.to_fence or q in self.revoking:
                continue
            if owner not in self.members:
                self.to_fence[q] = owner
            elif self.target.get(q) != owner:
                self.revoking[q] = now + self.revoke_timeout_s
                self._event("revoke", q, owner, self.target.get(q))
                self._touch(owner)
        for q, deadline in list(self.revoking.items()):
            if now >= deadline:
                del self.revoking[q]
                owner = self.owners[q][0]
                log.warning(
                    "group %s: %s did not give %s up within %.1fs: fencing it",
                    self.group,
                    owner,
                    q,
                    self.revoke_timeout_s,
                )
                self.to_fence[q] = owner
                self._touch(owner)
        for q, cid in self.target.items():
            if q in self.owners or q in self.to_fence:
                continue
            if q not in self.assigned_once:
                self.to_fence[q] = None  # an owner from before this coordinator may live on
                continue
            self.owners[q] = (cid, self.token())
            self._event("assign", q, None, cid)
            self._touch(cid)

    # ------------------------------------------------------------ fencing
    def pending_fences(self) -> dict[MessageQueue, FencingToken]:
        """Fences to set now: the next assignment of each queue gets at least this token."""
        return {q: self.token() for q in self.to_fence}

    def fence_done(self, fenced: Mapping[MessageQueue, FencingToken | None]) -> None:
        """The brokers refuse the old owners of ``fenced`` now (``None``: the broker is
        gone, nothing to fence): hand the queues on."""
        for q, tok in fenced.items():
            if q not in self.to_fence:
                continue
            old = self.to_fence.pop(q)
            owner = self.owners.get(q)
            if owner is not None and owner[0] == old:
                del self.owners[q]
            if tok is not None:
                self.fences[q] = max(tok, self.fences.get(q, tok))
            self.assigned_once.add(q)
            if old is not None:
                self._event("fence", q, old)
                self._touch(old)
        self.reconcile()

    # ------------------------------------------------------------ views
    def next_deadline(self) -> float:
        """When the next revoke or session runs out (``clock`` time)."""
        times = list(self.revoking.values())
        times += [m.last_seen + m.session_timeout_s for m in self.members.values()]
        return min(times, default=self.clock() + 1.0)

    def view(self, cid: str) -> MemberView:
        m = self.members.get(cid)
        if m is None:
            return MemberView(
                cid, False, -1, self.generation, revoke_timeout_s=self.revoke_timeout_s
            )
        owned: dict[MessageQueue, FencingToken] = {}
        revoke: dict[MessageQueue, FencingToken] = {}
        for q, (owner, tok) in self.owners.items():
            if owner == cid and q not in self.to_fence:
                (revoke if q in self.revoking else owned)[q] = tok
        return MemberView(
            cid, True, m.version, self.generation, owned, revoke, self.revoke_timeout_s
        )

    def status(self) -> dict[str, Any]:
        now = self.clock()
        return {
            "group": self.group,
            "epoch": self.epoch,
            "generation": self.generation,
            "strategy": self.strategy.describe() if self.strategy else None,
            "members": {
                cid: {
                    "topics": sorted(m.topics),
                    "room": m.room,
                    "session_timeout_s": m.session_timeout_s,
                    "last_seen_age_s": round(now - m.last_seen, 3),
                    "watched": m.watched,
                    "owned": sorted(q for q, (o, _) in self.owners.items() if o == cid),
                }
                for cid, m in sorted(self.members.items())
            },
            "queues": {t: list(qs) for t, qs in sorted(self.queues.items())},
            "target": dict(self.target),
            "assignment": {q: owner for q, owner in self.owners.items()},
            "pending_revokes": {
                q: (self.owners[q][0], round(deadline - now, 3))
                for q, deadline in self.revoking.items()
            },
            "pending_fences": dict(self.to_fence),
            "fences": dict(self.fences),
            "log": list(self.log),
        }
