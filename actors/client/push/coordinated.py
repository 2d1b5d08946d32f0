"""A push consumer's side of a coordinated group (``PushConsumerConfig.coordinated``).

One thread keeps one long poll (``GroupCoordinator.poll``) outstanding; it
doubles as the heartbeat. Each answer is this consumer's view, applied in
this order:

1. queues to revoke: each is dropped (no new pull, no new batch), the batch in
   flight gets up to half the revoke timeout to finish (then it is abandoned),
   the offsets are committed synchronously with their fencing tokens and the
   coordinator is told (``confirm``), so the next owner starts where this one
   stopped;
2. queues held that the view no longer lists were fenced (this consumer was
   too slow or taken for dead): dropped without a commit, which the broker
   would refuse anyway;
3. new queues start at the group's committed offset (read for all of them at
   once) and are pulled at once; every commit of theirs carries their token.

At shutdown (:meth:`CoordinatedRebalanceService.leave`) consumption has
stopped; the consumer commits every queue and leaves in one call naming the
queues it committed, which the coordinator hands on at once: a graceful leave
redelivers nothing. If the coordinator dies, the consumer gives every queue up
(committing what it can) and joins the new one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from ray.exceptions import ActorDiedError

from actors.client.push.context import CoordinatedContext
from actors.client.push.offset_store import RemoteBrokerOffsetStore
from actors.client.push.process_queue import ProcessQueue
from actors.client.push.rebalance import RebalanceService, queue_name, rebalanced
from actors.coordinator.host import coordinator_for
from actors.coordinator.state import MemberView
from actors.protocol import rpc as _rpc
from actors.protocol.fencing import FencingToken
from actors.protocol.topic import is_retry_topic
from rebalance import MessageQueue
from storage.errors import RayMQError

log = logging.getLogger("raymq.actors.coordinator")

CALL_TIMEOUT_S = 10.0
JOIN_TIMEOUT_S = 30.0
RETRY_S = 0.5


def coordinator_gone(group: str, exc: BaseException) -> bool:
    """Whether a failed call to ``group``'s coordinator means it is gone (Ray reports its
    actor dead): the member then gives every queue up and joins the next one. Either
    way the failure is logged."""
    if isinstance(exc, ActorDiedError):
        log.warning(
            "group %s: the coordinator is gone (%s): giving every queue up, joining again",
            group,
            type(exc).__name__,
        )
        return True
    log.warning("group %s: coordinator call failed: %s: %s", group, type(exc).__name__, exc)
    return False


class ViewFollower:
    """What a coordinated member (threaded or asyncio) keeps of its coordinator's views:
    the generation, the revoke timeout and the version of the latest one."""

    c: Any  # the consumer: its group and client id
    generation: int
    _joined: bool
    _revoke_timeout_s: float
    _version: int

    def _dropped(self, view: MemberView) -> bool:
        """Whether ``view`` no longer counts this member (logged if it had joined: it is
        to give every queue up and join again); else the view's generation, revoke
        timeout and version are taken."""
        if not view.member:
            if self._joined:
                log.warning(
                    "group %s: the coordinator dropped %s: joining again",
                    self.c.group,
                    self.c.client_id,
                )
            return True
        self.generation = view.generation
        self._revoke_timeout_s = view.revoke_timeout_s
        self._version = view.version
        return False


class CoordinatedRebalanceService(ViewFollower):
    """Takes and gives up queues as the group's coordinator says."""

    def __init__(self, consumer: CoordinatedContext) -> None:
        self.c = consumer
        self.helper = RebalanceService(consumer)  # where a never-committed queue starts
        self.store: RemoteBrokerOffsetStore = consumer.offset_store  # type: ignore[assignment]
        self.store.use_tokens()
        self.generation = -1
        self._coordinator: Any = None
        self._joined = False
        self._version = -1
        self._revoke_timeout_s = 10.0
        self._held: dict[MessageQueue, FencingToken] = {}  # started, in the consumer's table
        self._unstarted: dict[MessageQueue, FencingToken] = {}  # ours, not started yet
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle
    def rebalance(self) -> bool:
        """The first call joins and takes the first share, then a thread follows the
        coordinator; later calls do nothing (the coordinator pushes changes)."""
        if self._thread is not None:
            return False
        self._apply(self._join())
        self._thread = threading.Thread(
            target=self._loop, name=f"raymq-group-{self.c.group}", daemon=True
        )
        self._thread.start()
        return True

    def stop(self) -> None:
        """Stop following the coordinator (the queues stay as they are)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(CALL_TIMEOUT_S)

    def leave(self) -> None:
        """Commit every queue (consumption has stopped) and leave the group, naming the
        queues committed so the coordinator hands them on at once."""
        self.stop()
        if not self._joined:
            return
        c = self.c
        items = c.table_items()
        tokens = self.store.release(mq for mq, _ in items)
        offsets = {mq: pq.commit_offset() for mq, pq in items if mq in tokens}
        committed = self.store.commit_sync(offsets, tokens) if offsets else set()
        released = sorted(committed | set(self._unstarted))
        self._held.clear()
        self._unstarted.clear()
        try:
            _rpc.get(self._handle().leave.remote(c.client_id, released), CALL_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the coordinator fences us instead
            log.warning("group %s: leaving the coordinator failed: %s", c.group, exc)
        self._joined = False
        log.info(
            "group %s: %s left, %d/%d queue(s) committed",
            c.group,
            c.client_id,
            len(committed),
            len(offsets),
        )

    # ------------------------------------------------------------ talking to the coordinator
    def _handle(self) -> Any:
        if self._coordinator is None:
            c = self.c
            self._coordinator = coordinator_for(
                c.group,
                c.namespace,
                nameservers=c.ns.nameservers,
                config=c.config.coordinator_config,
            )
        return self._coordinator

    def _join(self) -> MemberView:
        c, cfg = self.c, self.c.config
        ref = self._handle().join.remote(
            c.client_id,
            c.topics(),
            session_timeout_s=cfg.session_timeout,
            strategy=cfg.rebalance_strategy,
            strategy_options=dict(cfg.rebalance_options or {}),
            machine_room=cfg.machine_room,
            actor_handle=c.actor_handle,
        )
        view: MemberView = _rpc.get(ref, JOIN_TIMEOUT_S)
        self._joined = True
        self._version = -1
        log.info("group %s: %s joined in generation %d", c.group, c.client_id, view.generation)
        return view

    def _poll(self) -> MemberView | None:
        cfg = self.c.config
        timeout_s = min(cfg.heartbeat_interval_s, cfg.session_timeout / 3)
        self._wake.clear()
        ref = self._handle().poll.remote(self.c.client_id, self._version, timeout_s)
        ref.future().add_done_callback(lambda _: self._wake.set())
        if not self._wake.wait(timeout_s + CALL_TIMEOUT_S):
            raise RayMQError(f"the coordinator did not answer a poll in {timeout_s}s")
        if self._stop.is_set():
            return None
        view: MemberView = _rpc.get(ref, CALL_TIMEOUT_S)
        return view

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                view = self._poll() if self._joined else self._join()
                if view is not None and not self._stop.is_set():
                    self._apply(view)
                if self._unstarted and not self._stop.is_set():
                    self._start_unstarted()
            except Exception as exc:  # noqa: BLE001 - the thread must survive
                if self._stop.is_set():
                    return
                self._failed(_rpc.cause_of(exc))
                self._stop.wait(RETRY_S)

    def _failed(self, exc: BaseException) -> None:
        if coordinator_gone(self.c.group, exc):
            self._give_up_all()
            self._coordinator = None
            self._joined = False

    # ------------------------------------------------------------ applying a view
    def _apply(self, view: MemberView | None) -> None:
        while view is not None and not self._stop.is_set():
            view = self._apply_once(view)

    def _apply_once(self, view: MemberView) -> MemberView | None:
        """Apply ``view``; return a newer one to apply next (the answer to a confirm)."""
        c = self.c
        if self._dropped(view):
            self._give_up_all()
            self._joined = False
            return None
        if view.revoke:
            follow = self._revoke(view.revoke)
            if follow is not None:
                return follow
        for mq, pq in c.table_items():
            if mq not in view.revoke and view.owned.get(mq) != self._held.get(mq):
                self._abandon(pq)
        for mq in [mq for mq in self._unstarted if mq not in view.owned]:
            del self._unstarted[mq]
        held = {mq for mq, _ in c.table_items()}
        new = {mq: tok for mq, tok in view.owned.items() if mq not in held}
        if new:
            self._unstarted.update(new)
            self._start_unstarted()
        return None

    def _stop_queues(
        self, mqs: Iterable[MessageQueue]
    ) -> tuple[list[ProcessQueue], dict[MessageQueue, FencingToken]]:
        """Drop ``mqs`` (no new pull or batch, no background commit) and wait, bounded,
        for their batches in flight; return them and their tokens."""
        c = self.c
        mqs = list(mqs)
        tokens = self.store.release(mqs)
        table = dict(c.table_items())
        pqs = []
        for mq in mqs:
            self._held.pop(mq, None)
            self._unstarted.pop(mq, None)
            pq = table.get(mq)
            if pq is None:
                continue
            with pq.lock:
                pq.dropped = True
                pq.ready.clear()
            c.table_remove(mq)
            pqs.append(pq)
        bound = min(self._revoke_timeout_s, c.config.session_timeout) / 2
        deadline = time.monotonic() + bound
        for pq in pqs:
            if not pq.wait_idle(max(0.0, deadline - time.monotonic())):
                log.warning(
                    "group %s: the batch in flight on %s outlived %.1fs: handing it over anyway",
                    c.group,
                    queue_name(pq.mq),
                    bound,
                )
        return pqs, tokens

    def _revoke(self, revoke: dict[MessageQueue, FencingToken]) -> MemberView | None:
        c = self.c
        pqs, tokens = self._stop_queues(revoke)
        offsets = {pq.mq: pq.commit_offset() for pq in pqs if pq.mq in tokens}
        committed = self.store.commit_sync(offsets, tokens) if offsets else set()
        if len(committed) < len(offsets):
            log.warning(
                "group %s: %d revoked queue(s) not committed: their next owner re-reads a little",
                c.group,
                len(offsets) - len(committed),
            )
        c.stats.add("revoked", len(revoke))
        log.info(
            "group %s: %s gave up %s", c.group, c.client_id, sorted(queue_name(q) for q in revoke)
        )
        try:
            view: MemberView = _rpc.get(
                self._handle().confirm.remote(c.client_id, list(revoke)), CALL_TIMEOUT_S
            )
            return view
        except Exception as exc:  # noqa: BLE001 - the coordinator fences us after its timeout
            log.warning("group %s: confirming a revoke failed: %s", c.group, exc)
            return None

    def _abandon(self, pq: ProcessQueue) -> None:
        """A queue fenced off, or given again under a new token (its offset was reset):
        drop it, commit nothing; a queue still ours starts again from the committed offset."""
        c = self.c
        self.store.release([pq.mq])
        self._held.pop(pq.mq, None)
        with pq.lock:
            pq.dropped = True
            pq.ready.clear()
        c.table_remove(pq.mq)
        c.stats.add("fenced")
        log.warning(
            "group %s: %s dropped %s without a commit (fenced, or its offset was reset)",
            c.group,
            c.client_id,
            queue_name(pq.mq),
        )

    def _give_up_all(self) -> None:
        """Drop every queue, committing what was consumed (refused where fenced)."""
        pqs, tokens = self._stop_queues([mq for mq, _ in self.c.table_items()])
        offsets = {pq.mq: pq.commit_offset() for pq in pqs if pq.mq in tokens}
        if offsets:
            self.store.commit_sync(offsets, tokens)
        self._unstarted.clear()

    def _start_unstarted(self) -> None:
        """Start the queues given to us, at the group's committed offsets."""
        c = self.c
        want = dict(self._unstarted)
        stored = self.store.read_many(want)  # a queue whose broker did not answer waits
        started = []
        for mq in sorted(want):
            if mq not in stored:
                continue
            try:
                offset, was_stored = self.helper.start_offset(mq, stored[mq])
            except Exception as exc:  # noqa: BLE001 - tried again after the next poll
                log.warning("group %s: cannot start %s yet: %s", c.group, queue_name(mq), exc)
                continue
            token = want[mq]
            self.store.grant(mq, token)
            pq = ProcessQueue(mq, offset, retry=is_retry_topic(mq.topic))
            if not was_stored:  # a consumer dying before its first commit must not skip
                self.store.commit({mq: offset}, wait=False)
            c.table_put(mq, pq)
            self._held[mq] = token
            del self._unstarted[mq]
            c.pull.request(pq)
            started.append(mq)
        if started:
            rebalanced(c, "took %s (generation %d)", started, self.generation)
