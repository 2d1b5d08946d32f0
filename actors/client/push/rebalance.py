"""Which queues a push consumer owns (RocketMQ's client-side ``RebalanceImpl``).

CLUSTERING groups are coordinated by default: their consumers take queues from
the group's ``GroupCoordinator`` (``actors.client.push.coordinated``). This module is
the uncoordinated way, kept for ``coordinated=False`` and BROADCASTING.

CLUSTERING, uncoordinated: every consumer of the group reads the group's member list from the
same broker (the first live master, by name, holding the topic) and runs the
group's ``rebalance_strategy`` over the same sorted queues and ids, so the shares
are disjoint and cover every queue once the members agree. The strategy is built
as a coordinator builds it (``actors.coordinator.strategies``): the members' machine
rooms come from their client ids, and under 'config' each consumer takes the queues
it lists. BROADCASTING: every consumer owns every queue. The group's consumers
subscribe to ``%RETRY%<group>`` too, which is rebalanced the same way.

A queue given up is committed first, so its next owner starts where this one
stopped; a queue taken starts at the group's committed offset, or else where
``consume_from`` says (retry queues always from their first message), and
that starting point is committed at once so a consumer dying before its first
commit cannot make the group skip messages.

Offset resets (CLUSTERING). A queue is taken under the fence its broker holds for it
(read before its offset) and every commit carries that token. A reset raises the
fence with the new offsets in one step, so commits from before it are refused; each
round (and at once after a refused commit) the consumer reads the fences of its
brokers, drops every queue fenced above its token without committing it, and takes
it again from the reset offset.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from actors.client.push.config import ConsumeFromWhere
from actors.client.push.context import ConsumerContext, RebalanceContext
from actors.client.push.offset_store import RemoteBrokerOffsetStore
from actors.client.push.process_queue import ProcessQueue
from actors.coordinator.fencing import readable_queues
from actors.coordinator.strategies import (
    DEFAULT_ROOM,
    MACHINE_ROOM_STRATEGIES,
    StrategySpec,
    build_strategy,
    client_id_room,
    config_shares,
    configured_queues,
    warn_roomless,
)
from actors.protocol import rpc as _rpc
from actors.protocol.fencing import FencingToken, check_token
from actors.protocol.topic import is_retry_topic
from rebalance import MessageQueue
from storage.errors import TopicNotFoundError

log = logging.getLogger("raymq.actors.push_consumer")

CALL_TIMEOUT_S = 10.0
DEFAULT_TIMESTAMP_AGO_S = 1800.0  # RocketMQ's consumeTimestamp default: half an hour ago
NO_FENCE: FencingToken = (0, 0)


def queue_name(mq: MessageQueue) -> str:
    """``topic:broker:queue``, as logs name a queue."""
    return f"{mq.topic}:{mq.broker_name}:{mq.queue_id}"


def rebalanced(c: ConsumerContext, what: str, queues: Iterable[MessageQueue], *args: Any) -> None:
    """A rebalance changed the consumer's queues: counted, and logged as ``group g: <client
    id> <what>``, ``what``'s first ``%s`` the names of ``queues``, then ``args``."""
    c.stats.add("rebalances")
    names = sorted(queue_name(q) for q in queues)
    log.info("group %s: %s " + what, c.group, c.client_id, names, *args)


