"""Transactional (half) messages as the store keeps them: RocketMQ's
``TransactionalMessageBridge``, the store's half of it.

A producer marks a message transactional with ``TRAN_MSG=true`` and ``PGROUP``
(its producer group). The store does not put it in its topic: it puts a *half*
copy in :data:`HALF_TOPIC` queue 0, with the real topic and queue in
``REAL_TOPIC``/``REAL_QID`` and the SYSFLAG's transaction bits set to
:data:`TRANSACTION_PREPARED_TYPE`, so no consumer of the real topic sees it. The
same shape as a delayed message's schedule copy (``storage.schedule``); a message
both delayed and transactional loses its delay, as RocketMQ's producer drops it.

What happens next is the broker's (``actors.broker.transaction``): a commit writes
:func:`committed` (the real message, SYSFLAG :data:`TRANSACTION_COMMIT_TYPE`) and an
op message on :data:`OP_HALF_TOPIC` whose body is the half message's queue
offset; a rollback writes only the op message. This module holds the record
shapes both sides agree on; it knows nothing of brokers or Ray.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

from . import codec
from .errors import InvalidMessageError, ProducerFencedError
from .message import Message, MessageExt
from .properties import (
    PROP_DELAY,
    PROP_PRODUCER_GROUP,
    PROP_REAL_QID,
    PROP_REAL_TOPIC,
    PROP_TRAN_MSG,
)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
"""Where a half message checked ``transaction_check_max`` times without an answer goes."""
OP_TAG = "d"  # RocketMQ's TransactionalMessageUtil.REMOVE_TAG
PROP_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROP_TRANSACTION_ID = "__transactionId__"
PROP_CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
"""A producer's own wait before the first check of its half message (RocketMQ's name)."""
PROP_GLOBAL_TXN = "__TXN_ID__"
"""A multi-message transaction's id: every half message of it carries it, and the broker
asks the transaction coordinator about it, not a producer (``actors.coordinator.txn``)."""
PROP_TXN_PRODUCER = "__TXN_PRODUCER__"
"""The ``transactional_id`` of the producer that sent a half message of a multi-message
transaction, with its epoch in :data:`PROP_TXN_EPOCH` (fencing: :class:`TransactionalFences`)."""
PROP_TXN_EPOCH = "__TXN_EPOCH__"

# the SYSFLAG's bits 2-3, as RocketMQ's MessageSysFlag names them
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
TRANSACTION_MASK = 0xC

_OFF_SYSFLAG = 36  # the record's SYSFLAG field (see codec's layout)
# what a committed copy no longer carries (RocketMQ clears them in endMessageTransaction)
_TXN_PROPS = (
    PROP_TRAN_MSG,
    PROP_REAL_TOPIC,
    PROP_REAL_QID,
    PROP_CHECK_TIMES,
    PROP_DELAY,
    PROP_GLOBAL_TXN,
    PROP_TXN_PRODUCER,
    PROP_TXN_EPOCH,
)


def transaction_type(sys_flag: int) -> int:
    return sys_flag & TRANSACTION_MASK


def is_transactional(m: MessageExt) -> bool:
    return m.topic != HALF_TOPIC and m.properties.get(PROP_TRAN_MSG) == "true"


def may_hold_transactional(batch: codec.EncodedBatch) -> bool:
    """Whether any record of ``batch`` may carry ``TRAN_MSG=true``: the encoder says so in
    the batch's head (``EncodedBatch.transactional``), so a send costs no scan of its
    bytes. A record carrying the property in a batch not flagged (an encoder of its own)
    is stored as it came, a plain message."""
    return batch.transactional


def to_half(m: MessageExt, queue_id: int) -> Message:
    """The half copy of a transactional message sent to ``queue_id`` of its topic."""
    props = {k: v for k, v in m.properties.items() if k not in (PROP_DELAY, PROP_REAL_TOPIC)}
    props[PROP_REAL_TOPIC] = m.topic
    props[PROP_REAL_QID] = str(queue_id)
    return Message(
        HALF_TOPIC, m.body, tags=m.tags, keys=m.keys, properties=props, queue_id=0, flag=m.flag
    )


def committed(half: MessageExt) -> Message:
    """The message a commit writes to the real topic and queue (same unique key)."""
    props = {k: v for k, v in half.properties.items() if k not in _TXN_PROPS}
    return Message(
        half.properties[PROP_REAL_TOPIC],
        half.body,
        tags=half.tags,
        keys=half.keys,
        properties=props,
        queue_id=int(half.properties[PROP_REAL_QID]),
        flag=half.flag,
    )


def checked_again(half: MessageExt) -> Message:
    """The half copy a check puts back to the half queue, its check count one higher."""
    props = dict(half.properties)
    props[PROP_CHECK_TIMES] = str(check_times(half) + 1)
    return Message(
        HALF_TOPIC, half.body, tags=half.tags, keys=half.keys, properties=props, flag=half.flag
    )


def discarded(half: MessageExt) -> Message:
    """The copy of a half message checked too often, for :data:`CHECK_MAX_TOPIC`."""
    return Message(
        CHECK_MAX_TOPIC,
        half.body,
        tags=half.tags,
        keys=half.keys,
        properties=dict(half.properties),
        flag=half.flag,
    )


def op_message(half_queue_offset: int | list[int]) -> Message:
    """The op message that marks the half message at ``half_queue_offset`` done (or each
    of a list of them: one op message for a multi-message transaction's halves, its body
    the offsets joined by commas, as RocketMQ's newer op messages are)."""
    offsets = half_queue_offset if isinstance(half_queue_offset, list) else [half_queue_offset]
    return Message(OP_HALF_TOPIC, ",".join(map(str, offsets)).encode("ascii"), tags=OP_TAG)


def op_offsets(body: bytes) -> list[int]:
    """The half queue offsets an op message's body names (ValueError when it names none)."""
    return [int(part) for part in body.split(b",")]


def global_txn(half: MessageExt) -> str | None:
    """The multi-message transaction ``half`` belongs to, if any."""
    return half.properties.get(PROP_GLOBAL_TXN)


class TransactionalFences:
    """The lowest epoch a transactional producer's half messages may carry, per
    ``transactional_id`` (raised by the transaction coordinator when a new instance
    takes the id over). Kept in memory: the coordinator is the authority and refuses
    a fenced producer's commit whatever a store holds."""

    def __init__(self) -> None:
        self._epochs: dict[str, int] = {}

    def raise_fence(self, transactional_id: str, epoch: int) -> bool:
        if epoch > self._epochs.get(transactional_id, -1):
            self._epochs[transactional_id] = epoch
            return True
        return False

    def check(self, m: MessageExt) -> None:
        """ProducerFencedError when ``m`` comes from an epoch below its id's fence."""
        tid = m.properties.get(PROP_TXN_PRODUCER)
        if tid is None:
            return
        try:
            epoch = int(m.properties.get(PROP_TXN_EPOCH, ""))
        except ValueError as exc:
            raise InvalidMessageError(
                f"{PROP_TXN_EPOCH}={m.properties.get(PROP_TXN_EPOCH)!r}: not an epoch"
            ) from exc
        fence = self._epochs.get(tid, -1)
        if epoch < fence:
            raise ProducerFencedError(
                f"transactional id {tid!r}: epoch {epoch} is fenced by epoch {fence}"
            )


def check_times(half: MessageExt) -> int:
    try:
        return int(half.properties.get(PROP_CHECK_TIMES, "0"))
    except ValueError:
        return 0


def check_after_ms(half: MessageExt, timeout_ms: int) -> int:
    """How old ``half`` must be before it is checked: its ``CHECK_IMMUNITY_TIME_IN_SECONDS``
    when it carries a whole number of seconds >= 0, else the broker's ``timeout_ms``."""
    text = half.properties.get(PROP_CHECK_IMMUNITY)
    if text is None or not text.isdigit():
        return timeout_ms
    return int(text) * 1000


def producer_group(half: MessageExt) -> str:
    return half.properties.get(PROP_PRODUCER_GROUP, "")


def with_transaction_type(
    batch: codec.EncodedBatch, records: np.ndarray | list[int], kind: int
) -> codec.EncodedBatch:
    """``batch`` with the transaction bits of the SYSFLAG of ``records`` set to ``kind``
    (the encoder writes 0; these bits are the store's, never a producer's)."""
    data = bytearray(batch.data)
    starts = np.zeros(len(batch.sizes) + 1, dtype=np.int64)
    np.cumsum(batch.sizes, out=starts[1:])
    for i in np.asarray(records, dtype=np.int64).tolist():
        at = int(starts[i]) + _OFF_SYSFLAG
        (flag,) = struct.unpack_from(">i", data, at)
        struct.pack_into(">i", data, at, (flag & ~TRANSACTION_MASK) | kind)
    return dataclasses.replace(batch, data=bytes(data))
