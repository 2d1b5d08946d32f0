"""What a send returns, and the encoded batch it is built from.

A batch's results stay as arrays (one :class:`SendAck` per Ray call) until a
caller looks at a message's :class:`SendResult`.
"""

from __future__ import annotations

import enum
import functools
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from actors.protocol.wire import OUT_OF_BAND_BYTES, SendAck
from rebalance import MessageQueue
from storage import codec
from storage.codec import EncodedBatch
from storage.message import PutStatus


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"


# keyed by the members' values: an Enum member's hash is a Python call (enum.__hash__)
_SEND_STATUS = {
    s._value_: SendStatus[s.value if s is not PutStatus.PUT_OK else "SEND_OK"] for s in PutStatus
}


@dataclass(frozen=True, slots=True)
class SendResult:
    status: SendStatus
    msg_id: str
    offset_msg_id: str
    message_queue: MessageQueue
    queue_offset: int


def _fast_result() -> Any:
    """A constructor of :class:`SendResult` that sets its slots directly: half the cost
    of the frozen dataclass's ``__init__`` (one ``object.__setattr__`` a field), paid
    once per message of every answered send."""
    new = object.__new__
    setters = [SendResult.__dict__[f.name].__set__ for f in fields(SendResult)]
    if len(setters) != 5:  # a field added: the plain constructor, until this is taught it
        return SendResult
    a, b, c, d, e = setters

    def make(
        status: SendStatus, msg_id: str, offset_msg_id: str, mq: MessageQueue, offset: int
    ) -> SendResult:
        r = new(SendResult)
        a(r, status)
        b(r, msg_id)
        c(r, offset_msg_id)
        d(r, mq)
        e(r, offset)
        return r  # type: ignore[no-any-return]

    return make


_result = _fast_result()


@dataclass(frozen=True)
class _Chunk:
    """Messages of one topic encoded once; ``positions`` are their indexes in the caller's list."""

    topic: str
    batch: EncodedBatch
    positions: np.ndarray


@functools.lru_cache(maxsize=256)
def _offset_id_prefix(store_host: str) -> str:
    """The first half of a message's offset id (its broker's host, in hex): the same for
    every answer of a broker, so made once."""
    return codec.host_to_bytes(store_host).hex().upper()


class BatchSendResult(Sequence[SendResult]):
    """The outcome of ``send_batch``: one entry per message, in the caller's order,
    kept as arrays and expanded to :class:`SendResult` on access."""

    def __init__(self, parts: list[tuple[_Chunk, MessageQueue, SendAck]], total: int) -> None:
        # of each chunk only what the results are made of: a result outlives its send (a
        # caller may keep thousands of them), and the chunk's records are ~10x its keys
        self._parts: list[_Part] = [
            (c.positions, c.batch.uniq_keys, mq, ack) for c, mq, ack in parts
        ]
        self._total = total
        self._results: list[SendResult] | None = None

    def __len__(self) -> int:
        return self._total

    def _expand(self) -> list[SendResult]:
        if self._results is None:
            out: list[Any] = [None] * self._total
            for positions, uniq_keys, mq, ack in self._parts:
                status = _SEND_STATUS[ack.status._value_]
                prefix = _offset_id_prefix(ack.store_host)
                for pos, uk, qoff, phys in zip(
                    positions.tolist(),
                    uniq_keys,
                    ack.queue_offsets.tolist(),
                    ack.commitlog_offsets.tolist(),
                ):
                    # phys -1: stored long before a retry asked (idempotence): not known
                    offset_id = f"{prefix}{phys:016X}" if phys >= 0 else ""
                    out[pos] = _result(status, uk, offset_id, mq, qoff)
            self._results = out
        return self._results

    def __getitem__(self, index: Any) -> Any:
        return self._expand()[index]

    def part(self, start: int, stop: int) -> BatchSendResult:
        """The results of messages ``start`` to ``stop`` (a list's share of the batch it
        was sent in), as a result of their own; nothing is computed until it is read."""
        return _BatchPart(self, start, stop)

    def __iter__(self) -> Iterator[SendResult]:
        return iter(self._expand())

    def commitlog_offsets_by_broker(self) -> dict[str, list[int]]:
        """Where the messages were stored, per broker name (-1: stored long before a retry
        asked, the offset no longer known); raises ValueError when a batch's status was not
        SEND_OK (stored, but not as durably as asked)."""
        out: dict[str, list[int]] = {}
        for _, _, mq, ack in self._parts:
            status = _SEND_STATUS[ack.status._value_]
            if status is not SendStatus.SEND_OK:
                raise ValueError(f"{mq}: {status.value}")
            out.setdefault(mq.broker_name, []).extend(ack.commitlog_offsets.tolist())
        return out

    def halves_by_broker(self) -> dict[str, list[int | str]]:
        """What names the messages of a transactional send in its commit, per broker
        name: each one's CommitLog offset or, where it is not known (-1 above), its
        message id; raises ValueError as :meth:`commitlog_offsets_by_broker` does."""
        out: dict[str, list[int | str]] = {}
        for _, uniq_keys, mq, ack in self._parts:
            status = _SEND_STATUS[ack.status._value_]
            if status is not SendStatus.SEND_OK:
                raise ValueError(f"{mq}: {status.value}")
            offsets = ack.commitlog_offsets.tolist()
            named: list[int | str] = offsets
            if min(offsets, default=0) < 0 and len(uniq_keys) == len(offsets):
                named = [o if o >= 0 else uk for o, uk in zip(offsets, uniq_keys)]
            out.setdefault(mq.broker_name, []).extend(named)  # -1 left: no id to name it
        return out

    @property
    def queues(self) -> list[tuple[MessageQueue, int, int]]:
        """Per batch sent: (queue, first queue offset, message count)."""
        return [
            (mq, int(ack.queue_offsets[0]), len(ack.queue_offsets)) for _, _, mq, ack in self._parts
        ]


