"""The consumers of lite topics on a broker: per consumer group and parent, who
subscribes which lite topic and who owns (consumes) it (:mod:`actors.broker.lite.groups`),
what a receive hands out, and the acks that commit a group's offsets.

In a Raft group every change of these tables (a subscription, a commit, the clients the
leader stopped hearing from) goes through the group's log (:class:`RaftLiteLog.change
<actors.broker.lite.raft.RaftLiteLog.change>`), and the tables follow what the group
committed (:meth:`LiteConsumers.on_state`), on every member.

The tables are saved beside the lite offsets (:mod:`actors.broker.lite.saved`) within
``flush_interval_ms`` of a change and at a clean stop, and loaded at start, so the
subscriptions and owners survive a restart before any client sends them again (the
messages handed out and not acknowledged do not: they are handed out again from the
committed offset). In a Raft group the file says up to which state record of the log
it holds them: the changes after it are replayed from the log, each applied once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from actors.broker.lite.groups import (
    SUBSCRIBE_ADD,
    SUBSCRIBE_COMPLETE,
    SUBSCRIBE_KEEP,
    SUBSCRIBE_REMOVE,
    SUBSCRIBE_RESYNC,
    LiteGroup,
)
from actors.broker.lite.holds import LiteHolds
from actors.broker.lite.raft import RaftLiteLog
from actors.broker.lite.saved import Key, Part, SavedTables, SavedTablesError, part_of
from actors.broker.runtime import BrokerRuntime
from actors.protocol.checks import validate_group
from storage.errors import InvalidMessageError, PermissionDeniedError
from storage.lite import LiteStore, validate_lite_name
from storage.message import GetStatus

log = logging.getLogger("raymq.actors.broker.lite")

_ACTIONS = (SUBSCRIBE_ADD, SUBSCRIBE_REMOVE, SUBSCRIBE_COMPLETE, SUBSCRIBE_KEEP, SUBSCRIBE_RESYNC)


class LiteConsumers:
    """The subscription tables of a broker's lite topics, and the calls that use them."""

    REQUESTS = ("subscribe", "ack")
    """The coroutines a Broker serves as Ray methods named ``lite_<name>`` (the socket's
    ``LITE_SUBSCRIBE`` and ``LITE_ACK`` too)."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        store: LiteStore,
        raft: RaftLiteLog | None,
        holds: LiteHolds,
        owner_lease_s: float,
    ) -> None:
        self.rt = runtime
        self.store = store
        self.raft = raft
        self.holds = holds
        self.owner_lease_s = owner_lease_s
        self._groups: dict[tuple[str, str], LiteGroup] = {}
        self._lock = threading.Lock()  # the groups' tables (read and changed on I/O threads)
        self._forgetting: set[tuple[str, str, str]] = set()  # silent clients being proposed
        self._tasks: set[asyncio.Task[None]] = set()
        self._term = -1  # the Raft term this member last served lite calls in
        self._file = SavedTables(store.root)
        self._at = 0  # where the last state record the tables hold ends (Raft)
        self._dirty: set[Key] = set()  # groups changed since the last save
        self._changed = False  # a save is due
        self._parts: dict[Key, Part] = {}  # what the file holds of each group
        self._saving = threading.Lock()  # one save at a time, in order
        self.saves = 0
        """Saves of the tables since start."""
        self.ended_listener: Callable[[str, list[str]], None] | None = None
        """Called (any thread, the tables' lock held) with a client and the lite topics
        whose subscription a delete or an expiry ended for it: the gRPC door tells its
        official clients (``NotifyUnsubscribeLiteCommand``)."""

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        try:
            self.save()
        except Exception:  # noqa: BLE001 - a clean stop goes on; the last save stands
            log.exception("lite subscriptions %s not saved at close", self._file.path)

    # ------------------------------------------------------------ saved tables
    def load(self, replay: bool) -> None:
        """The saved tables, then with ``replay`` (a Raft group) the state changes the
        log holds after them; before the store's listener is set and its upkeep started.
        A file that cannot be read is set aside with an error logged: the tables start
        empty (with ``replay``, rebuilt from what the log still holds)."""
        path = self._file.path
        try:
            saved = self._file.read()
        except (OSError, SavedTablesError) as exc:
            aside = self._file.set_aside()
            log.error(
                "lite subscriptions %s unreadable (%s), moved to %s: the subscription "
                "tables start empty%s",
                path,
                exc,
                aside,
                " and are rebuilt from the Raft log" if replay else "",
            )
            saved = None
        at, groups = saved if saved is not None else (0, {})
        end = self.store.store.commitlog.max_offset
        if at > end:
            log.error(
                "lite subscriptions %s hold the log up to %d, past the CommitLog's end %d: "
                "the subscription tables start empty%s",
                path,
                at,
                end,
                " and are rebuilt from the Raft log" if replay else "",
            )
            at, groups = 0, {}
        with self._lock:
            self._groups = groups
            self._parts = {k: part_of(g) for k, g in groups.items()}
            self._at = at
        replayed = self.store.state_changes(at) if replay else []
        for end_at, op in replayed:
            self._apply(op, end_at)
        log.info(
            "lite subscriptions loaded from %s: %d groups, %d subscriptions, %d changes "
            "replayed from the log",
            path,
            len(groups),
            sum(len(g.subscribers) for g in groups.values()),
            len(replayed),
        )

    def save(self) -> bool:
        """Write the tables if they changed since the last save; whether it wrote."""
        with self._saving:
            with self._lock:
                if not self._changed:
                    return False
                for key in self._dirty:
                    g = self._groups.get(key)
                    part = part_of(g) if g is not None else {}
                    if part:
                        self._parts[key] = part
                    else:
                        self._parts.pop(key, None)
                self._dirty.clear()
                self._changed = False
                at, parts = self._at, list(self._parts.items())
            try:
                self._file.write(at, parts)
            except BaseException:
                self._changed = True  # the next turn tries again
                raise
            self.saves += 1
            return True

    @property
    def unsaved(self) -> bool:
        """Whether a change of the tables is not in the file yet."""
        return self._changed or self._saving.locked()

    def start_saving(self) -> None:
        """Save the changed tables every ``flush_interval_ms`` (on an I/O thread)."""
        task = self.rt.loop.create_task(self._keep_saved())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _keep_saved(self) -> None:
        """A save every ``flush_interval_ms`` while the tables change, and no sooner
        than ten times the last save took after it: large tables (their JSON is written
        holding the GIL) cost the broker a tenth of its time at most."""
        interval = self.store.config.flush_interval_ms / 1000
        wait = interval
        while True:
            await asyncio.sleep(wait)
            if not self._changed:
                continue
            started = time.monotonic()
            try:
                await self.rt.run(self.save)
            except Exception:  # noqa: BLE001 - the next turn tries again
                log.exception("lite subscriptions %s not saved", self._file.path)
            wait = max(interval, 10 * (time.monotonic() - started))

    def _mark(self, key: Key) -> None:
        """``key``'s table changed (the lock held): saved at the next turn."""
        self._dirty.add(key)
        self._changed = True

    # ------------------------------------------------------------ the tables
    def tables(self) -> dict[Key, dict[str, list[str]]]:
        """Per (group, parent) with subscriptions: each lite topic's subscribers in
        order, its owner first (a copy)."""
        with self._lock:
            parts = {k: part_of(g) for k, g in self._groups.items()}
        return {k: {n: list(c) for n, c in p.items()} for k, p in parts.items() if p}

    def owners(self, parent: str, lite_topic: str) -> dict[str, str | None]:
        """Per group subscribing ``lite_topic``: the client that owns it (or None)."""
        with self._lock:
            return {
                group: g.owner.get(lite_topic)
                for (group, p), g in self._groups.items()
                if p == parent and lite_topic in g.subscribers
            }

    def unsubscribe_all(self, parent: str, lite_topics: Sequence[str]) -> None:
        """These lite topics of ``parent`` were deleted or expired: every subscription
        of them ends (any thread; from the lite store's expiry, its lock held)."""
        with self._lock:
            self._unsubscribe_all(parent, lite_topics)

    def _unsubscribe_all(self, parent: str, lite_topics: Sequence[str]) -> None:
        ended: dict[str, list[str]] = {}
        for key, g in self._groups.items():
            if key[1] != parent:
                continue
            hit = [n for n in lite_topics if n in g.subscribers]
            for name in hit:
                for client in g.unsubscribe_all(name):
                    ended.setdefault(client, []).append(name)
            if hit:
                self._mark(key)
        listener = self.ended_listener
        if listener is not None:
            for client, names in ended.items():
                listener(client, names)

    def on_state(self, op: dict[str, Any]) -> None:
        """A consumer state change the group committed (any thread, the lite store's
        lock held): the subscription tables follow it, unless they hold it already
        (saved after it)."""
        self._apply(op, self.store.state_at)

    def _apply(self, op: dict[str, Any], at: int) -> None:
        """The state change whose record ends at ``at`` in the CommitLog."""
        kind = op["op"]
        with self._lock:
            if at <= self._at:
                return  # the saved tables held it
            self._at = at
            if kind == "delete":
                self._unsubscribe_all(op["parent"], [op["lite"]])
                return
            if kind == "expire":
                self._unsubscribe_all(op["parent"], op["names"])
                return
            if kind not in ("subscribe", "gone"):
                return
            key = (op["group"], op["parent"])
            if kind == "subscribe":
                g = self._groups.setdefault(key, LiteGroup())
                g.seen[op["client"]] = time.monotonic()
                g.change(op["client"], op["names"], op["action"])
                self._mark(key)
            elif key in self._groups:
                for client in op["clients"]:
                    self._groups[key].forget(client)
                self._mark(key)

    def _touch(self, g: LiteGroup, group: str, parent: str, client_id: str) -> None:
        """``client_id`` was heard from (the lock held, on the event loop). The clients
        silent for the owner lease lose their lite topics: here at once, or in a Raft
        group through its log."""
        gone = g.touch(client_id, self.owner_lease_s, drop=self.raft is None)
        if self.raft is None or not gone:
            if gone:
                self._mark((group, parent))
            return
        fresh = [c for c in gone if (group, parent, c) not in self._forgetting]
        if not fresh:
            return
        self._forgetting.update((group, parent, c) for c in fresh)
        task = asyncio.get_running_loop().create_task(self._forget(group, parent, fresh))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _forget(self, group: str, parent: str, clients: list[str]) -> None:
        assert self.raft is not None
        op = {"op": "gone", "group": group, "parent": parent, "clients": clients}
        try:
            await self.raft.change(op)
        except Exception as exc:  # noqa: BLE001 - the next call of the group proposes again
            log.info("lite consumers %s of %s not dropped: %s", clients, group, exc)
        finally:
            self._forgetting.difference_update((group, parent, c) for c in clients)

    async def lead(self) -> None:
        """A Raft leader's lite state is its group's before it serves a lite call: every
        committed record indexed and applied; on its first call of a term, every client
        counts as heard from now."""
        assert self.raft is not None
        await self.raft.caught_up()
        node = self.raft.raft.node
        if node.is_leader and node.term != self._term:
            self._term = node.term
            with self._lock:
                for g in self._groups.values():
                    g.renew_all()

    # ------------------------------------------------------------ subscriptions
    async def subscribe(
        self,
        group: str,
        parent: str,
        client_id: str,
        lite_topics: Sequence[str],
        action: str = SUBSCRIBE_ADD,
    ) -> dict[str, list[str]]:
        """Change ``client_id``'s lite subscriptions in ``group``: ``add`` these,
        ``remove`` these, ``complete``: exactly these, ``keep``: add those of these
        that exist (a client's resync; it creates none), or ``resync``: exactly those of
        these that exist (an official client's ``COMPLETE_ADD``; it creates none). A
        subscription creates the lite topic if new (within the parent's quota). Returns
        the lite topics the client subscribes and those it owns (consumes) now, and
        ``gone``: those a ``keep`` or ``resync`` named that were deleted or expired (the
        client should forget them)."""
        validate_group(group)
        self.store.parent_settings(parent)  # NotALiteParentError for another topic
        names = [validate_lite_name(t) for t in lite_topics]
        if action not in _ACTIONS:
            raise InvalidMessageError(
                f"action={action!r}: one of add, remove, complete, keep, resync"
            )
        gone: list[str] = []
        store = self.store
        create = action != SUBSCRIBE_REMOVE
        if action in (SUBSCRIBE_KEEP, SUBSCRIBE_RESYNC):  # those that exist, none created
            there = await self.rt.run(lambda: [n for n in names if store.exists(parent, n)])
            gone = sorted(set(names) - set(there))
            names, create = there, False
            action = SUBSCRIBE_ADD if action == SUBSCRIBE_KEEP else SUBSCRIBE_COMPLETE
        if self.raft is not None:
            view = await self._subscribe_through_log(group, parent, client_id, names, action)
            return {**view, "gone": gone}
        if create:  # first, in one hop: a quota refusal leaves the table as it was
            await self.rt.run(lambda: [store.create(parent, n) for n in names])
        with self._lock:
            g = self._groups.setdefault((group, parent), LiteGroup())
            self._touch(g, group, parent, client_id)
            g.change(client_id, names, action)
            self._mark((group, parent))
            return {**g.view(client_id), "gone": gone}

    async def _subscribe_through_log(
        self, group: str, parent: str, client_id: str, names: list[str], action: str
    ) -> dict[str, list[str]]:
        """A Raft leader's subscription change: proposed, and in its table once the
        group committed it (a change that changes nothing only renews the client)."""
        assert self.raft is not None
        await self.lead()
        with self._lock:
            g = self._groups.setdefault((group, parent), LiteGroup())
            self._touch(g, group, parent, client_id)
            same = g.unchanged(client_id, names, action)
        if not same:
            if action != SUBSCRIBE_REMOVE:  # a quota refusal proposes nothing
                await self.rt.run(self.store.check_room, parent, names)
            op = {
                "op": "subscribe",
                "group": group,
                "parent": parent,
                "client": client_id,
                "names": names,
                "action": action,
            }
            await self.raft.change(op)
        with self._lock:
            g = self._groups.setdefault((group, parent), LiteGroup())
            return g.view(client_id)

    # ------------------------------------------------------------ consume
    async def receive(
        self, group: str, parent: str, client_id: str, max_count: int, read: Any, wait_ms: int
    ) -> list[tuple[str, int, Any]]:
        """Per lite topic ``client_id`` owns in ``group`` with messages from where the
        group stands: its name, that offset and ``read``'s result (the store's ``get``
        or ``get_raw``), ``max_count`` messages in all at most, held up to ``wait_ms``
        while there are none."""
        validate_group(group)
        if not isinstance(max_count, int) or max_count <= 0:
            raise InvalidMessageError(f"max_count={max_count!r}: an int > 0")
        with self._lock:
            g = self._groups.get((group, parent))
            owned = [] if g is None else g.owned(client_id)
        return await self.holds.held(
            parent,
            owned,
            wait_ms,
            lambda: self._receive_once(group, parent, client_id, max_count, read),
        )

    async def peek(self, group: str, parent: str, client_id: str, wait_ms: int) -> list[str]:
        """The lite topics ``client_id`` owns in ``group`` with messages past where the
        group stands, held up to ``wait_ms`` while there are none."""
        validate_group(group)
        with self._lock:
            g = self._groups.get((group, parent))
            owned = [] if g is None else g.owned(client_id)

        async def look() -> list[str]:
            with self._lock:
                if g is None:
                    return []
                self._touch(g, group, parent, client_id)
                cursors = {n: g.cursor.get(n, -1) for n in g.owned(client_id)}
            store = self.store
            return [
                name
                for name, at in cursors.items()
                if store.max_offset(parent, name)
                > (at if at >= 0 else max(0, store.committed_offset(group, parent, name)))
            ]

        return await self.holds.held(parent, owned, wait_ms, look)

    async def _receive_once(
        self, group: str, parent: str, client_id: str, max_count: int, read: Any
    ) -> list[tuple[str, int, Any]]:
        with self._lock:
            g = self._groups.get((group, parent))
            if g is None:
                return []
            self._touch(g, group, parent, client_id)
            owned = g.owned(client_id)
            cursors = {n: g.cursor.get(n, -1) for n in owned}
        store = self.store

        def read_all() -> list[tuple[str, int, Any]]:
            found = []
            left = max_count
            for name in owned:
                if left <= 0:
                    break
                start = cursors[name]
                if start < 0:
                    start = max(0, store.committed_offset(group, parent, name))
                got = read(parent, name, start, left)
                if got.status is GetStatus.OFFSET_TOO_SMALL:  # expired under the group
                    start = got.next_offset
                    got = read(parent, name, start, left)
                count = got.count if hasattr(got, "count") else len(got.messages)
                if count:
                    left -= count
                    found.append((name, start, got))
            return found

        # every owned lite topic read in one go: inline as a normal pull reads (copies
        # out of the page cache) unless the lite store's lock is held (a catch-up may
        # hold it long), else in one thread hop, not one per lite topic
        if self.rt.config.inline_reads and not store.busy():
            out = read_all()
        else:
            out = await self.rt.run(read_all)
        with self._lock:
            for name, _, got in out:
                if g.owner.get(name) == client_id:
                    g.cursor[name] = got.next_offset
        return out

    async def ack(
        self, group: str, parent: str, client_id: str, lite_topic: str, offset: int
    ) -> None:
        """``client_id`` consumed ``lite_topic`` up to ``offset`` (the next to read):
        committed for the group. Only the owner commits; an ack past what the group was
        handed (the owner read on by pulls) moves the next receive there too."""
        validate_group(group)
        if self.raft is not None:
            await self.lead()
        with self._lock:
            g = self._groups.get((group, parent))
            if g is None or g.owner.get(lite_topic) != client_id:
                raise PermissionDeniedError(
                    f"client {client_id!r} does not own lite topic {lite_topic!r} in group "
                    f"{group!r}: another consumer of the group consumes it"
                )
            self._touch(g, group, parent, client_id)
            if lite_topic in g.cursor and isinstance(offset, int):
                g.cursor[lite_topic] = max(g.cursor[lite_topic], offset)
        if self.raft is None:
            await self.rt.run(self.store.commit_offset, group, parent, lite_topic, offset)
        elif await self.rt.run(self.store.check_commit, group, parent, lite_topic, offset):
            op = {
                "op": "commit",
                "group": group,
                "parent": parent,
                "lite": lite_topic,
                "offset": offset,
            }
            await self.raft.change(op)
