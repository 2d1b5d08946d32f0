"""Lite topics on a broker: the processor over the store's :class:`storage.lite.LiteStore`.

* A parent of type LITE is a topic created with
  :meth:`actors.broker.lite.parents.LiteParents.create_parent` (its quota of lite
  topics and their TTL after the last write kept in ``config/liteParents.json``, its
  TopicConfig with the other topics).
* A send names its lite topic per message; the first send (or subscription) naming a
  lite topic creates it.
* Within a consumer group a lite topic is consumed by one client at a time: the first
  of its subscribers owns it; when the owner unsubscribes or is not heard from for
  ``owner_lease_s`` (every call of a client renews it), the next subscriber takes it
  over, from the group's committed offset (:mod:`actors.broker.lite.groups`). A client
  subscribes and unsubscribes lite topics at any time (RocketMQ's PARTIAL_ADD,
  PARTIAL_REMOVE and COMPLETE_ADD).
* :meth:`LiteProcessor.receive` hands a client the messages of the lite topics it owns
  from where the group stands; :meth:`LiteProcessor.ack` commits a lite topic's offset.
  :meth:`LiteProcessor.pull` reads one lite topic from an offset the caller names
  (a gateway resuming a session).
* A receive or pull that finds nothing and names ``wait_ms`` is held (the broker's
  :class:`~actors.broker.longpolling.pull_hold_service.PullRequestHoldService`, keyed
  by parent and lite topic) until a send to one of its lite topics wakes it or
  ``wait_ms`` passes; then it reads once more.

Sends are taken on a master only. A master of a master/slave group writes them to its
own store: lite messages reach a slave with the CommitLog's bytes and are indexed there
by ``LiteStore.catch_up``. The leader of a Raft (DLedger) group proposes them through
the group's log (:mod:`actors.broker.lite.raft`), and with them every change of
consumer state: a commit, a subscription change, a lite topic deleted, the clients it
stopped hearing from. Every member applies these once committed, so the group's next
leader serves the subscriptions, owners and committed offsets its predecessor
acknowledged (not the messages handed out and not yet acknowledged: they are handed
out again from the committed offset). A new leader counts every client as heard from
when it starts to serve.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from actors.broker.ha import DLedgerReplication, MasterSlaveReplication, Replication
from actors.broker.lite.groups import (
    SUBSCRIBE_ADD,
    SUBSCRIBE_COMPLETE,
    SUBSCRIBE_REMOVE,
    LiteGroup,
)
from actors.broker.lite.parents import LiteParents
from actors.broker.lite.raft import RaftLiteLog
from actors.broker.runtime import BrokerRuntime
from actors.protocol.checks import validate_group
from storage.errors import (
    BrokerUnavailableError,
    InvalidMessageError,
    PermissionDeniedError,
)
from storage.lite import LiteConfig, LitePutResult, LiteStore, validate_lite_name
from storage.message import GetStatus, Message, PutStatus

log = logging.getLogger("raymq.actors.broker.lite")


class LiteProcessor:
    REQUESTS = (
        "send",
        "subscribe",
        "receive",
        "ack",
        "pull",
        "committed_offset",
        "stats",
        "describe_topic",
        "delete_topic",
    )
    """The coroutines a Broker serves as Ray methods named ``lite_<name>``."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        role: Replication,
        admin: Any,
        config: LiteConfig | None = None,
        owner_lease_s: float = 30.0,
    ) -> None:
        self.rt = runtime
        self.role = role
        self.admin = admin
        self.owner_lease_s = owner_lease_s
        raft = role if isinstance(role, DLedgerReplication) else None
        # in a Raft group only committed records are indexed: a divergent tail cut off
        # by a new leader was never in the lite index
        committed = (lambda: raft.readable_end) if raft is not None else None
        self.store = LiteStore(runtime.store, config, committed=committed)
        self.parents = LiteParents(runtime, self.store, admin, raft)  # declared before start
        self._groups: dict[tuple[str, str], LiteGroup] = {}
        self._lock = threading.Lock()  # the groups' tables (read and changed on I/O threads)
        self._forgetting: set[tuple[str, str, str]] = set()  # silent clients being proposed
        self._tasks: set[asyncio.Task[None]] = set()
        self._term = -1  # the Raft term this member last served lite calls in
        self.store.state_listener = self._on_state
        # a slave indexes the lite records its master's bytes bring; every Raft member
        # indexes the records the group committed
        self.store.start(following=lambda: raft is not None or not role.is_master)
        self.raft = RaftLiteLog(runtime, self.store, raft) if raft is not None else None
        if self.raft is not None:
            self.parents.caught_up = self._lead

    # ------------------------------------------------------------ admin
    async def describe_topic(self, parent: str, lite_topic: str) -> dict[str, Any] | None:
        """One lite topic: its min and max offsets, last write time, and per group that
        committed in it or consumes it: committed offset, lag and owning client. None
        if it does not exist here."""
        await self._caught_up()
        found = await self.rt.run(self.store.describe, parent, lite_topic)
        if found is None:
            return None
        first = await self.rt.run(self.store.get_raw, parent, lite_topic, 0, 1)
        top = found["max_offset"]
        groups: dict[str, dict[str, Any]] = {}
        with self._lock:
            owners = {
                group: g.owner.get(lite_topic)
                for (group, p), g in self._groups.items()
                if p == parent and lite_topic in g.subscribers
            }
        for group in sorted(set(found["committed"]) | set(owners)):
            committed = found["committed"].get(group, -1)
            groups[group] = {
                "committed_offset": committed,
                "lag": top - max(committed, first.min_offset),
                "owner": owners.get(group),
            }
        return {
            "parent": parent,
            "lite_topic": lite_topic,
            "min_offset": min(first.min_offset, top),
            "max_offset": top,
            "last_write_ms": found["last_write_ms"],
            "groups": groups,
        }

    async def delete_topic(self, parent: str, lite_topic: str) -> bool:
        """Delete a lite topic now with its groups' offsets and subscriptions; False
        if it does not exist here."""
        if self.raft is not None:
            await self._lead()
            if not await self.rt.run(self.store.exists, parent, lite_topic):
                return False
            await self.raft.change({"op": "delete", "parent": parent, "lite": lite_topic})
            return True
        deleted = await self.rt.run(self.store.delete, parent, lite_topic)
        self._unsubscribe_all(parent, lite_topic)
        return deleted

    def _unsubscribe_all(self, parent: str, lite_topic: str) -> None:
        with self._lock:
            for (_, p), g in self._groups.items():
                if p == parent:
                    g.unsubscribe_all(lite_topic)

    def _on_state(self, op: dict[str, Any]) -> None:
        """A consumer state change the group committed (any thread, the lite store's
        lock held): the subscription tables follow it."""
        kind = op["op"]
        if kind == "delete":
            self._unsubscribe_all(op["parent"], op["lite"])
            return
        key = (op["group"], op["parent"])
        with self._lock:
            if kind == "subscribe":
                g = self._groups.setdefault(key, LiteGroup())
                g.seen[op["client"]] = time.monotonic()
                g.change(op["client"], op["names"], op["action"])
            elif kind == "gone" and key in self._groups:
                for client in op["clients"]:
                    self._groups[key].forget(client)

    def _touch(self, g: LiteGroup, group: str, parent: str, client_id: str) -> None:
        """``client_id`` was heard from (the lock held, on the event loop). The clients
        silent for the owner lease lose their lite topics: here at once, or in a Raft
        group through its log."""
        gone = g.touch(client_id, self.owner_lease_s, drop=self.raft is None)
        if self.raft is None or not gone:
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

    async def _lead(self) -> None:
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

    # ------------------------------------------------------------ send
    async def send(
        self, parent: str, items: Sequence[tuple[str, bytes] | tuple[str, bytes, dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """Store messages to lite topics of ``parent``: ``(lite topic, body)`` or ``(lite
        topic, body, {"tags", "keys", "properties"})`` each. Per message: its lite topic,
        offset in it and message id."""
        self._check_writable()
        messages = []
        for item in items:
            if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
                raise InvalidMessageError(
                    "a lite send item is (lite topic, body) or (lite topic, body, options)"
                )
            opts = item[2] if len(item) == 3 else {}
            if not isinstance(opts, dict) or set(opts) - {"tags", "keys", "properties"}:
                raise InvalidMessageError(f"lite send options {opts!r}: tags, keys, properties")
            messages.append((item[0], Message(parent, item[1], **opts)))
        if self.raft is not None:
            return await self._send_through_log(self.raft, parent, messages)
        result = await self.rt.run(self.store.put_batch, parent, messages)
        self._wake(parent, {lite for lite, _ in messages})
        status = (await self._replicated(result)).value
        return [
            {"lite_topic": lite, "offset": off, "msg_id": mid, "status": status}
            for (lite, _), off, mid in zip(messages, result.lite_offsets.tolist(), result.msg_ids)
        ]

    async def _send_through_log(
        self, raft: RaftLiteLog, parent: str, messages: list[tuple[str, Message]]
    ) -> list[dict[str, Any]]:
        """A Raft leader's lite send, answered once committed and indexed."""
        lites, offsets, msg_ids, status = await raft.send(parent, messages)
        self._wake(parent, {lite for lite, _ in messages})
        return [
            {"lite_topic": lite, "offset": off, "msg_id": mid, "status": status.value}
            for lite, off, mid in zip(lites, offsets, msg_ids)
        ]

    async def _caught_up(self) -> None:
        if self.raft is not None:
            await self._lead()

    def _wake(self, parent: str, lite_topics: set[str]) -> None:
        """Wake the receives and pulls held on these lite topics (on the loop's thread)."""
        for lite in lite_topics:
            self.rt.holds.on_dispatch(_hold_key(parent, lite), 0, 0)

    async def _held(self, parent: str, lite_topics: Sequence[str], wait_ms: int, read: Any) -> Any:
        """``read()`` (a coroutine function); if it finds nothing and ``wait_ms`` > 0,
        once more after a send to one of ``lite_topics`` or after ``wait_ms``. The
        waiter is registered before the look, so a send between them is not missed."""
        if not isinstance(wait_ms, int) or wait_ms < 0:
            raise InvalidMessageError(f"wait_ms={wait_ms!r}: an int >= 0")
        await self._caught_up()
        if not wait_ms or not lite_topics or self.rt.closing:
            return await read()
        holds = self.rt.holds
        keys = [(_hold_key(parent, lite), 0) for lite in lite_topics]
        fut = holds.register_many(keys)
        try:
            got = await read()
        except BaseException:
            holds.discard_many(keys, fut)
            raise
        if _found(got):
            holds.discard_many(keys, fut)
            return got
        await holds.wait_many(keys, fut, wait_ms / 1000)
        return await read()

    async def _replicated(self, result: LitePutResult) -> PutStatus:
        """A stored batch's status once it is where a normal send's would be before its
        answer: durable under SYNC_FLUSH, on the slave too from a SYNC_MASTER."""
        status = PutStatus.PUT_OK if result.flushed else PutStatus.FLUSH_DISK_TIMEOUT
        role = self.role
        if (
            isinstance(role, MasterSlaveReplication)
            and role.role == "SYNC_MASTER"
            and len(result.commitlog_offsets)
        ):
            last = int(result.commitlog_offsets[-1])
            end = last + self.rt.store.commitlog.size_at(last)
            slave = await role.service.wait_for_slave(end)
            if slave is not PutStatus.PUT_OK:
                status = slave
        return status

    def _check_writable(self) -> None:
        if self.rt.closing:
            raise BrokerUnavailableError(f"broker {self.rt.config.actor_name} is shutting down")
        self.rt.check_writable()
        if not self.role.is_master:
            raise PermissionDeniedError(
                f"broker {self.rt.config.actor_name} is not a master: lite sends go to the master"
            )

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
        ``remove`` these, or ``complete``: exactly these. A subscription creates the lite
        topic if new (within the parent's quota). Returns the lite topics the client
        subscribes and those it owns (consumes) now."""
        validate_group(group)
        self.store.parent_settings(parent)  # NotALiteParentError for another topic
        names = [validate_lite_name(t) for t in lite_topics]
        if action not in (SUBSCRIBE_ADD, SUBSCRIBE_REMOVE, SUBSCRIBE_COMPLETE):
            raise InvalidMessageError(f"action={action!r}: one of add, remove, complete")
        if self.raft is not None:
            return await self._subscribe_through_log(group, parent, client_id, names, action)
        if action != SUBSCRIBE_REMOVE:
            for name in names:  # created first: a quota refusal leaves the table as it was
                await self.rt.run(self.store.create, parent, name)
        with self._lock:
            g = self._groups.setdefault((group, parent), LiteGroup())
            self._touch(g, group, parent, client_id)
            g.change(client_id, names, action)
            return g.view(client_id)

    async def _subscribe_through_log(
        self, group: str, parent: str, client_id: str, names: list[str], action: str
    ) -> dict[str, list[str]]:
        """A Raft leader's subscription change: proposed, and in its table once the
        group committed it (a change that changes nothing only renews the client)."""
        assert self.raft is not None
        await self._lead()
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
        self,
        group: str,
        parent: str,
        client_id: str,
        max_count: int = 32,
        wait_ms: int = 0,
        peek: bool = False,
    ) -> list[dict[str, Any]]:
        """Messages of the lite topics ``client_id`` owns in ``group``, each topic's from
        where the group stands (its committed offset, or what was handed out and not yet
        acknowledged): ``[{"lite_topic", "offset", "messages", "next_offset"}]``. With
        nothing to hand out it is held up to ``wait_ms`` for a send to one of them.

        With ``peek`` nothing is handed out: the owned lite topics that have messages to
        hand out, each with no messages and offsets -1, held as above while there are
        none (a client that asks several brokers waits for the first with messages,
        then receives from it)."""
        if peek:
            names = await self._peek(group, parent, client_id, wait_ms)
            return [
                {"lite_topic": n, "offset": -1, "messages": [], "next_offset": -1} for n in names
            ]
        got = await self._receive(group, parent, client_id, max_count, self.store.get, wait_ms)
        return [
            {
                "lite_topic": name,
                "offset": start,
                "messages": r.messages,
                "next_offset": r.next_offset,
            }
            for name, start, r in got
        ]

    async def receive_packed(
        self,
        group: str,
        parent: str,
        client_id: str,
        max_count: int = 32,
        wait_ms: int = 0,
        peek: bool = False,
    ) -> tuple[list[list[Any]], list[Any]]:
        """:meth:`receive` as the socket answers it: ``[lite topic, offset, count, next
        offset]`` per lite topic, and their records as stored, back to back."""
        if peek:
            names = await self._peek(group, parent, client_id, wait_ms)
            return [[n, -1, 0, -1] for n in names], []
        got = await self._receive(group, parent, client_id, max_count, self.store.get_raw, wait_ms)
        heads = [[name, start, r.count, r.next_offset] for name, start, r in got]
        return heads, [r.data for _, _, r in got]

    async def _receive(
        self, group: str, parent: str, client_id: str, max_count: int, read: Any, wait_ms: int
    ) -> list[tuple[str, int, Any]]:
        validate_group(group)
        if not isinstance(max_count, int) or max_count <= 0:
            raise InvalidMessageError(f"max_count={max_count!r}: an int > 0")
        with self._lock:
            g = self._groups.get((group, parent))
            owned = [] if g is None else g.owned(client_id)
        return await self._held(
            parent,
            owned,
            wait_ms,
            lambda: self._receive_once(group, parent, client_id, max_count, read),
        )

    async def _peek(self, group: str, parent: str, client_id: str, wait_ms: int) -> list[str]:
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

        return await self._held(parent, owned, wait_ms, look)

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
        out = []
        left = max_count
        for name in owned:
            if left <= 0:
                break
            start = cursors[name]
            if start < 0:
                start = max(0, self.store.committed_offset(group, parent, name))
            got = await self.rt.run(read, parent, name, start, left)
            if got.status is GetStatus.OFFSET_TOO_SMALL:  # expired under the group
                start = got.next_offset
                got = await self.rt.run(read, parent, name, start, left)
            count = got.count if hasattr(got, "count") else len(got.messages)
            if not count:
                continue
            left -= count
            with self._lock:
                if g.owner.get(name) == client_id:
                    g.cursor[name] = got.next_offset
            out.append((name, start, got))
        return out

    async def ack(
        self, group: str, parent: str, client_id: str, lite_topic: str, offset: int
    ) -> None:
        """``client_id`` consumed ``lite_topic`` up to ``offset`` (the next to read):
        committed for the group. Only the owner commits; an ack past what the group was
        handed (the owner read on by pulls) moves the next receive there too."""
        validate_group(group)
        if self.raft is not None:
            await self._lead()
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

    async def pull(
        self, parent: str, lite_topic: str, offset: int, max_count: int = 32, wait_ms: int = 0
    ) -> dict[str, Any]:
        """Read ``lite_topic`` from ``offset`` whoever owns it (a resume from an offset the
        caller kept): ``{"status", "messages", "next_offset", "max_offset"}``. With
        nothing from ``offset`` on it is held up to ``wait_ms`` for a send to it."""
        got = await self._pull(self.store.get, parent, lite_topic, offset, max_count, wait_ms)
        return {
            "status": got.status.value,
            "messages": got.messages,
            "next_offset": got.next_offset,
            "max_offset": got.max_offset,
        }

    async def pull_packed(
        self, parent: str, lite_topic: str, offset: int, max_count: int = 32, wait_ms: int = 0
    ) -> tuple[dict[str, Any], bytes | memoryview]:
        """:meth:`pull` as the socket answers it: its status and offsets, and the
        records as stored."""
        got = await self._pull(self.store.get_raw, parent, lite_topic, offset, max_count, wait_ms)
        head = {
            "status": got.status.value,
            "count": got.count,
            "next_offset": got.next_offset,
            "max_offset": got.max_offset,
        }
        return head, got.data

    async def _pull(
        self, read: Any, parent: str, lite_topic: str, offset: int, max_count: int, wait_ms: int
    ) -> Any:
        async def once() -> Any:
            return await self.rt.run(read, parent, lite_topic, offset, max_count)

        return await self._held(parent, [lite_topic], wait_ms, once)

    async def committed_offset(self, group: str, parent: str, lite_topic: str) -> int:
        validate_group(group)
        await self._caught_up()
        return await self.rt.run(self.store.committed_offset, group, parent, lite_topic)

    async def stats(self) -> dict[str, int]:
        """The lite store's counts; in a Raft group also the consumer state changes
        proposed (``state_changes``) and the log entries they took (``state_rounds``)."""
        out = self.store.stats()
        if self.raft is not None:
            out = {**out, "state_rounds": self.raft.rounds, "state_changes": self.raft.changes}
        return out

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.raft is not None:
            self.raft.close()
        self.parents.close()
        self.store.close()


def _hold_key(parent: str, lite_topic: str) -> str:
    """The hold service's key of a lite topic (no topic name holds ``\\x01``)."""
    return f"{parent}\x01{lite_topic}"


_WAIT = (
    GetStatus.NO_MATCHED_LOGIC_QUEUE,  # not created yet: its first send creates it
    GetStatus.NO_MESSAGE_IN_QUEUE,
    GetStatus.OFFSET_OVERFLOW_ONE,
)


def _found(got: Any) -> bool:
    """A receive's or a pull's read has its answer: messages, or a pull's offset that
    no send makes good (too small, too far)."""
    if isinstance(got, list):
        return bool(got)
    return got.status not in _WAIT