def single_result(chunk: _Chunk, mq: MessageQueue, ack: SendAck) -> SendResult:
    """The :class:`SendResult` of a one-message chunk's answer: what
    ``BatchSendResult([(chunk, mq, ack)], 1)[0]`` gives, without the batch's result."""
    phys = int(ack.commitlog_offsets[0])
    # phys -1: stored long before a retry asked (idempotence): not known
    offset_id = f"{_offset_id_prefix(ack.store_host)}{phys:016X}" if phys >= 0 else ""
    return _result(  # type: ignore[no-any-return]
        _SEND_STATUS[ack.status._value_],
        chunk.batch.uniq_keys[0],
        offset_id,
        mq,
        int(ack.queue_offsets[0]),
    )


_Part = tuple[np.ndarray, Sequence[str], MessageQueue, SendAck]
"""Of one chunk: its positions in the caller's list, unique keys, queue and answer."""


class _BatchPart(BatchSendResult):
    """Messages ``start`` to ``stop`` of a :class:`BatchSendResult`: its results are the
    whole's (expanded once for all its parts), its parts cut from the whole's on demand."""

    def __init__(self, whole: BatchSendResult, start: int, stop: int) -> None:
        self._whole, self._start, self._stop = whole, start, stop
        self._total = stop - start
        self._results = None
        self._cut: list[_Part] | None = None

    def _expand(self) -> list[SendResult]:
        if self._results is None:
            self._results = self._whole._expand()[self._start : self._stop]
        return self._results

    @property
    def _parts(self) -> list[_Part]:  # type: ignore[override]
        if self._cut is None:
            self._cut = _cut(self._whole._parts, self._start, self._stop)
        return self._cut


def _cut(parts: list[_Part], start: int, stop: int) -> list[_Part]:
    """The share of messages ``start`` to ``stop`` in each of ``parts``."""
    out: list[_Part] = []
    for positions, uniq_keys, mq, ack in parts:
        n = len(positions)
        if not n:
            continue
        lo, hi = int(positions[0]), int(positions[-1])
        pick: Any
        if hi - lo + 1 == n:  # a chunk's positions rise: here they run without a gap
            a, b = max(start, lo) - lo, min(stop, hi + 1) - lo
            if a >= b:
                continue
            pick = slice(a, b)
            keys = list(uniq_keys[pick])
        else:
            pick = np.flatnonzero((positions >= start) & (positions < stop))
            if not len(pick):
                continue
            keys = [uniq_keys[i] for i in pick.tolist()]
        offsets = (ack.queue_offsets[pick], ack.commitlog_offsets[pick])
        part_ack = SendAck(ack.status, ack.broker_name, ack.store_host, *offsets)
        out.append((positions[pick] - start, keys, mq, part_ack))
    return out


_QUEUE_ID = struct.Struct(">i")


def _with_queue(batch: EncodedBatch, queue_id: int) -> bytes | np.ndarray:
    """The batch's wire blob bound for ``queue_id`` (the store writes each record's QUEUEID)."""
    return _wire(batch.with_queue(queue_id))


def _wire(*batches: EncodedBatch) -> bytes | np.ndarray:
    """What ``Broker.send`` takes for ``batches`` as one call: the blob, as a ``uint8``
    array when it is large."""
    return _arg(EncodedBatch.wire_of(batches))


def _arg(wire: bytes) -> bytes | np.ndarray:
    """``wire`` as ``Broker.send``'s argument: a ``uint8`` array (read in place on the
    broker) when it is large."""
    if len(wire) >= OUT_OF_BAND_BYTES:
        return np.frombuffer(wire, dtype=np.uint8)
    return wire
