"""An :class:`~actors.aio.consumer.AsyncConsumer`'s side of a coordinated group, on
its event loop: the synchronous push consumer's protocol
(``actors.client.push.coordinated``) with awaited calls.

A task of the loop keeps one long poll (``GroupCoordinator.poll``) outstanding; it
doubles as the heartbeat. Each answer is this consumer's view, applied in order:

1. queues to revoke: no message of theirs is handed out any more, the ones handed
   out get up to half the revoke timeout to finish, the offsets are committed with
   their fencing tokens and the coordinator is told (``confirm``), so the next owner
   starts where this one stopped (and an orderly queue is never consumed by two
   owners at once);
2. queues held that the view no longer lists, or lists under another token, were
   fenced (this consumer was taken for dead, or the group's offsets were reset):
   dropped without a commit, which the broker would refuse anyway; a queue still
   ours under its new token starts again from the committed offset;
3. new queues start at the group's committed offset; every commit of theirs carries
   their token.

At close the consumer commits every queue and leaves naming the queues committed,
which the coordinator hands on at once. If the coordinator dies, the consumer gives
every queue up (committing what it can) and joins the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

from actors.aio.connection import within
from actors.client.push.coordinated import ViewFollower, coordinator_gone
from actors.coordinator.host import coordinator_for
from actors.coordinator.state import MemberView
from actors.protocol import rpc
from actors.protocol.fencing import FencingToken
from rebalance import MessageQueue

log = logging.getLogger("raymq.actors.aio.coordinated")

CALL_TIMEOUT_S = 10.0
JOIN_TIMEOUT_S = 30.0
RETRY_S = 0.5


class CoordinatedGroup(ViewFollower):
    """Takes and gives up an AsyncConsumer's queues as its group's coordinator says."""

    def __init__(self, consumer: Any, config: Any = None) -> None:
        self.c = consumer  # the AsyncConsumer (its queues, commits and fetchers)
        self.config = config
        self.tokens: dict[MessageQueue, FencingToken] = {}  # queues held, with their token
        self.generation = -1
        self._unstarted: dict[MessageQueue, FencingToken] = {}
        self._coordinator: Any = None
        self._joined = False
        self._version = -1
        self._revoke_timeout_s = 10.0

    # ------------------------------------------------------------ the coordinator
    async def _handle(self) -> Any:
        if self._coordinator is None:
            c = self.c
            self._coordinator = await asyncio.to_thread(
                coordinator_for,
                c.group,
                c.namespace,
                nameservers=c.ns.nameservers,
                config=self.config,
            )
        return self._coordinator

    async def join(self) -> None:
        """Join the group and take the first share of its queues."""
        c = self.c
        handle = await self._handle()
        view: MemberView = await within(
            handle.join.remote(
                c.client_id,
                c.topics,
                session_timeout_s=c.session_timeout_s,
                strategy=c.strategy,
            ),
            JOIN_TIMEOUT_S,
        )
        self._joined = True
        self._version = -1
        log.info("group %s: %s joined in generation %d", c.group, c.client_id, view.generation)
        await self._apply(view)

    async def follow(self) -> None:
        """Poll the coordinator and apply its views until cancelled."""
        c = self.c
        while not c.closed:
            try:
                if not self._joined:
                    await self.join()
                else:
                    timeout = min(c.heartbeat_interval_s, c.session_timeout_s / 3)
                    handle = await self._handle()
                    view = await within(
                        handle.poll.remote(c.client_id, self._version, timeout),
                        timeout + CALL_TIMEOUT_S,
                    )
                    await self._apply(view)
                if self._unstarted:
                    await self._start_unstarted()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the task must survive
                await self._failed(rpc.cause_of(exc))
                await asyncio.sleep(RETRY_S)

    async def _failed(self, exc: BaseException) -> None:
        if coordinator_gone(self.c.group, exc):
            await self._give_up_all()
            self._coordinator = None
            self._joined = False

    async def leave(self) -> None:
        """Commit every queue (the consumer is closed: nothing more is handed out) and
        leave, naming the queues committed so the coordinator hands them on at once."""
        if not self._joined:
            return
        c = self.c
        held = list(c._queues.values())
        failed = await c.offsets.commit([(q, q.commit_offset()) for q in held])
        released = sorted(
            {q.mq for q in held if q.mq.broker_name not in failed} | set(self._unstarted)
        )
        self.tokens.clear()
        self._unstarted.clear()
        try:
            handle = await self._handle()
            await within(handle.leave.remote(c.client_id, released), CALL_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the coordinator fences us instead
            log.warning("group %s: leaving the coordinator failed: %s", c.group, exc)
        self._joined = False

    # ------------------------------------------------------------ applying a view
    async def _apply(self, view: MemberView | None) -> None:
        while view is not None and not self.c.closed:
            view = await self._apply_once(view)

    async def _apply_once(self, view: MemberView) -> MemberView | None:
        """Apply ``view``; return a newer one to apply next (the answer to a confirm)."""
        c = self.c
        if self._dropped(view):
            await self._give_up_all()
            self._joined = False
            return None
        if view.revoke:
            follow = await self._revoke(view.revoke)
            if follow is not None:
                return follow
        for mq in list(c._queues):
            if mq not in view.revoke and view.owned.get(mq) != self.tokens.get(mq):
                self._abandon(mq)
        for mq in [mq for mq in self._unstarted if mq not in view.owned]:
            del self._unstarted[mq]
        new = {mq: tok for mq, tok in view.owned.items() if mq not in c._queues}
        if new:
            self._unstarted.update(new)
            await self._start_unstarted()
        return None

    async def _stop(self, mqs: Iterable[MessageQueue]) -> list[Any]:
        """Hand out nothing more of ``mqs``, wait (bounded) for what was handed out,
        then drop them; return them (their tokens stay until committed)."""
        c = self.c
        qs = [c._queues[mq] for mq in mqs if mq in c._queues]
        for q in qs:
            q.revoking = True
        loop = asyncio.get_running_loop()
        bound = min(self._revoke_timeout_s, c.session_timeout_s) / 2
        deadline = loop.time() + bound
        while any(q.handed_out() for q in qs) and loop.time() < deadline:
            c._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await within(c._changed.wait(), min(0.05, deadline - loop.time()))
        for q in qs:
            if q.handed_out():
                log.warning(
                    "group %s: a message of %s handed out outlived %.1fs: handing it over anyway",
                    c.group,
                    q.mq,
                    bound,
                )
            c._queues.pop(q.mq, None)
            q.dropped = True
            self._unstarted.pop(q.mq, None)
        return qs

    async def _revoke(self, revoke: dict[MessageQueue, FencingToken]) -> MemberView | None:
        c = self.c
        qs = await self._stop(revoke)
        failed = await c.offsets.commit([(q, q.commit_offset()) for q in qs])
        for q in qs:
            self.tokens.pop(q.mq, None)
        if failed:
            log.warning(
                "group %s: revoked queues of %s not committed: their next owner re-reads a little",
                c.group,
                sorted(failed),
            )
        log.info("group %s: %s gave up %s", c.group, c.client_id, sorted(revoke))
        try:
            handle = await self._handle()
            view: MemberView = await within(
                handle.confirm.remote(c.client_id, list(revoke)), CALL_TIMEOUT_S
            )
            return view
        except Exception as exc:  # noqa: BLE001 - the coordinator fences us after its timeout
            log.warning("group %s: confirming a revoke failed: %s", c.group, exc)
            return None

    def _abandon(self, mq: MessageQueue) -> None:
        """A queue fenced off, or given again under a new token: dropped without a commit."""
        c = self.c
        q = c._queues.pop(mq, None)
        self.tokens.pop(mq, None)
        if q is not None:
            q.dropped = True
        log.warning(
            "group %s: %s dropped %s without a commit (fenced, or its offset was reset)",
            c.group,
            c.client_id,
            mq,
        )

    async def _give_up_all(self) -> None:
        """Drop every queue, committing what was finished (refused where fenced)."""
        c = self.c
        qs = await self._stop(list(c._queues))
        await c.offsets.commit([(q, q.commit_offset()) for q in qs])
        for q in qs:
            self.tokens.pop(q.mq, None)
        self._unstarted.clear()

    async def _start_unstarted(self) -> None:
        """Start the queues given to us, at the group's committed offsets."""
        c = self.c
        started = []
        for mq, token in sorted(self._unstarted.items()):
            try:
                offset = await c.offsets.start(mq, token)
            except Exception as exc:  # noqa: BLE001 - tried again after the next poll
                log.warning("group %s: cannot start %s yet: %s", c.group, mq, exc)
                continue
            if self._unstarted.get(mq) != token:  # revoked or fenced meanwhile
                continue
            del self._unstarted[mq]
            self.tokens[mq] = token
            c._add_queue(mq, offset)
            started.append(mq)
        if started:
            c._start_fetchers()
            log.info(
                "group %s: %s took %s (generation %d)",
                c.group,
                c.client_id,
                sorted(started),
                self.generation,
            )
