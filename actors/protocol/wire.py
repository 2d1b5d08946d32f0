"""Values that cross Ray between clients and brokers: small, array-backed, one per batch."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from storage.errors import InvalidMessageError
from storage.message import GetStatus, PutStatus, RawGetResult


@dataclass(frozen=True, slots=True)
class PullAnswer(RawGetResult):
    """A pull's answer with RocketMQ's ``suggestWhichBrokerId``: the broker id the consumer
    should pull this queue from next (0 the master, >= 1 a slave, -1 no opinion)."""

    suggest_broker_id: int = -1


OUT_OF_BAND_BYTES = 256 << 10
"""A blob at least this large travels as a ``uint8`` array: Ray passes an array's
buffer out of band, so the receiver reads it in place in the object store instead
of unpickling a copy (a sixth of a broker's time at 1 KiB bodies), and the sender
skips pickling it."""


# what ``Broker.consumer_send_msg_back`` answers for each message it was given
SENT_TO_RETRY = "RETRY"
SENT_TO_DLQ = "DLQ"
NOT_FOUND = "NOT_FOUND"
DLQ_MAX_READ = 4096
"""The most dead letters one ``Broker.read_dlq`` call returns."""


@dataclass(frozen=True, slots=True)
class SendAck:
    """A broker's answer to one batch: per message its queue and commitlog offsets."""

    status: PutStatus
    broker_name: str
    store_host: str
    queue_offsets: np.ndarray
    commitlog_offsets: np.ndarray

    def to_wire(self) -> AckWire:
        """The ack as one msgpack blob: pickling the dataclass and its arrays cost the
        broker and the producer ~0.2 ms a call, and Ray charges each object of an
        answer (a 5-tuple came back ~0.1 ms later than one blob)."""
        return msgpack.packb(
            (
                self.status._value_,  # the member's field: .value is a descriptor call
                self.broker_name,
                self.store_host,
                self.queue_offsets.astype("<i8", copy=False).tobytes(),
                self.commitlog_offsets.astype("<i8", copy=False).tobytes(),
            )
        )

    @classmethod
    def from_wire(cls, wire: AckWire) -> SendAck:
        status, broker_name, store_host, queue_offsets, commitlog_offsets = msgpack.unpackb(wire)
        known = _PUT_STATUS.get(status) if status.__class__ is str else None
        return cls(
            known or PutStatus(status),  # ValueError for an unknown one
            broker_name,
            store_host,
            np.frombuffer(queue_offsets, _LE_I8),
            np.frombuffer(commitlog_offsets, _LE_I8),
        )


def one_ack_wire(
    broker_name: str, store_host: str, queue_offset: int, commitlog_offset: int
) -> AckWire:
    """:meth:`SendAck.to_wire` of a stored single send (``PUT_OK``), from plain ints:
    the same bytes, without the arrays."""
    return msgpack.packb(
        (
            _PUT_OK,
            broker_name,
            store_host,
            _ONE_OFFSET.pack(queue_offset),
            _ONE_OFFSET.pack(commitlog_offset),
        )
    )


_PUT_OK = PutStatus.PUT_OK._value_
_ONE_OFFSET = struct.Struct("<q")
_PUT_STATUS = {s.value: s for s in PutStatus}
_LE_I8 = np.dtype("<i8")  # made once: a dtype given as a string is parsed at each call


AckWire = bytes
"""What ``Broker.send`` returns: :meth:`SendAck.to_wire`."""

PullWire = tuple[str, bytes, int, int, int, int, "bytes | None", int]
"""What ``Broker.pull`` returns: :func:`pull_to_wire`."""


def pull_to_wire(raw: RawGetResult) -> PullWire:
    """A pull's answer as plain values (msgpack, no pickling: ~0.1 ms less a call on
    each end), the broker id a consumer should read from next (-1: no opinion) last.
    Records read as a view of the CommitLog become ``bytes`` here."""
    status, data, *rest = _pull_fields(raw)
    records = data if isinstance(data, bytes) else bytes(data)
    return (status, records, *rest)  # type: ignore[return-value]


def _pull_fields(raw: RawGetResult) -> tuple[Any, ...]:
    sizes = raw.sizes
    return (
        raw.status._value_,
        raw.data,
        raw.count,
        raw.next_offset,
        raw.min_offset,
        raw.max_offset,
        None if sizes is None else np.asarray(sizes, dtype="<i4").tobytes(),
        getattr(raw, "suggest_broker_id", -1),
    )


_GET_STATUS = {s.value: s for s in GetStatus}  # a dict lookup, not Enum.__call__ in Python


def pull_from_wire(wire: PullWire) -> RawGetResult:
    status, data, count, next_offset, min_offset, max_offset, sizes, suggest = wire
    found = _GET_STATUS.get(status) if status.__class__ is str else None
    values = (
        GetStatus(status) if found is None else found,  # the Enum names what is wrong
        data,
        count,
        next_offset,
        min_offset,
        max_offset,
        None if sizes is None else np.frombuffer(sizes, dtype="<i4"),
    )
    if suggest == -1:
        return RawGetResult(*values)
    return PullAnswer(*values, suggest_broker_id=suggest)


# ------------------------------------------------------------ a pull call as two blobs
# Ray costs every argument and every object in an answer: an async no-op method with
# a pull's six arguments took ~0.35 ms more of the actor's CPU than one without,
# one blob ~0.15 ms; four answer tuples ~0.2 ms more than one blob. So the clients'
# pulls (``Broker.pull_packed``) send their arguments and get their answers as one
# msgpack blob each.

PullRequest = tuple[str, list[tuple[str, int, int]], int, "str | None", float, str]
"""``(group, [(topic, queue_id, offset), ...], max_count, tags, suspend_s, client_id)``."""


def pull_request_to_wire(
    group: str,
    requests: Sequence[tuple[str, int, int]],
    max_count: int,
    tags: str | None,
    suspend_s: float,
    client_id: str,
) -> bytes:
    return msgpack.packb((group, list(requests), max_count, tags, suspend_s, client_id))


def pull_request_from_wire(blob: bytes | memoryview) -> PullRequest:
    """The request :func:`pull_request_to_wire` packed; anything else is refused whole."""
    try:
        group, requests, max_count, tags, suspend_s, client_id = msgpack.unpackb(blob)
        triples = [(str(t), int(q), int(o)) for t, q, o in requests]
    except Exception as exc:  # noqa: BLE001 - whatever the bytes were, one clear error
        raise InvalidMessageError(f"not a packed pull request: {exc}") from None
    if not (
        isinstance(group, str)
        and isinstance(max_count, int)
        and (tags is None or isinstance(tags, str))
        and isinstance(suspend_s, (int, float))
        and isinstance(client_id, str)
    ):
        raise InvalidMessageError("a packed pull request with fields of the wrong types")
    return group, triples, max_count, tags, float(suspend_s), client_id


def pulls_to_wire(answers: Sequence[RawGetResult]) -> bytes | list[Any]:
    """Several pulls' answers (:func:`pull_to_wire` each) as one blob: a 4-byte length,
    the msgpack of every answer with its records replaced by their length, then the
    records of each. Records stay out of msgpack: packing 4 MiB of them into its
    growing buffer took a quarter of a broker's CPU when consumers pulled 4 x 4096.

    A large answer is not joined at all: it goes as ``[length + msgpack, records as a
    uint8 array for each answer]``. Ray pickles the arrays' buffers out of band, copying
    each once, straight into the object store, where a join would copy them all once
    more (~3.3 MB for 4 x 4096 records of 100 B) and ``bytes`` would be pickled in band."""
    heads, records = [], []
    for raw in answers:
        status, data, *rest = _pull_fields(raw)  # data may be a view of the CommitLog
        heads.append((status, len(data), *rest))
        records.append(data)
    head = msgpack.packb(heads)
    prefix = len(head).to_bytes(4, "big") + head
    if sum(map(len, records)) + len(prefix) >= OUT_OF_BAND_BYTES:
        return [prefix, *(np.frombuffer(data, dtype=np.uint8) for data in records)]
    return b"".join([prefix, *records])


def pulls_from_wire(wire: bytes | list[Any], *, copy: bool = True) -> list[RawGetResult]:
    """The answers :func:`pulls_to_wire` packed, in either form; records come out as
    ``bytes``, or with ``copy=False`` those of a large answer as read-only views of the
    arrays Ray handed over (which they keep in its object store while held)."""
    if isinstance(wire, list):
        prefix, parts = memoryview(wire[0]), wire[1:]
    else:
        prefix, parts = memoryview(wire), None
    n = int.from_bytes(prefix[:4], "big")
    heads: list[Any] = msgpack.unpackb(prefix[4 : 4 + n])
    if parts is not None and len(parts) != len(heads):
        raise InvalidMessageError(f"{len(heads)} pull answers with {len(parts)} record parts")
    out, pos = [], 4 + n
    for i, (status, length, *rest) in enumerate(heads):
        data: bytes | memoryview
        if parts is None:
            data = bytes(prefix[pos : pos + length])
            pos += length
        else:
            view = memoryview(parts[i]).cast("B")
            data = view.tobytes() if copy else view
        if len(data) != length:
            raise InvalidMessageError(
                f"pull answer {i}: {len(data)} bytes of records, not {length}"
            )
        out.append(pull_from_wire((status, data, *rest)))  # type: ignore[arg-type]
    return out
