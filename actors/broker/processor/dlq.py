"""Reading a group's dead letters on the broker, whatever the DLQ's perm (admin only).

The DLQ is write-only for consumers (perm 2), so operators read it through here
rather than by pulling; resending them is the admin client's job (``actors.client.dlq``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.protocol.topic import dlq_topic
from actors.protocol.wire import DLQ_MAX_READ as MAX_READ
from storage.errors import InvalidMessageError
from storage.message import MessageExt

if TYPE_CHECKING:
    from actors.broker.runtime import BrokerRuntime


async def read_dlq(
    broker: BrokerRuntime, group: str, offset: int = 0, max_count: int = 256
) -> tuple[list[MessageExt], int]:
    """Dead letters of ``group`` on ``broker`` from queue offset ``offset``, whatever the
    DLQ's perm; and the offset to read on from."""
    topic = dlq_topic(group)
    if not isinstance(max_count, int) or not 0 < max_count <= MAX_READ:
        raise InvalidMessageError(f"max_count={max_count!r}: must be an int in 1..{MAX_READ}")
    if broker.topics.get(topic) is None:
        return [], offset
    got = await broker.run(broker.store.get, "", topic, 0, max(offset, 0), max_count, None)
    return got.messages, max(got.next_offset, offset)
