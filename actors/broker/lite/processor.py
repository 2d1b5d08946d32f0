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
  subscribes and unsubscribes lite topics at any time (RocketMQ's PARTIAL_ADD and
  PARTIAL_REMOVE; COMPLETE_ADD, the official clients' periodic resync, creates none).
  The subscription tables are saved beside the lite offsets and loaded at start: the
  subscriptions and owners survive a restart (:mod:`actors.broker.lite.consumers`).
* :meth:`LiteProcessor.receive` hands a client the messages of the lite topics it owns
  from where the group stands; :meth:`LiteConsumers.ack
  <actors.broker.lite.consumers.LiteConsumers.ack>` commits a lite topic's offset.
  :meth:`LiteProcessor.pull` reads one lite topic from an offset the caller names
  (a gateway resuming a session).
* A receive or pull that finds nothing and names ``wait_ms`` is held (the broker's
  :class:`~actors.broker.longpolling.pull_hold_service.PullRequestHoldService`, keyed
  by parent and lite topic) until a send to one of its lite topics wakes it or
  ``wait_ms`` passes; then it reads once more.

Sends are taken on a master only. On an ASYNC_FLUSH master with nothing to wait for (no
slave to wait for, no Raft log, the lite store's lock free) a send over the broker's
socket is stored and answered from the socket's reader, as a normal send is
(:meth:`LiteProcessor.send_now`, ``actors.broker.listener``): the same checks, bytes and
answer as :meth:`LiteProcessor.send`, without a task and a thread per request. A master
of a master/slave group writes them to its own store: lite messages reach a slave with
the CommitLog's bytes and are indexed there by ``LiteStore.catch_up``. The leader of a
Raft (DLedger) group proposes them through the group's log
(:mod:`actors.broker.lite.raft`), and with them every change of consumer state: a
commit, a subscription change, a lite topic deleted, the clients it stopped hearing
from. Every member applies these once committed, so the group's next leader serves the
subscriptions, owners and committed offsets its predecessor acknowledged (not the
messages handed out and not yet acknowledged: they are handed out again from the
committed offset). A new leader counts every client as heard from when it starts to
serve.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from actors.broker.ha import DLedgerReplication, MasterSlaveReplication, Replication
from actors.broker.lite.consumers import LiteConsumers
from actors.broker.lite.groups import (
    SUBSCRIBE_ADD,
    SUBSCRIBE_COMPLETE,
    SUBSCRIBE_REMOVE,
    SUBSCRIBE_RESYNC,
)
from actors.broker.lite.holds import LiteHolds
from actors.broker.lite.parents import LiteParents
from actors.broker.lite.raft import RaftLiteLog
from actors.broker.runtime import BrokerRuntime
from actors.protocol.checks import validate_group
from storage.errors import (
    BrokerUnavailableError,
    InvalidMessageError,
    PermissionDeniedError,
)
from storage.lite import LiteConfig, LitePutResult, LiteStore
from storage.message import Message, PutStatus

__all__ = [
    "SUBSCRIBE_ADD",
    "SUBSCRIBE_COMPLETE",
    "SUBSCRIBE_REMOVE",
    "SUBSCRIBE_RESYNC",
    "LiteProcessor",
]

log = logging.getLogger("raymq.actors.broker.lite")


class LiteProcessor:
    """A broker's lite topics: sends and pulls here, the consumers' subscriptions,
    receives and acks in :class:`~actors.broker.lite.consumers.LiteConsumers`, the
    held reads in :class:`~actors.broker.lite.holds.LiteHolds`."""

    REQUESTS = (
        "send",
        "receive",
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
        raft = role if isinstance(role, DLedgerReplication) else None
        # in a Raft group only committed records are indexed: a divergent tail cut off
        # by a new leader was never in the lite index
        committed = (lambda: raft.readable_end) if raft is not None else None
        self.store = LiteStore(runtime.store, config, committed=committed)
        self.parents = LiteParents(runtime, self.store, admin, raft)  # declared before start
        self.raft = RaftLiteLog(runtime, self.store, raft) if raft is not None else None
        self.holds = LiteHolds(runtime, self._caught_up)
        self.consumers = LiteConsumers(runtime, self.store, self.raft, self.holds, owner_lease_s)
        self.consumers.load(replay=raft is not None)  # in a Raft group the log after the file
        self.store.state_listener = self.consumers.on_state
        self.store.expired_listener = self.consumers.unsubscribe_all
        # a slave indexes the lite records its master's bytes bring; every Raft member
        # indexes the records the group committed
        self.store.start(following=lambda: raft is not None or not role.is_master)
        self.consumers.start_saving()
        if self.raft is not None:
            self.parents.caught_up = self.consumers.lead
            self.raft.start_expiring()

    async def _caught_up(self) -> None:
        if self.raft is not None:
            await self.consumers.lead()

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
        owners = self.consumers.owners(parent, lite_topic)
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
            await self.consumers.lead()
            if not await self.rt.run(self.store.exists, parent, lite_topic):
                return False
            await self.raft.change({"op": "delete", "parent": parent, "lite": lite_topic})
            return True
        deleted = await self.rt.run(self.store.delete, parent, lite_topic)
        self.consumers.unsubscribe_all(parent, [lite_topic])
        return deleted

    # ------------------------------------------------------------ send
    async def send(
        self, parent: str, items: Sequence[tuple[str, bytes] | tuple[str, bytes, dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """Store messages to lite topics of ``parent``: ``(lite topic, body)`` or ``(lite
        topic, body, {"tags", "keys", "properties"})`` each. Per message: its lite topic,
        offset in it and message id."""
        self._check_writable()
        messages = _messages(parent, items)
        if self.raft is not None:
            return await self._send_through_log(self.raft, parent, messages)
        result = await self.rt.run(self._put, parent, messages)
        self.holds.wake(parent, {lite for lite, _ in messages})
        return _answer(messages, result, (await self._replicated(result)).value)

    def send_now(
        self, parent: str, items: Sequence[Any]
    ) -> tuple[list[dict[str, Any]], bool] | None:
        """:meth:`send` done at once when nothing in it would wait: an ASYNC_FLUSH master
        whose role waits for nobody (no SYNC_MASTER's slave, no Raft log) and whose lite
        store would not wait now (``LiteStore.put_waits``: its lock held by an expiry
        slice or a catch-up, or a delete to fsync before the next creation). The
        broker's socket answers it from its reader's callback
        (``actors.broker.listener``), as it does a normal send: the same checks, put,
        wake-ups and answer, without a task, a chain of coroutines and a thread hop per
        request. Returns the answer and whether the send woke held reads (to be let
        answer first), or None: the general path's case (:meth:`send`, which also
        raises what a broker that takes no writes now answers). Errors raise as
        :meth:`send`'s do, nothing stored."""
        rt = self.rt
        # a Raft group's role puts nothing at once: its sends are proposals
        if not rt.puts_now(self.role) or self.store.put_waits():
            return None
        messages = _messages(parent, items)
        woken = rt.holds.woken
        result = self._put(parent, messages)
        self.holds.wake(parent, {lite for lite, _ in messages})
        return _answer(messages, result, _stored(result).value), rt.holds.woken != woken

    def _put(self, parent: str, messages: list[tuple[str, Message]]) -> LitePutResult:
        """The store's put of ``messages``: a single one on its own path (the same checks
        and bytes as a batch of one, without the batch's lists)."""
        if len(messages) == 1:
            lite, message = messages[0]
            return self.store.put(parent, lite, message)
        return self.store.put_batch(parent, messages)

    async def _send_through_log(
        self, raft: RaftLiteLog, parent: str, messages: list[tuple[str, Message]]
    ) -> list[dict[str, Any]]:
        """A Raft leader's lite send, answered once committed and indexed."""
        lites, offsets, msg_ids, status = await raft.send(parent, messages)
        self.holds.wake(parent, {lite for lite, _ in messages})
        return [
            {"lite_topic": lite, "offset": off, "msg_id": mid, "status": status.value}
            for lite, off, mid in zip(lites, offsets, msg_ids)
        ]

    async def _replicated(self, result: LitePutResult) -> PutStatus:
        """A stored batch's status once it is where a normal send's would be before its
        answer: durable under SYNC_FLUSH, on the slave too from a SYNC_MASTER."""
        status = _stored(result)
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
            names = await self.consumers.peek(group, parent, client_id, wait_ms)
            return [
                {"lite_topic": n, "offset": -1, "messages": [], "next_offset": -1} for n in names
            ]
        got = await self.consumers.receive(
            group, parent, client_id, max_count, self.store.get, wait_ms
        )
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
            names = await self.consumers.peek(group, parent, client_id, wait_ms)
            return [[n, -1, 0, -1] for n in names], []
        got = await self.consumers.receive(
            group, parent, client_id, max_count, self.store.get_raw, wait_ms
        )
        heads = [[name, start, r.count, r.next_offset] for name, start, r in got]
        return heads, [r.data for _, _, r in got]

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
            if self.rt.config.inline_reads and not self.store.busy():
                return read(parent, lite_topic, offset, max_count)  # as a normal pull
            return await self.rt.run(read, parent, lite_topic, offset, max_count)

        return await self.holds.held(parent, [lite_topic], wait_ms, once)

    async def committed_offset(self, group: str, parent: str, lite_topic: str) -> int:
        validate_group(group)
        await self._caught_up()
        return await self.rt.run(self.store.committed_offset, group, parent, lite_topic)

    async def stats(self) -> dict[str, int]:
        """The lite store's counts, the saves of the subscription tables since start
        (``subscription_saves``) and whether a change of them is not saved yet
        (``subscriptions_unsaved``, 0 or 1); in a Raft group also the consumer state
        changes proposed (``state_changes``) and the log entries they took
        (``state_rounds``)."""
        out = {
            **self.store.stats(),
            "subscription_saves": self.consumers.saves,
            "subscriptions_unsaved": int(self.consumers.unsaved),
        }
        if self.raft is not None:
            out = {**out, "state_rounds": self.raft.rounds, "state_changes": self.raft.changes}
        return out

    def persist(self) -> None:
        """The subscription tables and the lite store (its groups' committed offsets,
        names and index) on disk now: what a clean stop saves, without stopping."""
        self.consumers.save()
        self.store.flush()

    def close(self) -> None:
        self.consumers.close()
        if self.raft is not None:
            self.raft.close()
        self.parents.close()
        self.store.close()


_OPTIONS = frozenset({"tags", "keys", "properties"})
_NO_OPTIONS: dict[str, Any] = {}


def _messages(parent: str, items: Sequence[Any]) -> list[tuple[str, Message]]:
    """A lite send's items checked, each as (its lite topic, its message to ``parent``)."""
    messages = []
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
            raise InvalidMessageError(
                "a lite send item is (lite topic, body) or (lite topic, body, options)"
            )
        opts = item[2] if len(item) == 3 else _NO_OPTIONS
        if not isinstance(opts, dict) or not _OPTIONS.issuperset(opts):
            raise InvalidMessageError(f"lite send options {opts!r}: tags, keys, properties")
        message = Message(
            parent, item[1], opts.get("tags"), opts.get("keys", ()), opts.get("properties")
        )
        messages.append((item[0], message))
    return messages


def _stored(result: LitePutResult) -> PutStatus:
    """A stored batch's status before any replication: FLUSH_DISK_TIMEOUT when SYNC_FLUSH
    did not reach it in time."""
    return PutStatus.PUT_OK if result.flushed else PutStatus.FLUSH_DISK_TIMEOUT


def _answer(
    messages: list[tuple[str, Message]], result: LitePutResult, status: str
) -> list[dict[str, Any]]:
    """Per message: its lite topic, offset in it, message id and the send's status."""
    return [
        {"lite_topic": lite, "offset": off, "msg_id": mid, "status": status}
        for (lite, _), off, mid in zip(messages, result.lite_offsets.tolist(), result.msg_ids)
    ]
