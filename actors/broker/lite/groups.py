"""Who consumes which lite topic in a consumer group: one group's table for one parent.

Within a group a lite topic is consumed by one client at a time: the first of its
subscribers owns it; when the owner unsubscribes or is not heard from for the owner
lease (every call of a client renews it), the next subscriber takes it over, from the
group's committed offset (its cursor is forgotten). The table is read and changed
under the processor's lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

log = logging.getLogger("raymq.actors.broker.lite")

SUBSCRIBE_ADD, SUBSCRIBE_REMOVE, SUBSCRIBE_COMPLETE = "add", "remove", "complete"
SUBSCRIBE_KEEP = "keep"
"""A client's resync: ``add`` the lite topics named that still exist, create none; those
deleted or expired are answered as ``gone`` (RocketMQ tells its clients to unsubscribe
them) and the client forgets them."""
SUBSCRIBE_RESYNC = "resync"
"""An official client's periodic ``COMPLETE_ADD``: its whole list again. Exactly those
named that still exist, creating none: a lite topic that expired or was deleted since is
answered as ``gone``, not made again, so a session its client still lists but nobody
writes to stays expired (the official clients 5.1.2 and 1.0.8 ignore
``NotifyUnsubscribeLiteCommand`` and list it until they unsubscribe it)."""


@dataclass
class LiteGroup:
    """One consumer group's view of one parent: who subscribes what, who owns what."""

    # lite -> clients in order, a tuple replaced on each change (a save copies the dict)
    subscribers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)  # lite -> client
    subscribed: dict[str, set[str]] = field(default_factory=dict)  # client -> lites
    seen: dict[str, float] = field(default_factory=dict)  # client -> monotonic time
    cursor: dict[str, int] = field(default_factory=dict)  # lite -> next offset handed out

    def change(self, client_id: str, names: Sequence[str], action: str) -> None:
        """``add`` these lite topics to ``client_id``'s subscriptions, ``remove`` these,
        or ``complete``: exactly these."""
        mine = self.subscribed.setdefault(client_id, set())
        if action == SUBSCRIBE_ADD:
            adds, removes = [n for n in names if n not in mine], []
        elif action == SUBSCRIBE_REMOVE:
            adds, removes = [], [n for n in names if n in mine]
        else:
            wanted = set(names)
            adds = [n for n in names if n not in mine]
            removes = sorted(mine - wanted)
        for name in adds:
            mine.add(name)
            self.subscribers[name] = (*self.subscribers.get(name, ()), client_id)
            self.owner.setdefault(name, client_id)
        for name in removes:
            mine.discard(name)
            self.drop(name, client_id)

    def touch(self, client_id: str, lease_s: float, drop: bool = True) -> list[str]:
        """``client_id`` was heard from; the clients silent for ``lease_s``, returned,
        lose theirs (with ``drop``; else the caller has them dropped: :meth:`forget`)."""
        now = time.monotonic()
        self.seen[client_id] = now
        gone = [c for c, t in self.seen.items() if now - t > lease_s]
        if drop:
            for c in gone:
                self.forget(c)
        return gone

    def forget(self, client_id: str) -> None:
        """``client_id``'s lite topics pass to their next subscribers."""
        for name in sorted(self.subscribed.pop(client_id, ())):
            self.drop(name, client_id)
        seen = self.seen.pop(client_id, None)
        if seen is not None:
            silent = time.monotonic() - seen
            log.info(
                "lite consumer %s silent for %.0fs: its lite topics passed on", client_id, silent
            )

    def unchanged(self, client_id: str, names: Sequence[str], action: str) -> bool:
        """Whether :meth:`change` with these would change nothing."""
        mine = self.subscribed.get(client_id, set())
        if action == SUBSCRIBE_ADD:
            return all(n in mine for n in names)
        if action == SUBSCRIBE_REMOVE:
            return not any(n in mine for n in names)
        return set(names) == mine

    def renew_all(self) -> None:
        """Every client counts as heard from now (a new Raft leader: it heard none of
        them while it followed)."""
        now = time.monotonic()
        for client in self.seen:
            self.seen[client] = now

    def unsubscribe_all(self, name: str) -> tuple[str, ...]:
        """Every client's subscription of ``name`` ends (the lite topic was deleted or
        expired); the clients whose subscription it was."""
        clients = self.subscribers.get(name, ())
        for client in clients:
            self.subscribed.get(client, set()).discard(name)
            self.drop(name, client)
        return clients

    def drop(self, name: str, client_id: str) -> None:
        subs = self.subscribers.get(name, ())
        if client_id in subs:
            subs = tuple(c for c in subs if c != client_id)
            self.subscribers[name] = subs
        if self.owner.get(name) == client_id:
            del self.owner[name]
            self.cursor.pop(name, None)  # the next owner starts from the committed offset
            if subs:
                self.owner[name] = subs[0]
        if not subs:
            self.subscribers.pop(name, None)

    def owned(self, client_id: str) -> list[str]:
        """The lite topics ``client_id`` consumes, by name."""
        mine = self.subscribed.get(client_id, ())
        return [n for n in sorted(mine) if self.owner.get(n) == client_id]

    def view(self, client_id: str) -> dict[str, list[str]]:
        mine = self.subscribed.get(client_id, set())
        return {"subscribed": sorted(mine), "owned": self.owned(client_id)}
