"""What a POP receive answers (``actors.broker.pop``; ``actors.client.simple_consumer``)."""

from __future__ import annotations

from dataclasses import dataclass

from storage.message import MessageExt
from storage.pop import MAX_INVISIBLE_MS, MAX_POP_MSGS, MIN_INVISIBLE_MS

__all__ = ["MAX_INVISIBLE_MS", "MAX_POP_MSGS", "MIN_INVISIBLE_MS", "PoppedMessage"]


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
