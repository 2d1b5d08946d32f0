"""A master (re)starting, before it registers (:class:`MasterStart`): it takes the
consumer offsets its slaves were given while it was gone, and asks every registered
slave where its log ends (again while one is slow to answer, for ``ha_ask_slaves_s``
at most). A slave whose log holds a newer epoch says a newer master replaced this one:
it becomes a slave. A slave ahead of it in its own epoch holds what a power loss took
from its CommitLog's unflushed tail (acknowledged by a SYNC_MASTER because the slave
had it): the master copies that slave's whole records past its end
(:func:`copy_tail`) before it takes a write, so no acknowledged queue offset is given
twice.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from actors.broker.ha.epochs import Epochs, consistent_point
from actors.protocol.names import MASTER_ID
from storage.store import MessageStore

if TYPE_CHECKING:
    from actors.broker.ha.epochs import HAState
    from actors.broker.runtime import BrokerRuntime
    from actors.config.broker import BrokerConfig

log = logging.getLogger("raymq.actors.ha")

GATHER_TIMEOUT_S = 3.0
"""A master (re)starting or promoted waits this long for its slaves' consumer offsets."""
ASK_SLAVE_S = 2.0
"""A master (re)starting gives a slave this long to say where its log ends, each time."""
ASK_SLAVES_RETRY_S = 0.5
NAMESERVERS = "the NameServers"
"""What a starting master's ``waiting_for`` names while no NameServer has answered."""
COPY_TIMEOUT_S = 30.0
"""A master copying a slave's tail gives up on a read that takes longer than this."""
COPY_PROGRESS_BYTES = 256 << 20
"""A master copying a slave's tail logs its progress each time this many bytes arrived."""


class Member(Protocol):
    """A member of a master/slave group (``MasterSlaveReplication``), as these steps
    use it."""

    config: BrokerConfig
    store: MessageStore
    broker: BrokerRuntime


class Restarting(Member, Protocol):
    """What a master (re)starting needs of its role: the group, and how to step down."""

    state: HAState
    loop: asyncio.AbstractEventLoop

    async def group_members(self) -> dict[int, str]:
        """Registered id -> actor name of the group's live members, per the NameServers."""
        ...

    async def nameserver_members(self) -> dict[int, str] | None:
        """The same, or None when no NameServer answers."""
        ...

    def get_actor(self, name: str) -> Any: ...

    async def demote(self, master: str | None, epoch: int) -> None:
        """A master of ``epoch``, newer than this one's, exists: become a slave."""
        ...