class RebalanceService:
    """Each consumer on its own (``coordinated=False``, and BROADCASTING)."""

    def __init__(self, consumer: RebalanceContext) -> None:
        self.c = consumer
        cfg = consumer.config
        self.spec = StrategySpec(cfg.rebalance_strategy, dict(cfg.rebalance_options or {}))
        self._listed = configured_queues(self.spec) if self.spec.name == "config" else frozenset()
        self._missing_warned: set[str] = set()
        self._warned_rooms: set[str] = set()  # members and brokers named without a room

    def stop(self) -> None:
        """Nothing runs in the background here: the consumer's service loop drives it."""

    def leave(self) -> None:
        """Nothing to tell: the brokers' member lists drop this consumer."""

    # ------------------------------------------------------------ inputs
    def readable_queues(self, topic: str) -> list[MessageQueue]:
        return readable_queues(self.c.ns.require_route(topic, refresh=True))

    def consumer_ids(self) -> list[str]:
        """The group's members as the first live broker of the main topic lists them."""
        c = self.c
        route = c.ns.require_route(c.topic)
        names = sorted(
            {bd.broker_name for bd in route.broker_datas if bd.master_actor_name()}
            & {qd.broker_name for qd in route.queue_datas}
        )
        last: BaseException | None = None
        for name in names:
            try:
                handle = c.ns.broker(route, name)
                return list(_rpc.get(handle.consumer_list.remote(c.group), CALL_TIMEOUT_S))
            except Exception as exc:  # noqa: BLE001 - ask the next broker
                last = exc
        if last is not None:
            log.warning("group %s: no broker listed the consumers: %s", c.group, last)
        return []

    def _fenced_store(self) -> RemoteBrokerOffsetStore | None:
        """The offset store when queues are taken under their brokers' fences."""
        store = self.c.offset_store
        if self.c.config.clustering and isinstance(store, RemoteBrokerOffsetStore):
            return store
        return None

    def fences(self, mqs: Iterable[MessageQueue]) -> dict[MessageQueue, FencingToken]:
        """The group's fences on the brokers of ``mqs``, asked in parallel (a broker that
        does not answer is left out)."""
        c = self.c
        by_broker = {mq.broker_name: mq for mq in mqs}
        refs = {}
        for name, mq in by_broker.items():
            try:
                refs[name] = c.broker_for(mq).offset_fences.remote(c.group)
            except Exception as exc:  # noqa: BLE001 - asked again next round
                log.warning("group %s: cannot read the fences on %s: %s", c.group, name, exc)
        out = {}
        for name, ref in refs.items():
            try:
                table = _rpc.get(ref, CALL_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001
                log.warning("group %s: cannot read the fences on %s: %s", c.group, name, exc)
                continue
            for (t, q), tok in table.items():
                out[MessageQueue(t, name, q)] = check_token(tok, f"fence of {t}:{name}:{q}")
        return out

    def share(self, topic: str, queues: list[MessageQueue], cids: list[str]) -> set[MessageQueue]:
        """This consumer's queues of ``topic`` under the group's strategy."""
        c = self.c
        if self.spec.name == "config":
            listed = {cid: self._listed if cid == c.client_id else frozenset() for cid in cids}
            return set(config_shares(c.group, topic, queues, listed)[c.client_id])
        rooms: dict[str, str | None] = {}
        if self.spec.name in MACHINE_ROOM_STRATEGIES:
            for cid in cids:
                rooms[cid] = client_id_room(cid)
                if rooms[cid] is None and cid not in self._warned_rooms:
                    self._warned_rooms.add(cid)
                    log.warning(
                        "group %s: member %s names no machine room: counted in room %s",
                        c.group,
                        cid,
                        DEFAULT_ROOM,
                    )
                rooms[cid] = rooms[cid] or DEFAULT_ROOM
            warn_roomless(c.group, self.spec.name, queues, self._warned_rooms)
        strategy = build_strategy(self.spec, rooms)
        return set(strategy.allocate(c.group, c.client_id, queues, cids))

    # ------------------------------------------------------------ one round
    def rebalance(self) -> bool:
        """Recompute this consumer's queues; True when the assignment changed."""
        c = self.c
        cids: list[str] = []
        if c.config.clustering:
            cids = self.consumer_ids()
            if c.client_id not in cids:
                # our heartbeat has not reached the broker yet (or it restarted): keep
                # what we own and tell it we are here
                c.heartbeat()
                return False
        changed = self.restart_reset()
        for topic in c.topics():
            try:
                queues = self.readable_queues(topic)
            except TopicNotFoundError:
                if not is_retry_topic(topic) and topic not in self._missing_warned:
                    self._missing_warned.add(topic)
                    log.warning("group %s: topic %s has no route yet", c.group, topic)
                queues = []
            if c.config.clustering and queues:
                mine = self.share(topic, queues, cids)
            else:
                mine = set(queues)
            changed |= self._apply(topic, mine)
        if changed:
            rebalanced(c, "owns %s", c.assigned_queues())
        return changed

    def restart_reset(self) -> bool:
        """Drop, without committing, every queue whose fence rose above the token it was
        taken under (the group's offsets were reset): this round takes it again from
        the reset offset. True when any was dropped."""
        c, store = self.c, self._fenced_store()
        if store is None:
            return False
        held = c.table_items()
        fences = self.fences(mq for mq, _ in held)
        dropped = False
        for mq, pq in held:
            token = store.token(mq)
            fence = fences.get(mq)
            if token is not None and fence is not None and fence > token:
                store.release([mq])
                with pq.lock:
                    pq.dropped = True
                    pq.ready.clear()
                c.table_remove(mq)
                c.stats.add("reset")
                log.info(
                    "group %s: offset of %s reset (fence %s above %s): starting it again",
                    c.group,
                    mq,
                    fence,
                    token,
                )
                dropped = True
        return dropped

    def _apply(self, topic: str, mine: set[MessageQueue]) -> bool:
        c, store = self.c, self._fenced_store()
        current = {mq: pq for mq, pq in c.table_items() if mq.topic == topic}
        changed = False
        for mq, pq in current.items():
            if mq not in mine:
                self.drop(pq)
                changed = True
        new = sorted(mine - current.keys())
        # fences before offsets: a reset between the two reads leaves an old token with
        # the new offset (commits refused, the queue taken again), never the reverse
        fences = self.fences(new) if store is not None and new else {}
        for mq in new:
            try:
                offset, stored = self.start_offset(mq)
            except Exception as exc:  # noqa: BLE001 - taken on a later round
                log.warning("group %s: cannot start %s yet: %s", c.group, mq, exc)
                continue
            if store is not None:
                store.grant(mq, fences.get(mq, NO_FENCE))
            pq = ProcessQueue(mq, offset, retry=is_retry_topic(mq.topic))
            if not stored:
                try:
                    c.offset_store.commit({mq: offset}, wait=False)
                except Exception as exc:  # noqa: BLE001 - committed again next round
                    log.warning("group %s: committing the start of %s failed: %s", c.group, mq, exc)
            c.table_put(mq, pq)
            c.pull.request(pq)
            changed = True
        return changed

    def drop(self, pq: ProcessQueue) -> None:
        """Stop consuming ``pq``: nothing more is dispatched, its offset is committed."""
        c = self.c
        offset = pq.commit_offset()
        with pq.lock:
            pq.dropped = True
            pq.ready.clear()
        c.table_remove(pq.mq)
        try:  # not waited for: a dead broker must not stall heartbeats
            c.offset_store.commit({pq.mq: offset}, wait=False)
        except Exception as exc:  # noqa: BLE001 - the next owner re-reads a little more
            log.warning("group %s: committing %s on release failed: %s", c.group, pq.mq, exc)
        store = self._fenced_store()
        if store is not None:
            store.release([pq.mq])  # after the commit: it was sent with the queue's token

    def start_offset(self, mq: MessageQueue, stored: int | None = None) -> tuple[int, bool]:
        """Where to start ``mq``, and whether that was the stored offset (``stored``:
        the group's committed offset when the caller read it already)."""
        c = self.c
        if stored is None:
            stored = c.offset_store.read(mq)
        if stored >= 0:
            return stored, True
        where = c.config.consume_from
        handle = c.broker_for(mq)
        if is_retry_topic(mq.topic) or where is ConsumeFromWhere.FIRST:
            low, _ = _rpc.get(handle.min_max_offset.remote(mq.topic, mq.queue_id), CALL_TIMEOUT_S)
            return int(low), False
        if where is ConsumeFromWhere.LAST:
            _, high = _rpc.get(handle.min_max_offset.remote(mq.topic, mq.queue_id), CALL_TIMEOUT_S)
            return int(high), False
        ts = c.config.consume_timestamp
        if ts is None:
            ts = time.time() - DEFAULT_TIMESTAMP_AGO_S
        ref = handle.offset_by_time.remote(mq.topic, mq.queue_id, int(ts * 1000))
        return int(_rpc.get(ref, CALL_TIMEOUT_S)), False
