"""HAService: the master's side of master/slave replication (RocketMQ's HAService and
GroupTransferService).

Each slave long-polls :meth:`HAService.transfer` for the CommitLog from where it
is, and every request also acknowledges how far the slave's CommitLog reaches.
A SYNC_MASTER put waits in :meth:`HAService.wait_for_slave` until some slave
acknowledged its end; a single round trip of a slave releases every put it
covers, so many concurrent puts share one replication round.

Invariants: an acknowledgement counts only after the slave's epochs were
checked against the master's (a slave whose tail diverges is told where to cut
it instead, and acknowledges nothing); a slave whose log holds a newer epoch than
the master's is never told to cut it: a newer master was promoted, and this one
becomes a slave (:meth:`MasterSide.newer_epoch`); a waiting put is released only by an
acknowledgement at or past its end, or answered FLUSH_SLAVE_TIMEOUT /
SLAVE_NOT_AVAILABLE, never PUT_OK otherwise.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from actors.broker.ha.epochs import consistent_point
from actors.broker.ha.ha_client import TransferReply
from storage.errors import BrokerUnavailableError
from storage.message import PutStatus

if TYPE_CHECKING:
    from actors.broker.ha.epochs import HAState
    from actors.config.broker import BrokerConfig
    from storage.store import MessageStore


class MasterSide(Protocol):
    """What the :class:`HAService` needs of the master role that runs it."""

    config: BrokerConfig
    store: MessageStore
    loop: asyncio.AbstractEventLoop
    state: HAState

    @property
    def is_master(self) -> bool: ...

    def newer_epoch(self, slave: str, epoch: int) -> None:
        """``slave``'s log holds ``epoch``, newer than this master's: it was deposed."""


log = logging.getLogger("raymq.actors.ha")


@dataclass
class SlaveState:
    registered_id: int
    ack: int = 0  # how far the slave's CommitLog reaches, as it last said
    seen: float = 0.0  # loop time of its last request


class HAService:
    def __init__(self, repl: MasterSide) -> None:
        self.repl = repl
        self.config = repl.config
        self.store = repl.store
        self.loop = repl.loop
        self.slaves: dict[str, SlaveState] = {}
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._data = self.loop.create_future()
        self._data_waiting = 0
        self.catching_up = False  # a master starting: slaves wait while it copies from them
        self._writes_from: int | None = None  # where this master's first write goes
        self._verified: set[str] = set()  # slaves whose log was checked against that
        self.store.add_dispatch_listener(self._on_dispatch)

    # ------------------------------------------------------------ GroupTransferService
    async def wait_for_slave(self, end: int) -> PutStatus:
        """PUT_OK once a slave holds the CommitLog up to ``end``."""
        if self.acked() >= end:
            return PutStatus.PUT_OK
        if not self._slave_in_sync(end):
            return PutStatus.SLAVE_NOT_AVAILABLE
        fut: asyncio.Future[None] = self.loop.create_future()
        heapq.heappush(self._waiters, (end, next(self._seq), fut))
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.config.sync_replication_timeout_s)
        except asyncio.TimeoutError:
            return PutStatus.FLUSH_SLAVE_TIMEOUT
        return PutStatus.PUT_OK

    def acked(self) -> int:
        """The furthest any slave acknowledged (what the master may confirm)."""
        return max((s.ack for s in self.slaves.values()), default=0)

    def live_slaves(self) -> list[SlaveState]:
        horizon = self.loop.time() - self.config.ha_slave_timeout_s
        return [s for s in self.slaves.values() if s.seen >= horizon]

    def _slave_in_sync(self, end: int) -> bool:
        gap = self.config.ha_max_gap_not_in_sync
        return any(end - s.ack < gap for s in self.live_slaves())

    def _on_acked(self) -> None:
        acked = self.acked()
        while self._waiters and self._waiters[0][0] <= acked:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)
        if self._data_waiting:  # idle slaves learn the new confirmed offset now, not later
            self.signal_data()

    def fail_waiters(self, exc: BaseException) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, fut in waiters:
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved: a waiter that timed out never reads it

    def writes_from(self, offset: int | None) -> None:
        """The master is done catching up from its slaves and writes from ``offset`` on: a
        slave whose log goes past it before it ever asked this master holds bytes from
        before the restart that the master's new writes do not match. ``None`` for a
        promoted master: its new epoch starts at its end, and the epochs say it all."""
        self._writes_from = offset
        self.catching_up = False

    def clear(self) -> None:
        """Forget the slaves (a new epoch begins, or this broker stops being master)."""
        self.slaves.clear()
        self.signal_data()

    # ------------------------------------------------------------ transfer
    def _on_dispatch(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Store listener (any thread): wake slaves waiting for new bytes."""
        if self._data_waiting:
            self.loop.call_soon_threadsafe(self.signal_data)

    def signal_data(self) -> None:
        fut, self._data = self._data, self.loop.create_future()
        if not fut.done():
            fut.set_result(None)

    async def transfer(
        self,
        slave: str,
        slave_id: int,
        offset: int,
        epochs: list[tuple[int, int]],
        max_bytes: int,
        wait_s: float,
        acked: int | None = None,
    ) -> TransferReply:
        """A slave asks for the bytes from ``offset`` (held up to ``wait_s`` until there are
        some) and acknowledges that its CommitLog ends at ``acked`` (default ``offset``)."""
        name = self.config.actor_name
        if not self.repl.is_master:
            raise BrokerUnavailableError(
                f"broker {name} is a slave, not the master of {self.config.broker_name}"
            )
        newest = epochs[-1][0] if epochs else 0
        if newest > self.repl.state.epoch:
            # a master of that epoch was promoted while this one was away (a NameServer
            # that restarted forgot it): cutting the slave back would drop what it holds
            self.repl.newer_epoch(slave, newest)
            raise BrokerUnavailableError(
                f"broker {name} is master in epoch {self.repl.state.epoch}, but slave "
                f"{slave} follows epoch {newest}: a newer master replaced it"
            )
        if self.catching_up:
            raise BrokerUnavailableError(
                f"broker {name} is starting: it copies what its slaves hold past its own "
                "commitlog before it serves them"
            )
        cl = self.store.commitlog
        if slave not in self._verified:
            cut = self._first_contact(slave, offset, epochs)
            if cut is not None:
                return self._reply(offset, [], truncate_to=cut)
        state = self.slaves.get(slave)
        if state is None:
            state = self.slaves[slave] = SlaveState(slave_id)
            log.info("%s: slave %s connected at offset %d", name, slave, offset)
        state.registered_id = slave_id
        state.seen = self.loop.time()
        point = consistent_point(epochs, offset, self.repl.state.epochs, cl.max_offset)
        if offset > point:
            state.ack = 0
            return self._reply(offset, [], truncate_to=point)
        ack = offset if acked is None else min(acked, offset)
        if ack != state.ack:
            state.ack = ack
            self._on_acked()
        if max_bytes <= 0:
            return self._reply(offset, [])
        if offset >= cl.max_offset and wait_s > 0:
            fut = self._data
            if cl.max_offset <= offset:
                self._data_waiting += 1
                try:
                    await asyncio.wait_for(asyncio.shield(fut), wait_s)
                except asyncio.TimeoutError:
                    pass
                finally:
                    self._data_waiting -= 1
            state.seen = self.loop.time()
            if not self.repl.is_master:
                raise BrokerUnavailableError(f"broker {name} was deposed")
            await asyncio.sleep(0)  # let puts already queued on the loop join this round
        return self._reply(offset, self.read(offset, max_bytes))

    def _first_contact(self, slave: str, offset: int, epochs: list[tuple[int, int]]) -> int | None:
        """Where a slave asking this master for the first time must cut its log, if
        anywhere beyond what the epochs say: the bytes it holds in this master's epoch past
        :meth:`writes_from` were written before this master restarted, and its new writes
        there are other bytes (the master copied what the slaves it could reach held)."""
        start = self._writes_from
        newest = epochs[-1][0] if epochs else 0
        if start is not None and offset > start and newest == self.repl.state.epoch:
            log.error(
                "%s: slave %s holds the commitlog up to %d, past %d where this master "
                "started writing after a restart without reaching it: the slave cuts "
                "the %d bytes off (messages only it held are lost)",
                self.config.actor_name,
                slave,
                offset,
                start,
                offset - start,
            )
            return start
        self._verified.add(slave)
        return None

    def read(self, offset: int, max_bytes: int) -> list[np.ndarray]:
        """Up to ``max_bytes`` from ``offset``, one piece per file, as numpy buffers (Ray
        ships those out of band: no copy into the pickled reply, none out of it)."""
        chunks: list[np.ndarray] = []
        size = 0
        if offset < self.store.commitlog.min_offset:
            raise BrokerUnavailableError(
                f"offset {offset} expired on {self.config.actor_name} (its commitlog starts at "
                f"{self.store.commitlog.min_offset}): this slave needs a new store"
            )
        while size < max_bytes:
            chunk = self.store.read_commitlog(offset + size, max_bytes - size)
            if not chunk:
                break
            chunks.append(np.frombuffer(chunk, dtype=np.uint8))
            size += len(chunk)
        return chunks

    def _reply(
        self, offset: int, chunks: list[np.ndarray], truncate_to: int | None = None
    ) -> TransferReply:
        state = self.repl.state
        return TransferReply(
            master=self.config.actor_name,
            epoch=state.epoch,
            epochs=list(state.epochs),
            offset=offset,
            chunks=chunks,
            confirmed=self.acked(),
            master_end=self.store.commitlog.max_offset,
            file_size=self.store.config.commitlog_file_size,
            truncate_to=truncate_to,
        )

    def status(self) -> dict[str, object]:
        now = self.loop.time()
        return {
            "slaves": {
                name: {
                    "id": s.registered_id,
                    "ack_offset": s.ack,
                    "seen_s_ago": round(now - s.seen, 3),
                }
                for name, s in sorted(self.slaves.items())
            },
            "ha_confirmed_offset": self.acked(),
        }