class MasterStart:
    """A master (re)starting, before it registers (see the module doc). ``waiting_for``:
    the registered slaves it has yet to hear from (its status shows them)."""

    def __init__(self, repl: Restarting) -> None:
        self.repl = repl
        self.waiting_for: list[str] = []

    async def run(self) -> None:
        """The slaves' consumer offsets, then the catch-up (each best effort: a slave
        that is gone meanwhile is fenced later by the master's HAService)."""
        repl = self.repl

        async def gather() -> None:
            await gather_slave_offsets(repl, await repl.group_members(), repl.get_actor)

        try:
            await asyncio.wait_for(gather(), GATHER_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - best effort: slaves also push them later
            log.debug("%s: gathering slave offsets: %s", repl.config.actor_name, exc)
        try:
            await self.catch_up()
        except Exception as exc:  # noqa: BLE001 - a slave gone meanwhile: see HAService
            log.warning(
                "%s: copying the commitlog from a slave ahead failed: %s",
                repl.config.actor_name,
                exc,
            )

    async def catch_up(self) -> None:
        """A master that restarts after a power loss may have lost the unflushed tail of
        its CommitLog while a slave holds it (under SYNC_MASTER, acknowledged to producers
        because the slave had it). Writing from its own end again would give acknowledged
        queue offsets to new messages, and the slave would be told to cut the tail off. So
        first it copies, from the slave furthest ahead in its own epoch, the whole records
        past its end, and dispatches them as a slave does. A slave whose log holds a newer
        epoch says this master was replaced while it was down: it becomes a slave."""
        repl = self.repl
        name = repl.config.actor_name
        my_end = repl.store.commitlog.max_offset
        best: tuple[int, str, Any] | None = None
        members, tails = await self.ask_slaves()
        newer = 0  # the newest epoch a member's log holds, when newer than this master's
        for actor_name, (end, epochs, handle) in tails.items():
            newest = epochs[-1][0] if epochs else 0
            if newest > repl.state.epoch:
                newer = max(newer, newest)
            if (
                end > my_end
                and newest == repl.state.epoch
                and consistent_point(repl.state.epochs, my_end, epochs, end) == my_end
                and (best is None or end > best[0])
            ):
                best = (end, actor_name, handle)
        if newer:
            # a slave follows a master of a newer epoch: this one was replaced while it was
            # down, whether or not a NameServer still knows it (one restarted forgets)
            master = members.get(MASTER_ID)
            await repl.demote(master if master != name else None, newer)
            return
        if best is None:
            return
        end, slave, handle = best
        await copy_tail(repl, slave, handle, my_end, end)

    async def ask_slaves(self) -> tuple[dict[int, str], dict[str, tuple[int, Epochs, Any]]]:
        """The group's registered members and, for each slave among them, its log's end,
        epochs and handle. A slave registered but slow to answer (a loaded machine, a
        pause) is asked again until it answers or leaves the NameServers' routes, for
        ``ha_ask_slaves_s`` (30 s) at most: its log may say that a newer master replaced
        this one, which a NameServer that restarted no longer knows. No NameServer
        answering is no answer either (one paused, or this process too busy starting to
        hear one in time: taken for "no slaves", the master would register in an epoch a
        slave may know to be over): they are asked again too, within the same time."""
        repl = self.repl
        name = repl.config.actor_name
        deadline = repl.loop.time() + repl.config.ha_ask_slaves_s
        tails: dict[str, tuple[int, Epochs, Any]] = {}
        while True:
            heard = await repl.nameserver_members()
            members = heard if heard is not None else {}
            waiting = [] if heard is not None else [NAMESERVERS]
            for bid, actor_name in members.items():
                if actor_name == name or bid == MASTER_ID or actor_name in tails:
                    continue
                try:
                    handle = await repl.broker.run(repl.get_actor, actor_name)
                    end, epochs, _ = await asyncio.wait_for(
                        handle.ha_log_tail.remote(0, 0), ASK_SLAVE_S
                    )
                except ValueError:  # its actor is gone: the NameServers drop it soon
                    continue
                except Exception:  # noqa: BLE001 - slow, restarting or cut off: again
                    waiting.append(actor_name)
                    continue
                tails[actor_name] = (end, epochs, handle)
            self.waiting_for = waiting
            if not waiting:
                return members, tails
            if repl.loop.time() >= deadline:
                self.waiting_for = []
                log.warning(
                    "%s: starting as master without an answer from %s in %.0f s: a newer "
                    "epoch that one's log may hold is found when it replicates",
                    name,
                    ", ".join(waiting),
                    repl.config.ha_ask_slaves_s,
                )
                return members, tails
            await asyncio.sleep(ASK_SLAVES_RETRY_S)


async def copy_tail(repl: Member, slave: str, handle: Any, my_end: int, end: int) -> None:
    """Copy ``slave``'s CommitLog from ``my_end`` to ``end`` into this master's store,
    progress logged; cut short, keep only the whole records copied."""
    name = repl.config.actor_name
    log.warning(
        "%s: restarted with its commitlog ending at %d, behind slave %s at %d: copying "
        "the %d bytes past its end before taking writes",
        name,
        my_end,
        slave,
        end,
        end - my_end,
    )
    append = functools.partial(repl.store.append_commitlog, dispatch=False)
    offset = my_end
    step = repl.config.ha_transfer_batch_bytes
    logged = offset
    try:
        while offset < end:
            _, _, chunks = await asyncio.wait_for(
                handle.ha_log_tail.remote(offset, min(step, end - offset)), COPY_TIMEOUT_S
            )
            if not chunks:
                break
            for chunk in chunks:
                offset = await repl.broker.run(append, offset, memoryview(chunk))
            if offset - logged >= COPY_PROGRESS_BYTES:
                logged = offset
                log.info(
                    "%s: copied %d of %d bytes from %s",
                    name,
                    offset - my_end,
                    end - my_end,
                    slave,
                )
    except Exception:  # cut short (the slave gone or promoted): keep its whole records
        await repl.broker.run(keep_whole_records, repl.store)
        raise
    await repl.broker.run(keep_whole_records, repl.store)
    log.warning(
        "%s: copied the commitlog up to %d from %s",
        name,
        repl.store.commitlog.max_offset,
        slave,
    )


async def gather_slave_offsets(
    repl: Member, members: Mapping[int, str], get_actor: Callable[[str], Any]
) -> None:
    """The queue offsets consumers committed to the group's slaves while this master was
    down, merged into its own (each queue's highest)."""
    for bid, actor_name in members.items():
        if actor_name == repl.config.actor_name or bid == MASTER_ID:
            continue
        try:
            handle = await repl.broker.run(get_actor, actor_name)
            table = await asyncio.wait_for(handle.ha_local_offsets.remote(), 2.0)
        except Exception:  # noqa: BLE001
            continue
        moved = repl.broker.offsets.merge_max(table)
        if moved:
            log.info(
                "%s: took %d queue offset(s) consumers committed to %s",
                repl.config.actor_name,
                moved,
                actor_name,
            )


def keep_whole_records(store: MessageStore) -> int:
    """Index the records a master copied from a slave and drop a record the copy cut in
    two (the slave gone or promoted mid-copy), so that the master's first write starts
    where a whole record ends. Returns that end."""
    store.dispatch_replicated()
    end = store.dispatched_offset
    if store.commitlog.max_offset > end:
        log.warning(
            "%s: dropping the %d bytes of a record the copy from a slave cut in two",
            store.config.store_dir,
            store.commitlog.max_offset - end,
        )
        store.truncate_commitlog(end)
    return end
