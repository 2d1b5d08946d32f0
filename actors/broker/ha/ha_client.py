"""HAClient: a slave's replication loop.

The slave asks its master for the CommitLog from its own end
(``Broker.ha_transfer``); the master answers with up to
``ha_transfer_batch_bytes`` as soon as it has any (long polling), and the next
request's offset acknowledges what arrived. The slave appends the bytes at
the same offsets and dispatches them itself, so its ConsumeQueues and index
are its own. When the master says the slave's tail diverges (a deposed master
rejoining), the slave cuts its CommitLog back first.

The offset the master says a SYNC_MASTER acknowledged (``confirmed``) is kept in the
slave's ``haState.json`` too, saved within ``CONFIRMED_SAVE_S`` of each rise, so a slave
restarted behind it (its unflushed tail lost, or the whole group down) still refuses a
promotion that would lose it.

Invariant: the slave's CommitLog is always a prefix of its master's, up to the
consistent point of their epochs (``actors.broker.ha.epochs``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from actors.broker.ha.epochs import HAState
    from actors.broker.runtime import BrokerRuntime
    from storage.store import MessageStore


class SlaveSide(Protocol):
    """What an :class:`HAClient` needs of the slave role that runs it."""

    broker: BrokerRuntime
    store: MessageStore
    state: HAState

    @property
    def registered_id(self) -> int: ...

    async def master_handle(self) -> Any: ...

    async def forget_master(self) -> None: ...


log = logging.getLogger("raymq.actors.ha")

MAX_BACKOFF_S = 0.2
"""Between looks for a master while there is none: a promoted slave is found this fast."""
CONFIRMED_SAVE_S = 1.0
"""A slave saves a risen confirmed offset at most this often (each save is two fsyncs)."""


@dataclass(frozen=True)
class TransferReply:
    """The master's answer to one replication request."""

    master: str
    epoch: int
    epochs: list[tuple[int, int]]
    offset: int
    chunks: list[Any] = field(default_factory=list)  # uint8 arrays, consecutive, one per file
    confirmed: int = 0  # the master's acknowledged SYNC_MASTER offset
    master_end: int = 0
    file_size: int = 0
    truncate_to: int | None = None


