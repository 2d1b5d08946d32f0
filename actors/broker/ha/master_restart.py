"""A master restarting behind a slave of its own epoch (a power loss took the unflushed
tail of its CommitLog, which a SYNC_MASTER had acknowledged because the slave held it)
copies that slave's whole records past its end before it takes a write, so no
acknowledged queue offset is given twice (``MasterSlaveReplication._catch_up_from_slaves``
finds the slave; this is the copy). It also takes the consumer offsets its slaves
were given meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from actors.broker.ha.replication import Replication
from actors.protocol.names import MASTER_ID
from storage.store import MessageStore

log = logging.getLogger("raymq.actors.ha")

COPY_TIMEOUT_S = 30.0
"""A master copying a slave's tail gives up on a read that takes longer than this."""
COPY_PROGRESS_BYTES = 256 << 20
"""A master copying a slave's tail logs its progress each time this many bytes arrived."""


async def copy_tail(repl: Replication, slave: str, handle: Any, my_end: int, end: int) -> None:
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
    repl: Replication, members: Mapping[int, str], get_actor: Callable[[str], Any]
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
