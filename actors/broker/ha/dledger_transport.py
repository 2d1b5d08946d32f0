"""How the members of a DLedger group reach each other (``actors.broker.ha.dledger``).

* :class:`PeerLink`: another member's actor handle, found by name, and one
  ``wait_closed`` call kept pending on it, which Ray fails the moment the actor
  or its node dies: the death notice that starts an election at once.
* :class:`EntryRun`: the log entries of one drain's ``AppendEntries``, read from
  the CommitLog once and put in Ray's object store once for every follower
  (:func:`to_wire` / :func:`from_wire` swap a message's entries for a reference
  into it and back).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import ray

from actors.broker.ha.raft_log import CommitLogRaftLog
from storage.raft import AppendEntries, Entry, Message

if TYPE_CHECKING:
    import asyncio

    from actors.broker.runtime import BrokerRuntime
    from actors.config.broker import BrokerConfig


class LinkOwner(Protocol):
    """What a :class:`PeerLink` needs of the DLedger role that owns it."""

    broker: BrokerRuntime
    config: BrokerConfig
    loop: asyncio.AbstractEventLoop
    closed: bool

    def kick(self) -> None: ...

    def on_peer_dead(self, peer: str) -> None: ...


_RESOLVE_RETRY_S = 0.3


class EntryRun:
    """Entries ``first .. first + len(terms) - 1`` of the leader's log, as one buffer.

    One drain's ``AppendEntries`` to every follower share one of these, put in
    Ray's object store once (a numpy buffer, read without a copy by followers on
    the same node) instead of pickling the same bytes once per follower.
    """

    def __init__(self, first: int, terms: list[int], ends: list[int], data: np.ndarray) -> None:
        self.first = first
        self.terms = terms
        self.ends = ends  # relative to data; entry i spans ends[i - 1] (or 0) .. ends[i]
        self.data = data

    def entries(self, first: int, count: int) -> tuple[Entry, ...]:
        view = memoryview(self.data)  # type: ignore[arg-type]
        out = []
        for i in range(first - self.first, first - self.first + count):
            start = self.ends[i - 1] if i else 0
            out.append(Entry(self.terms[i], view[start : self.ends[i]]))  # type: ignore[arg-type]
        return tuple(out)


def to_wire(
    messages: tuple[Message, ...], raft_log: CommitLogRaftLog
) -> tuple[list[Any], EntryRun | None]:
    """Messages with their entries swapped for (first index, count) into one shared run."""
    appends = [m for m in messages if isinstance(m, AppendEntries) and m.entries]
    if not appends:
        return list(messages), None
    lo = min(m.prev_index + 1 for m in appends)
    hi = max(m.last_index for m in appends)
    base = raft_log.end_of(lo - 1)
    data = np.frombuffer(raft_log.read(base, raft_log.end_of(hi) - base), dtype=np.uint8)
    run = EntryRun(
        lo,
        [raft_log.term_at(i) for i in range(lo, hi + 1)],
        [raft_log.end_of(i) - base for i in range(lo, hi + 1)],
        data,
    )
    wire: list[Any] = []
    for m in messages:
        if isinstance(m, AppendEntries) and m.entries:
            wire.append((dataclasses.replace(m, entries=()), len(m.entries)))
        else:
            wire.append(m)
    return wire, run


def from_wire(wire: list[Any], run: EntryRun | None) -> list[Message]:
    out: list[Message] = []
    for m in wire:
        if isinstance(m, tuple):
            msg, count = m
            assert run is not None
            m = dataclasses.replace(msg, entries=run.entries(msg.prev_index + 1, count))
        out.append(m)
    return out


class PeerLink:
    """Another member: its handle, and a pending ``wait_closed`` that tells of its death."""

    def __init__(self, shell: LinkOwner, name: str) -> None:
        self.shell = shell
        self.name = name
        self.handle: Any = None
        self._task: asyncio.Task[None] | None = None

    def send(self, messages: list[Any], run: Any) -> None:
        if self.handle is None:
            self.connect()
            return  # Raft resends what is lost
        self.handle.raft_receive.remote(messages, run)

    def connect(self) -> None:
        if self._task is None or self._task.done():
            self._task = self.shell.loop.create_task(self._run())

    async def _run(self) -> None:
        b = self.shell.broker
        while not self.shell.closed:
            try:
                handle = await b.run(ray.get_actor, self.name, self.shell.config.namespace)
                await asyncio.wait_for(handle.ping.remote(), 10.0)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - not started yet, or restarting
                await asyncio.sleep(_RESOLVE_RETRY_S)
                continue
            self.handle = handle
            self.shell.kick()
            try:
                await handle.wait_closed.remote()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - Ray reports the actor (or its node) dead
                pass
            self.handle = None
            if not self.shell.closed:
                self.shell.on_peer_dead(self.name)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