class HAClient:
    def __init__(self, repl: SlaveSide) -> None:
        self.repl = repl
        self.broker = repl.broker
        self.store = repl.store
        self.connected = False
        self.last_contact = 0.0
        self.confirmed = repl.state.confirmed  # as saved before a restart
        self.confirmed_saved = repl.state.confirmed
        self._saving: asyncio.Task[None] | None = None
        self.master_end = 0
        self.master: str | None = None
        self.rounds = 0  # answers applied
        self.received = 0  # bytes appended

    async def run(self) -> None:
        try:
            await self._run()
        finally:  # stopped (the broker stops, or it was promoted): the last rise saved too
            if self._saving is not None:
                self._saving.cancel()
            self._save_now()

    def _save_now(self) -> None:
        state = self.repl.state
        if self.confirmed > state.confirmed:
            state.confirmed, state.confirmed_epoch = self.confirmed, state.epoch
            state.save()
            self.confirmed_saved = self.confirmed

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            handle = await self.repl.master_handle()
            if handle is None:
                self.connected = False
                await asyncio.sleep(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
                continue
            try:
                await self._replicate(handle)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - master gone, restarting or deposed
                if self.connected:
                    log.warning(
                        "%s: replication from %s stopped: %s",
                        self.broker.config.actor_name,
                        self.master,
                        type(exc).__name__,
                    )
                self.connected = False
                await self.repl.forget_master()
                await asyncio.sleep(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
                continue

    def _fetch(self, handle: Any, offset: int, max_bytes: int, wait_s: float) -> Any:
        """Ask for bytes from ``offset``, acknowledging the CommitLog's end (all appended)."""
        cfg = self.broker.config
        return handle.ha_transfer.remote(
            cfg.actor_name,
            self.repl.registered_id,
            offset,
            self.repl.state.epochs,
            max_bytes,
            wait_s,
            self.store.commitlog.max_offset,
        )

    async def _replicate(self, handle: Any) -> None:
        """Pipelined: the next request is on its way while an answer is being appended, and
        an acknowledgement (a request for no bytes) follows each append at once."""
        cfg = self.broker.config
        # a master answers a fetch within ha_poll_s; one that does not within
        # ha_slave_timeout_s more is gone, also while Ray holds the call for its restart
        # (its node lost, the actor waiting for a node with its disk)
        silent_s = cfg.ha_poll_s + cfg.ha_slave_timeout_s
        pending = self._fetch(handle, self.store.commitlog.max_offset, 0, 0.0)
        while True:
            reply: TransferReply = await asyncio.wait_for(pending, silent_s)
            if reply.truncate_to is not None or reply.offset != self.store.commitlog.max_offset:
                await self._apply(reply)  # cut, or a stale answer: start again from the end
                end = self.store.commitlog.max_offset
                pending = self._fetch(handle, end, cfg.ha_transfer_batch_bytes, cfg.ha_poll_s)
                continue
            upto = reply.offset + sum(len(c) for c in reply.chunks)
            pending = self._fetch(handle, upto, cfg.ha_transfer_batch_bytes, cfg.ha_poll_s)
            await self._apply(reply)
            if reply.chunks:
                self._fetch(handle, upto, 0, 0.0)  # the acknowledgement: no answer awaited
                await self.broker.run(self.store.dispatch_replicated)  # entries after the ack

    async def _apply(self, reply: TransferReply) -> None:
        store = self.store
        run = self.broker.run
        if reply.file_size != store.config.commitlog_file_size:
            raise ValueError(
                f"master {reply.master} has commitlog_file_size={reply.file_size}, this slave "
                f"{store.config.commitlog_file_size}: they must be equal"
            )
        if not self.connected:
            log.info(
                "%s: replicating from %s at offset %d (master at %d)",
                self.broker.config.actor_name,
                reply.master,
                store.commitlog.max_offset,
                reply.master_end,
            )
        self.connected = True
        self.master = reply.master
        self.last_contact = asyncio.get_running_loop().time()
        self.master_end = reply.master_end
        if reply.confirmed > self.confirmed:
            self.confirmed = reply.confirmed
            if self._saving is None or self._saving.done():
                self._saving = asyncio.get_running_loop().create_task(self._save_confirmed())
        if reply.truncate_to is not None:
            log.warning(
                "%s: cutting the commitlog from %d back to %d, where it diverges from %s",
                self.broker.config.actor_name,
                store.commitlog.max_offset,
                reply.truncate_to,
                reply.master,
            )
            await run(store.truncate_commitlog, reply.truncate_to)
            self.repl.state.truncated(reply.truncate_to)
            self.confirmed = min(self.confirmed, reply.truncate_to)
            self.confirmed_saved = min(self.confirmed_saved, reply.truncate_to)
            return
        if reply.offset != store.commitlog.max_offset:
            return  # an answer to a request from before a truncation
        offset = reply.offset
        append = functools.partial(store.append_commitlog, dispatch=False)  # acked, then indexed
        for chunk in reply.chunks:
            offset = await run(append, offset, memoryview(chunk))
        self.rounds += 1
        self.received += offset - reply.offset
        self.repl.state.adopt(reply.epochs, offset)

    async def _save_confirmed(self) -> None:
        """Save the confirmed offset in ``haState.json``, then again while it rose
        meanwhile, at most once per ``CONFIRMED_SAVE_S``."""
        state = self.repl.state
        while self.confirmed > self.confirmed_saved:
            value = self.confirmed
            if value > state.confirmed:
                state.confirmed, state.confirmed_epoch = value, state.epoch
                await self.broker.run(state.save)
            self.confirmed_saved = value
            await asyncio.sleep(CONFIRMED_SAVE_S)
