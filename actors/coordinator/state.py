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
* an offset reset of a topic (``begin_reset`` .. ``end_reset``) fences the topic's
  queues at a token above every token handed out before it, and assigns none of them
  while the brokers write the new offsets; then each owner gets its queues again under
  a newer token, so it drops what it held in memory and starts from the reset offsets,
  and nothing it commits from before the reset can land.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from actors.coordinator.strategies import (
    StrategySpec,
    build_strategy,
    config_shares,
    configured_queues,
    warn_roomless,
)
from actors.protocol.fencing import FencingToken
from rebalance import MessageQueue, assign
from storage.errors import InvalidConfigError

log = logging.getLogger("raymq.actors.coordinator.coordinator")


class GroupEvent(NamedTuple):
    """One line of the generation log. ``event`` is one of join, leave, dead (Ray
    reported the member's actor gone or closed), expired (silent past its session
    timeout), routes (the queues changed), revoke, confirm, fence, assign, reset (the
    group's offsets of a topic were reset; on a queue: its owner was given it again)."""

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
    holds that is in neither was fenced: drop it without committing; a queue ``owned``
    under another token than the one it holds it with was fenced too (its offset was
    reset): drop it without committing and start it again from the committed offset.
    ``member`` False: the coordinator does not know this client (join again)."""

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
    configured: frozenset[MessageQueue] = frozenset()  # its queues under 'config'


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
        self.resetting: dict[str, FencingToken] = {}  # topic -> its reset's fence
        self._roomless_warned: set[str] = set()
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
    def check_join(self, spec: StrategySpec, room: str | None, cid: str = "<joining>") -> None:
        """Raise InvalidConfigError unless ``cid`` with ``spec`` and ``room`` may join."""
        if self.strategy is not None and self.members and not self.strategy.same_as(spec):
            raise InvalidConfigError(
                f"group {self.group!r} rebalances with strategy {self.strategy.describe()}; "
                f"a member cannot join with {spec.describe()} (all members must agree)"
            )
        rooms = {c: m.room for c, m in self.members.items()}
        rooms[cid] = room
        build_strategy(spec, rooms)
        if spec.name == "config":
            self._check_configured(cid, configured_queues(spec))

    def _check_configured(self, cid: str, listed: frozenset[MessageQueue]) -> None:
        """Under 'config' a coordinated group still gives a queue one owner."""
        for other, m in self.members.items():
            shared = sorted(listed & m.configured) if other != cid else []
            if shared:
                raise InvalidConfigError(
                    f"rebalance strategy='config': {cid} lists {len(shared)} queue(s) "
                    f"{other} lists too (first {shared[0]}); a coordinated group gives each "
                    "queue one owner, so give each member its own queues, or consume with "
                    "coordinated=False, where members may read the same queues"
                )

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
        self.check_join(spec, room, cid)
        now = self.clock()
        self.strategy = self.strategy if self.members else spec
        topics = frozenset(topics)
        listed = configured_queues(spec) if spec.name == "config" else frozenset()
        old = self.members.get(cid)
        if old is not None:
            old.last_seen = now
            old.session_timeout_s = session_timeout_s
            old.watched = old.watched or watched
            if old.topics == topics and old.room == room and old.configured == listed:
                return False
            old.topics, old.room, old.configured = topics, room, listed
            self._event("join", from_id=None, to_id=cid)
            return True
        self.members[cid] = Member(
            cid, topics, room, session_timeout_s, now, watched, configured=listed
        )
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
        spec = self.strategy
        strategy = build_strategy(spec, {cid: m.room for cid, m in self.members.items()})
        target: dict[MessageQueue, str] = {}
        for topic in sorted(self.topics()):
            queues = self.queues.get(topic, ())
            cids = [cid for cid, m in self.members.items() if topic in m.topics]
            if not queues or not cids:
                continue
            if spec.name == "config":
                listed = {cid: self.members[cid].configured for cid in cids}
                shares = config_shares(self.group, topic, queues, listed)
            else:
                warn_roomless(self.group, spec.name, queues, self._roomless_warned)
                shares = assign(strategy, self.group, queues, cids)
            for cid, share in shares.items():
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
            if q in self.owners or q in self.to_fence or q.topic in self.resetting:
                continue
            if q not in self.assigned_once:
                self.to_fence[q] = None  # an owner from before this coordinator may live on
                continue
            self.owners[q] = (cid, self.token())
            self._event("assign", q, None, cid)
            self._touch(cid)

    # ------------------------------------------------------------ offset resets
    def begin_reset(self, topic: str) -> FencingToken:
        """A reset of ``topic``'s offsets starts: the fence to set with the new offsets,
        above every token handed out so far. None of its queues is assigned until
        :meth:`end_reset`."""
        self.generation += 1
        self._event("reset")
        token = self.token()
        self.resetting[topic] = token
        return token

    def end_reset(self, topic: str, reset: Iterable[MessageQueue]) -> list[str]:
        """The brokers hold the new offsets of ``reset`` (queues of ``topic``), fenced at
        the token :meth:`begin_reset` gave: each owner gets those queues again under the
        current token, so it drops them without a commit and starts from the reset
        offsets. Returns the owners told."""
        fence = self.resetting.pop(topic)
        told: set[str] = set()
        for q in reset:
            self.fences[q] = max(fence, self.fences.get(q, fence))
            owner = self.owners.get(q)
            if owner is None or q in self.revoking or q in self.to_fence:
                continue  # its owner is leaving it: any commit of its old token is refused
            cid, tok = owner
            if tok < fence:
                self.owners[q] = (cid, self.token())
                self._event("reset", q, cid, cid)
                self._touch(cid)
                told.add(cid)
        self.reconcile()
        return sorted(told)

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
            "resetting": dict(self.resetting),
            "fences": dict(self.fences),
            "log": list(self.log),
        }
