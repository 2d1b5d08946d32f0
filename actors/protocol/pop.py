"""What a POP receive answers (``actors.broker.processor.pop``; ``actors.client.simple_consumer``),
and how it crosses the data path's socket.

Over the socket a receive is answered compactly, as pulls are: the records' bytes exactly
as the CommitLog holds them (the frame's body, decoded on the client by
``storage.codec.decode_records``) and, in the frame's msgpack header, one
``[receipt handle, reconsume times]`` pair per record, in the same order. No message
object is pickled on the way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from actors.protocol.checks import check_number
from storage.codec import decode_records
from storage.errors import InvalidMessageError
from storage.message import MessageExt
from storage.pop import MAX_INVISIBLE_MS, MAX_POP_MSGS, MIN_INVISIBLE_MS

__all__ = [
    "MAX_INVISIBLE_MS",
    "MAX_POP_MSGS",
    "MIN_INVISIBLE_MS",
    "PoppedMessage",
    "check_receive_args",
    "pops_from_wire",
]


def check_receive_args(
    max_msgs: object, invisible_s: object, wait_s: object, default_wait_s: float
) -> tuple[int, int, float]:
    """A receive's arguments checked: (``max_msgs``, the invisible time in ms, the wait
    in seconds, ``default_wait_s`` when ``wait_s`` is None). Raises
    InvalidMessageError naming the first bad one."""
    if (
        not isinstance(max_msgs, int)
        or isinstance(max_msgs, bool)
        or not 0 < max_msgs <= MAX_POP_MSGS
    ):
        raise InvalidMessageError(f"max_msgs={max_msgs!r}: must be an int in 1..{MAX_POP_MSGS}")
    invisible_ms = int(check_number("invisible_s", invisible_s) * 1000)
    wait = default_wait_s if wait_s is None else check_number("wait_s", wait_s)
    return max_msgs, invisible_ms, wait


@dataclass(slots=True)
class PoppedMessage:
    """One message a POP receive handed out: ack it (or change its invisible duration) by
    ``receipt_handle`` before its invisible time lapses, or it comes again."""

    message: MessageExt
    receipt_handle: str
    reconsume_times: int
    """0 at the first delivery; the delivery attempt is ``reconsume_times + 1``."""

    @property
    def delivery_attempt(self) -> int:
        return self.reconsume_times + 1

    @property
    def body(self) -> bytes:
        return self.message.body

    @property
    def topic(self) -> str:
        return self.message.topic

    @property
    def msg_id(self) -> str:
        return self.message.msg_id

    @property
    def tags(self) -> str | None:
        return self.message.tags

    @property
    def keys(self) -> tuple[str, ...]:
        return self.message.keys


def pops_from_wire(heads: Any, records: bytes | memoryview) -> list[PoppedMessage]:
    """A receive's socket answer: ``heads`` (the header's ``[handle, reconsume times]``
    pairs) and ``records`` (the body: the records back to back, as stored)."""
    if not isinstance(heads, list) or not all(
        isinstance(h, (list, tuple))
        and len(h) == 2
        and isinstance(h[0], str)
        and isinstance(h[1], int)
        and not isinstance(h[1], bool)
        for h in heads
    ):
        raise InvalidMessageError(f"a POP answer's heads: {heads!r:.80}")
    messages = decode_records(records, check_crc=False) if len(records) else []
    if len(messages) != len(heads):
        raise InvalidMessageError(
            f"a POP answer with {len(heads)} receipt handles and {len(messages)} records"
        )
    return [
        PoppedMessage(m._replace(reconsume_times=times), handle, times)
        for m, (handle, times) in zip(messages, heads)
    ]


def pops_heads(popped: Sequence[Any]) -> list[list[Any]]:
    """The header's pairs for popped messages (anything with ``receipt_handle`` and
    ``reconsume_times``)."""
    return [[p.receipt_handle, int(p.reconsume_times)] for p in popped]
