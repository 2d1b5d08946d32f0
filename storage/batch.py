"""The batch wire form: a producer's messages encoded once into records laid out back to
back (``storage.record``'s layout, store-side fields zeroed), with what the store needs
to index them without re-parsing (:class:`EncodedBatch`), and its one-blob form on the
wire (``to_bytes`` / ``from_bytes``).

A producer encodes a batch once (:func:`encode_batch`) with the store-side
fields (queue offset, physical offset, store timestamp, store host) zeroed; the
store patches those in place and writes the batch with one copy. A batch from the
wire is checked (:meth:`EncodedBatch.check_structure`, :func:`verify_records`) before
the store trusts its sizes.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from . import record
from ._crc import crc32, crc32_address
from .errors import InvalidMessageError
from .java_hash import (
    java_hash,
    java_hashes,
)
from .message import Message
from .message_id import (
    UniqueKeyGenerator,
    default_generator,
    host_to_bytes,
)
from .properties import (
    KEY_SEP,
    MAX_PROPERTIES_LEN,
    NAME_VALUE_SEP,
    PROP_PRODUCER_SEQ,
    PROP_TIMER_DELAY_SEC,
    PROP_TIMER_DELIVER_MS,
    PROP_TRAN_MSG,
    PROP_UNIQ_KEY,
    PROPERTY_SEP,
    SYSTEM_PROPS,
    check_property_text,
    encode_properties,
    normalize_keys,
)
from .record import (
    _I32,
    _SIZE_MAGIC,
    CLIENT_SYSFLAGS,
    FIXED_LEN,
    HEADER,
    MAGIC,
    MAX_TOPIC_LEN,
    OFF_BODYLEN,
    OFF_MAGIC,
    OFF_TOTALSIZE,
    validate_queue_id,
    validate_topic,
    windows,
)
from .seq_slots import (
    _SLOT_NAME,
    bound_slot,
    parse_seq_value,
    seq_pairs,
    seq_value,
    validate_producer_id,
)

_LE_I2, _LE_I4, _LE_I8 = np.dtype("<i2"), np.dtype("<i4"), np.dtype("<i8")
# an encoded batch on the wire: records, keys, topics, unique keys and delays counted,
# the producer id's length, its sequence runs, its epoch, and flags
_WIRE_HEAD = struct.Struct(">iiiiiiiii")
_WIRE_TRANSACTIONAL = 1  # a bit of the head's flags
_WIRE_TIMER = 2


def _marked(record: memoryview, value: str) -> bytes:
    """``record`` with ``PRODUCER_SEQ=value`` added to its properties (the last field,
    so the record is its head, the new lengths and the extra bytes joined once)."""
    extra = f"{PROP_PRODUCER_SEQ}{NAME_VALUE_SEP}{value}{PROPERTY_SEP}".encode("ascii")
    at = HEADER.size + _I32.unpack_from(record, OFF_BODYLEN)[0]
    at += 1 + record[at]  # the topic
    prop_len = (record[at] << 8) | record[at + 1]
    if prop_len + len(extra) > MAX_PROPERTIES_LEN:
        raise InvalidMessageError(
            f"properties of {prop_len} bytes leave no room for {PROP_PRODUCER_SEQ}"
        )
    return b"".join(
        (
            _I32.pack(len(record) + len(extra)),  # TOTALSIZE, the record's first field
            record[OFF_TOTALSIZE + 4 : at],
            (prop_len + len(extra)).to_bytes(2, "big"),
            record[at + 2 :],
            extra,
        )
    )


_JOINED_BYTES = 16 << 10
"""A lone record up to this size goes to the wire as one joined buffer
(:meth:`EncodedBatch.wire_parts`): thirteen small parts cost its writer more than the
copy (sized one by one, viewed one by one); a larger one is left for the writer's own
copy (a frame's join, a shared ring)."""

_SINGLE_QUEUE_IDS: dict[int, np.ndarray] = {}
"""Read-only one-element queue id arrays by id: a single message bound for its queue
(the most common send) shares one instead of allocating it each time."""


def shared_one(cache: dict[int, np.ndarray], value: int, dtype: type) -> np.ndarray:
    """A read-only one-element array of ``value``, shared through ``cache`` (at most
    4096 kept): what a lone message's batch holds per record, made once, not per send."""
    one = cache.get(value)
    if one is None:
        one = np.full(1, value, dtype=dtype)
        one.flags.writeable = False
        if len(cache) < 4096:
            cache[value] = one
    return one


def _props_span(data: bytes | memoryview, start: int) -> tuple[int, int]:
    """(offset, length) of the properties of the checked record at ``start``."""
    at = start + HEADER.size + _I32.unpack_from(data, start + OFF_BODYLEN)[0]
    at += 1 + data[at]  # the topic
    return at + 2, (data[at] << 8) | data[at + 1]


def _queue_ids(queue_id: int, n: int) -> np.ndarray:
    if n != 1:
        return np.full(n, queue_id, dtype=np.int32)
    return shared_one(_SINGLE_QUEUE_IDS, queue_id, np.int32)


# ---------------------------------------------------------------- encoding


def _keys_raw(keys: Sequence[str]) -> bytes:
    return keys.raw if isinstance(keys, PackedKeys) else "\x00".join(keys).encode("ascii")


class PackedKeys(Sequence[str]):
    """Unique keys kept as one ``\x00``-separated ASCII ``bytes``, split and decoded
    only when read.

    A broker stores a batch without ever looking at its keys one by one (it does
    not even decode them: 16 384 keys are 540 KB of text); this keeps them off the
    per-message path on both ends of the wire.
    """

    __slots__ = ("_keys", "raw")

    def __init__(self, raw: bytes) -> None:
        if not raw.isascii():
            raise InvalidMessageError("unique keys must be ASCII")
        self.raw = raw
        self._keys: list[str] | None = None

    def _split(self) -> list[str]:
        if self._keys is None:
            self._keys = self.raw.decode("ascii").split("\x00") if self.raw else []
        return self._keys

    def __len__(self) -> int:
        return len(self._split())

    def __getitem__(self, index: Any) -> Any:
        return self._split()[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self._split())

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class EncodedBatch:
    """Records laid out back to back with store-side fields zeroed, and what the
    store needs to index them without re-parsing: per record its size, topic
    (an index into ``topics``), queue id and tag hash; per index key its hash and
    the record it belongs to. One object crosses Ray per batch (``to_bytes``)."""

    data: bytes | memoryview  # a view of the wire blob on the broker (not copied)
    sizes: np.ndarray  # int32, one per record
    topics: tuple[str, ...]
    topic_idx: np.ndarray  # int16, one per record
    queue_ids: np.ndarray  # int32
    tag_codes: np.ndarray  # int64
    key_hashes: np.ndarray  # int32 (java hash of "topic#key")
    key_owner: np.ndarray  # int32 record index of each key
    uniq_keys: Sequence[str]
    delay_levels: np.ndarray | None = None  # int32 per record when any message is delayed
    # an idempotent producer's batch (storage.producer_state): who sent it, and per run
    # of records bound for one queue, (index of its first record, its first sequence)
    producer_id: str | None = None
    producer_epoch: int = 0
    seq_runs: np.ndarray | None = None  # int64, shape (runs, 2)
    # a message carries TRAN_MSG=true: the store keeps it as a half message (set by
    # encode_batch, so the broker does not scan every batch's bytes for it)
    transactional: bool = False
    # a message asks for a delivery time (TIMER_DELIVER_MS / TIMER_DELAY_SEC): the store
    # keeps it in the timer wheel (storage.timer); set by encode_batch, as above
    timer: bool = False
    checked: bool = field(default=False, compare=False)  # structure already verified
    # where the encoder reserved the first record's PRODUCER_SEQ value (``seq_slot``):
    # (its byte offset in ``data``, then a writable view, and its width); None: no slot
    seq_slot_at: tuple[int, int] | None = field(default=None, compare=False)
    _body_range: tuple[int, int] | None = field(
        default=None, init=False, compare=False, repr=False
    )  # (min, max) BODYLEN, once a check walked the records
    _uniform: bool | None = field(default=None, init=False, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.sizes)

    def with_queue(self, queue_id: int) -> EncodedBatch:
        """The same records bound for ``queue_id`` (the store writes each record's
        QUEUEID field from ``queue_ids``, so the data is shared, not copied)."""
        validate_queue_id(queue_id)
        return self._evolve(queue_ids=_queue_ids(queue_id, len(self.sizes)))

    def _evolve(self, **changes: Any) -> EncodedBatch:
        """``dataclasses.replace(self, **changes)`` at a fifth of its cost (a single
        send binds its batch once: ``replace`` re-runs ``__init__`` with every field),
        with the body range to be found again, as ``replace`` resets it."""
        new = object.__new__(EncodedBatch)
        fields = new.__dict__
        fields.update(self.__dict__)
        fields["_body_range"] = fields["_uniform"] = None
        if "data" in changes:  # other bytes: a reserved slot is not where it was
            fields["seq_slot_at"] = None
        fields.update(changes)
        return new

    def with_sequence(
        self, producer_id: str, epoch: int, seq: int, queue_id: int | None = None
    ) -> EncodedBatch:
        """The same records as one idempotent run: ``producer_id`` at ``epoch`` numbers
        them ``seq, seq + 1, ...`` on the queue they are bound for (``queue_id``: bound
        for it here, as :meth:`with_queue` does). The first record carries
        ``PRODUCER_SEQ`` (so recovery and slaves rebuild the producer state from the
        CommitLog).

        A batch encoded with a slot for ``producer_id`` (:func:`seq_slot`) is bound in
        place: the slot's few bytes are overwritten and the records shared, not copied.
        So a batch bound again rewrites what its earlier binding sent: a producer binds
        a chunk again only when that binding will not be sent (again). Any other batch
        is copied once, its first record marked."""
        validate_producer_id(producer_id)
        if not 0 <= epoch <= 0x7FFFFFFF or not 0 <= seq < 1 << 62:
            raise InvalidMessageError(f"producer epoch={epoch} / sequence={seq}: out of range")
        n = len(self.sizes)
        if self.seq_slot_at is not None:  # reserved by the encoder: patched in place
            at, width = self.seq_slot_at
            data = self.data
            value = seq_value(producer_id, epoch, seq, n, width)
            if (
                not isinstance(data, memoryview)
                or data.readonly
                or len(value) != width
                or data[at - len(_SLOT_NAME) : at] != _SLOT_NAME
                or data[at + width] != 2
            ):
                raise InvalidMessageError(
                    f"encoded batch: its PRODUCER_SEQ slot of {width} bytes does not fit "
                    f"producer {producer_id!r} (reserved for another id?)"
                )
            data[at : at + width] = value
            # _evolve's work without its keywords: a single send binds its batch here
            new = object.__new__(EncodedBatch)
            fields = new.__dict__
            fields.update(self.__dict__)
            fields["_body_range"] = fields["_uniform"] = None
            if queue_id is not None:
                fields["queue_ids"] = _queue_ids(validate_queue_id(queue_id), n)
            fields["producer_id"] = producer_id
            fields["producer_epoch"] = epoch
            runs = np.zeros((1, 2), dtype=np.int64)  # one run, from record 0
            runs[0, 1] = seq
            fields["seq_runs"] = runs
            return new
        view = memoryview(self.data).cast("B")
        first = int(self.sizes[0])
        record = _marked(view[:first], f"{producer_id},{epoch},{seq},{n}")
        sizes = self.sizes.astype(np.int32)  # a copy
        sizes[0] = len(record)
        queue_ids = self.queue_ids
        if queue_id is not None:
            validate_queue_id(queue_id)
            queue_ids = _queue_ids(queue_id, n)
        return self._evolve(
            data=record + view[first:] if n > 1 else record,
            sizes=sizes,
            queue_ids=queue_ids,
            producer_id=producer_id,
            producer_epoch=epoch,
            seq_runs=np.array(((0, seq),), dtype=np.int64),
            checked=False,
        )

    def with_runs(
        self, producer_id: str, epoch: int, runs: Sequence[tuple[int, int, int]]
    ) -> EncodedBatch:
        """The same records as idempotent runs ``(first record, count, first sequence)``
        (in order, covering every record), each run's first record marked."""
        validate_producer_id(producer_id)
        if not 0 <= epoch <= 0x7FFFFFFF or any(not 0 <= s < 1 << 62 for _, _, s in runs):
            raise InvalidMessageError(f"producer epoch={epoch} / sequences: out of range")
        view = memoryview(self.data).cast("B")
        starts = np.zeros(len(self.sizes) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=starts[1:])
        sizes = self.sizes.astype(np.int32, copy=True)
        parts: list[bytes | memoryview] = []
        done = 0
        for first, count, seq in runs:
            at, size = int(starts[first]), int(self.sizes[first])
            parts.append(view[done:at])
            record = _marked(view[at : at + size], f"{producer_id},{epoch},{seq},{count}")
            sizes[first] = len(record)
            parts.append(record)
            done = at + size
        parts.append(view[done:])
        return self._evolve(
            data=b"".join(parts),
            sizes=sizes,
            producer_id=producer_id,
            producer_epoch=epoch,
            seq_runs=np.array([(a, s) for a, _, s in runs], dtype=np.int64).reshape(-1, 2),
            checked=False,
        )

    def runs(self) -> list[tuple[int, int, int]]:
        """An idempotent batch's runs as ``(first record, record count, first sequence)``."""
        if self.seq_runs is None:
            return []
        if len(self.seq_runs) == 1:  # the usual batch: one run, of all its records
            return [(0, len(self.sizes), int(self.seq_runs[0, 1]))]
        starts = self.seq_runs[:, 0].tolist()
        stops = [*starts[1:], len(self.sizes)]
        return [(a, b - a, s) for a, b, s in zip(starts, stops, self.seq_runs[:, 1].tolist())]

    def select(self, spans: Sequence[tuple[int, int]]) -> EncodedBatch:
        """The records in ``spans`` (``(first, count)`` each, in order, not overlapping)
        as a batch of their own, runs and keys kept with their records."""
        ends = np.concatenate(([0], np.cumsum(self.sizes, dtype=np.int64)))
        view = memoryview(self.data).cast("B")
        pick = np.concatenate([np.arange(a, a + c) for a, c in spans]).astype(np.int64)
        new_index = np.full(len(self.sizes), -1, dtype=np.int64)
        new_index[pick] = np.arange(len(pick))
        owners = new_index[self.key_owner] if len(self.key_owner) else self.key_owner
        keep_key = owners >= 0
        runs = None
        if self.seq_runs is not None:
            kept = [(int(new_index[a]), s) for a, _, s in self.runs() if new_index[a] >= 0]
            runs = np.array(kept, dtype=np.int64).reshape(-1, 2)
        uniq = list(self.uniq_keys)
        return self._evolve(
            data=b"".join(view[int(ends[a]) : int(ends[a + c])] for a, c in spans),
            sizes=self.sizes[pick],
            topic_idx=self.topic_idx[pick],
            queue_ids=self.queue_ids[pick],
            tag_codes=self.tag_codes[pick],
            key_hashes=self.key_hashes[keep_key],
            key_owner=owners[keep_key].astype(np.int32),
            uniq_keys=[uniq[i] for i in pick.tolist()] if uniq else uniq,
            delay_levels=None if self.delay_levels is None else self.delay_levels[pick],
            seq_runs=runs,
            checked=False,
        )

    @classmethod
    def concat(cls, batches: Sequence[EncodedBatch]) -> EncodedBatch:
        """Several batches as one, records in order (each keeps its topic and queue):
        what a producer sends when batches for one broker queued up behind a call."""
        if len(batches) == 1:
            return batches[0]
        return cls._merged(batches, b"".join(b.data for b in batches))

    @classmethod
    def wire_of(cls, batches: Sequence[EncodedBatch]) -> bytes:
        """``concat(batches).to_bytes()``, with each batch's records copied once, straight
        into the blob (a send lane's merged call: 16 384 records are ~3 MiB at 100 B)."""
        return b"".join(cls.wire_parts(batches))

    @classmethod
    def wire_parts(cls, batches: Sequence[EncodedBatch]) -> list[Any]:
        """The buffers that, back to back, are ``wire_of(batches)``: for a writer that
        copies them somewhere itself (a frame's join, a producer's shared ring). Each is
        a contiguous byte buffer; ``len`` of an array counts items: size them with
        ``memoryview(part).nbytes`` (``actors.protocol.frames.nbytes``)."""
        if len(batches) == 1:
            one = batches[0]
            if len(one.sizes) == 1 and len(one.data) <= _JOINED_BYTES:
                # a lone small message: one buffer, joined here (a writer copies it whole)
                return [b"".join((*one._wire_head(), one.data))]
            return [*one._wire_head(), one.data]
        merged = cls._merged(batches, b"")
        return [*merged._wire_head(), *(b.data for b in batches)]

    @classmethod
    def _merged(cls, batches: Sequence[EncodedBatch], data: bytes) -> EncodedBatch:
        topics = tuple(dict.fromkeys(t for b in batches for t in b.topics))
        index = {t: i for i, t in enumerate(topics)}
        counts = np.cumsum([0] + [len(b) for b in batches[:-1]], dtype=np.int32)
        delays = None
        if any(b.delay_levels is not None for b in batches):
            delays = np.concatenate(
                [
                    np.zeros(len(b), np.int32) if b.delay_levels is None else b.delay_levels
                    for b in batches
                ]
            )
        producers = {b.producer_id for b in batches}
        if len(producers) > 1:
            raise InvalidMessageError(f"batches of several producers merged: {producers}")
        runs = None
        if batches[0].seq_runs is not None:
            if any(b.seq_runs is None for b in batches):
                raise InvalidMessageError("idempotent and other batches merged")
            # one array from lists: two small arrays a batch cost more than the merge
            runs = np.array(
                [
                    (first + a, seq)
                    for b, first in zip(batches, counts.tolist())
                    for a, seq in b.seq_runs.tolist()  # type: ignore[union-attr]
                ],
                dtype=np.int64,
            ).reshape(-1, 2)
        return cls(
            data=data,
            producer_id=batches[0].producer_id,
            producer_epoch=max(b.producer_epoch for b in batches),
            transactional=any(b.transactional for b in batches),
            timer=any(b.timer for b in batches),
            seq_runs=runs,
            sizes=np.concatenate([b.sizes for b in batches]),
            topics=topics,
            topic_idx=np.concatenate(
                [np.array([index[t] for t in b.topics], np.int16)[b.topic_idx] for b in batches]
            ),
            queue_ids=np.concatenate([b.queue_ids for b in batches]),
            tag_codes=np.concatenate([b.tag_codes for b in batches]),
            key_hashes=np.concatenate([b.key_hashes for b in batches]),
            key_owner=np.concatenate(
                [b.key_owner + first for b, first in zip(batches, counts.tolist())]
            ).astype(np.int32),
            uniq_keys=PackedKeys(b"\x00".join(_keys_raw(b.uniq_keys) for b in batches)),
            delay_levels=delays,
            checked=all(b.checked for b in batches),
        )

    @property
    def uniform(self) -> bool:
        """One topic and one queue: offsets can be assigned as a range (found once: an
        idempotent batch's check and its put both ask)."""
        if self._uniform is None:
            low, high = _min_max(self.queue_ids) if len(self.topics) == 1 else (0, 1)
            object.__setattr__(self, "_uniform", low == high)
        return bool(self._uniform)

    def to_bytes(self) -> bytes:
        return b"".join([*self._wire_head(), self.data])

    def _wire_head(self) -> list[Any]:
        """Everything :meth:`to_bytes` puts before the records: byte buffers (bytes, or
        contiguous little-endian arrays; typed ``Any``, as the typing of Python 3.11
        does not know numpy's arrays as buffers)."""
        topics = "\x00".join(self.topics).encode("utf-8")
        uniq = _keys_raw(self.uniq_keys)
        delays = self.delay_levels
        producer = (self.producer_id or "").encode("ascii")
        runs = self.seq_runs
        head = _WIRE_HEAD.pack(
            len(self.sizes),
            len(self.key_hashes),
            len(topics),
            len(uniq),
            0 if delays is None else len(delays),
            len(producer),
            0 if runs is None else len(runs),
            self.producer_epoch,
            (_WIRE_TRANSACTIONAL if self.transactional else 0) | (_WIRE_TIMER if self.timer else 0),
        )
        return [
            head,
            topics,
            uniq,
            producer,
            # the arrays themselves where they already are as the wire has them: whoever
            # writes the parts copies them once (a frame's join, a shared ring)
            _wire_array(self.sizes, _LE_I4),
            _wire_array(self.topic_idx, _LE_I2),
            _wire_array(self.queue_ids, _LE_I4),
            _wire_array(self.tag_codes, _LE_I8),
            _wire_array(self.key_hashes, _LE_I4),
            _wire_array(self.key_owner, _LE_I4),
            b"" if delays is None else _wire_array(delays, _LE_I4),
            b"" if runs is None else _wire_array(runs, _LE_I8),
        ]

    @classmethod
    def from_bytes(cls, blob: bytes | memoryview | np.ndarray) -> EncodedBatch:
        """The batch :meth:`to_bytes` made, from any byte buffer (a ``uint8`` array Ray
        hands over without copying works too). The records are not copied: ``data``
        is a view of ``blob``.

        A send of the usual shape is parsed and checked by ``storage._native.parse_send``
        in one call (a broker decodes one per request); anything else, and every batch
        it refuses, takes the Python path below, which names the error."""
        native = record._native
        parse = getattr(native, "parse_send", None) if native is not None else None
        if parse is not None:
            got = parse(blob, CLIENT_SYSFLAGS, crc32_address, MAX_TOPIC_LEN)
            if got is not None:
                return _from_parsed(blob, got)
        try:
            view = memoryview(blob).cast("B")  # type: ignore[arg-type]  # ndarray is a buffer
            n, k, lt, lu, d, lp, r, epoch, flags = _WIRE_HEAD.unpack_from(view, 0)
            if min(n, k, lt, lu, d, lp, r, epoch) < 0 or d not in (0, n) or r > n:
                raise ValueError("bad counts")
            if (lp == 0) != (r == 0):
                raise ValueError("sequence runs without a producer, or the reverse")
            pos = _WIRE_HEAD.size
            topics = tuple(str(view[pos : pos + lt], "utf-8").split("\x00"))
            pos += lt
            uniq = PackedKeys(bytes(view[pos : pos + lu]))
            pos += lu
            producer = str(view[pos : pos + lp], "ascii") if lp else None
            pos += lp
            batch = _wire_batch(view, pos, (n, k, d, r), topics, uniq, producer, epoch, flags)
        except (struct.error, ValueError, TypeError, UnicodeDecodeError) as exc:
            raise InvalidMessageError(f"malformed encoded batch: {exc}") from exc
        batch.check_structure()
        return batch

    def check_structure(self) -> None:
        """Check the batch as the store trusts it, once: arrays that agree, and every
        record as :func:`verify_records` checks it. Raises ``InvalidMessageError``."""
        if self.checked:
            return
        n = len(self.sizes)
        if n == 0:
            raise InvalidMessageError("empty batch")
        if not (len(self.topic_idx) == len(self.queue_ids) == len(self.tag_codes) == n):
            raise InvalidMessageError("encoded batch: per-record arrays differ in length")
        if len(self.key_hashes) != len(self.key_owner):
            raise InvalidMessageError("encoded batch: key arrays differ in length")
        if self.delay_levels is not None and (
            len(self.delay_levels) != n or _min_max(self.delay_levels)[0] < 0
        ):
            raise InvalidMessageError("encoded batch: bad delay levels")
        if _min_max(self.queue_ids)[0] < 0:
            raise InvalidMessageError("encoded batch: negative queue id")
        for topic in self.topics:
            validate_topic(topic)
        if len(self.key_owner):
            low, high = _min_max(self.key_owner)
            if low < 0 or high >= n:
                raise InvalidMessageError("encoded batch: key owner out of range")
        if self.seq_runs is not None:
            self._check_runs(n)
        # record sizes adding up to the data and topic indexes in range: checked there
        low, high, marks = _verify_records(self.data, self.sizes, self.topics, self.topic_idx)
        object.__setattr__(self, "_body_range", (low, high))
        self._check_seq_marks(marks)
        object.__setattr__(self, "checked", True)

    def _check_seq_marks(self, pairs: int | None) -> None:
        """The numbering, told twice, must agree (the records' structure checked).

        An idempotent batch numbers its runs in its header (``producer_id``,
        ``producer_epoch``, ``seq_runs``), which the put de-duplicates by, and in the
        ``PRODUCER_SEQ`` of each run's first record, which recovery and slaves rebuild
        the producer table from (``storage.producer_state``). Were they to differ, a
        retry would be recognised by one broker and not by another after a restart or
        a failover. So each run's first record carries exactly one ``PRODUCER_SEQ``,
        read as a replay reads it (:func:`parse_seq_value`) to the header's (id, epoch,
        first sequence, count), and no other record carries one: none at all in a batch
        that numbers no run.

        ``pairs``: how many ``PRODUCER_SEQ`` properties the records hold in all, counted
        by the records' check as it walked their properties (:func:`_verify_records`).
        The first records' properties are read where they are; as many pairs as runs
        then means none elsewhere, so a good batch costs a few scalar reads per run.
        Otherwise (or with no count: a C module built before it counted them) the other
        records are searched, to name the one that carries a pair. Raises
        ``InvalidMessageError``.
        """
        data, sizes = self.data, self.sizes
        if pairs == 1 and self.seq_runs is not None and len(self.seq_runs) == 1:
            # the usual batch: one run, marked by the slot our encoders end the first
            # record's properties with; the one pair of the batch, so nothing else to read
            assert self.producer_id is not None
            mark = bound_slot(
                self.producer_id, self.producer_epoch, int(self.seq_runs[0, 1]), len(sizes)
            )
            at, length = _props_span(data, 0)
            end, m = at + length, len(mark)
            if (
                m <= length
                and bytes(data[end - m : end]) == mark
                and (m == length or data[end - m - 1] == 2)
            ):
                return
        runs = self.runs()
        ends: np.ndarray | None = None
        if runs:
            if len(runs) == 1:  # the usual batch: one run, from record 0
                starts = [0]
            else:
                ends = np.cumsum(sizes, dtype=np.int64)
                firsts = [first for first, _, _ in runs]
                starts = (ends[firsts] - sizes[firsts]).tolist()
            for (first, count, seq), start in zip(runs, starts):
                at, length = _props_span(data, start)
                props = bytes(data[at : at + length])
                marks = seq_pairs(props)
                want = (self.producer_id, self.producer_epoch, seq, count)
                if len(marks) != 1 or marks[0][1] == length:
                    raise InvalidMessageError(
                        f"encoded batch: record {first} starts a run (producer {want[0]!r}, "
                        f"epoch {want[1]}, first sequence {want[2]}, count {want[3]}) but "
                        f"carries {len(marks)} PRODUCER_SEQ properties: it must carry one, "
                        "closed by \\x02"
                    )
                value = props[marks[0][0] : marks[0][1]]
                try:
                    got: tuple[str, int, int, int] | None = parse_seq_value(value)
                except ValueError:
                    got = None
                if got != want:
                    raise InvalidMessageError(
                        f"encoded batch: record {first}: PRODUCER_SEQ={value!r} differs from "
                        f"the batch's numbering of its run: producer {want[0]!r}, epoch "
                        f"{want[1]}, first sequence {want[2]}, count {want[3]}"
                    )
        if pairs == len(runs):  # one on each run's first record: none elsewhere
            return
        # no other record: a single run's first record is done, the search starts after it
        hay = data if isinstance(data, bytes) else bytes(data)
        hit = hay.find(_SLOT_NAME, int(sizes[0]) if len(runs) == 1 else 0)
        numbered = {first for first, _, _ in runs}
        while hit >= 0:
            if ends is None:
                ends = np.cumsum(sizes, dtype=np.int64)
            i = int(np.searchsorted(ends, hit, side="right"))
            end = int(ends[i])
            resume = end  # a run's first record is checked above: on with the next
            if i not in numbered:
                at, length = _props_span(hay, end - int(sizes[i]))
                if hit < at:  # in the body: on with its properties
                    resume = at
                elif seq_pairs(hay[at : at + length]):
                    what = "numbers no run" if not runs else "numbers no run there"
                    raise InvalidMessageError(
                        f"encoded batch: record {i} carries a PRODUCER_SEQ property, but the "
                        f"batch {what}: only an idempotent producer's numbering puts one, on "
                        "the first record of each run"
                    )
            hit = hay.find(_SLOT_NAME, resume)
        if pairs is not None:  # counted, but not found: the two readings differ
            raise InvalidMessageError(
                f"encoded batch: its records hold {pairs} PRODUCER_SEQ properties for "
                f"{len(runs)} numbered runs"
            )

    def _check_runs(self, n: int) -> None:
        """Runs that start at record 0, in order, each on one topic and queue."""
        runs = self.seq_runs
        assert runs is not None
        validate_producer_id(self.producer_id)
        if runs.ndim != 2 or runs.shape[1] != 2 or not len(runs):
            raise InvalidMessageError("encoded batch: sequence runs are not (start, seq) pairs")
        if len(runs) == 1:  # the usual batch: one run, of the whole batch
            start, seq = runs[0].tolist()
            if start != 0 or seq < 0:
                raise InvalidMessageError("encoded batch: sequence run out of range")
            if n > 1 and not self.uniform:
                raise InvalidMessageError("encoded batch: a sequence run spans two queues")
            return
        starts = runs[:, 0]
        if starts[0] != 0 or starts[-1] >= n or (len(starts) > 1 and (np.diff(starts) <= 0).any()):
            raise InvalidMessageError("encoded batch: sequence runs out of order or range")
        if (runs[:, 1] < 0).any():
            raise InvalidMessageError("encoded batch: negative sequence")
        for a, c, _ in self.runs():
            if c > 1 and (
                (self.queue_ids[a : a + c] != self.queue_ids[a]).any()
                or (self.topic_idx[a : a + c] != self.topic_idx[a]).any()
            ):
                raise InvalidMessageError("encoded batch: a sequence run spans two queues")

    def body_range(self) -> tuple[int, int]:
        """(min, max) BODYLEN of the records (the structure must be checked)."""
        if self._body_range is None:
            object.__setattr__(self, "_body_range", body_length_range(self.data, self.sizes))
        assert self._body_range is not None
        return self._body_range


def _wire_array(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values`` as the wire's little-endian ``dtype``, contiguous: the array itself
    when it already is (no copy), else a converted copy."""
    if values.dtype == dtype and values.flags.c_contiguous:
        return values
    return np.ascontiguousarray(values, dtype=dtype)


def _wire_batch(
    view: memoryview,
    at: int,
    counts: tuple[int, int, int, int],
    topics: tuple[str, ...],
    uniq: PackedKeys,
    producer: str | None,
    epoch: int,
    flags: int,
    checked: bool = False,
) -> EncodedBatch:
    """The batch of a send's wire form whose head was read: the eight arrays laid back
    to back from ``at`` (sizes, topic indexes, queue ids, tag codes, key hashes, key
    owners, delay levels, sequence runs; ``counts`` = records, keys, delays, runs), each
    a view of ``view`` (``np.ndarray`` over it: ``np.frombuffer``'s argument parsing
    costs 4x more), and the records after them. ``ValueError`` when the counts reach
    past the buffer."""
    n, k, d, r = counts
    qids_at = at + 6 * n
    tags_at = qids_at + 4 * n
    hashes_at = tags_at + 8 * n
    owners_at = hashes_at + 4 * k
    delays_at = owners_at + 4 * k
    runs_at = delays_at + 4 * d
    data_at = runs_at + 16 * r
    if data_at > len(view):
        raise ValueError("truncated")
    return new_batch(
        view[data_at:],
        np.ndarray((n,), _LE_I4, view, at),
        topics,
        np.ndarray((n,), _LE_I2, view, at + 4 * n),
        np.ndarray((n,), _LE_I4, view, qids_at),
        np.ndarray((n,), _LE_I8, view, tags_at),
        np.ndarray((k,), _LE_I4, view, hashes_at),
        np.ndarray((k,), _LE_I4, view, owners_at),
        uniq,
        np.ndarray((d,), _LE_I4, view, delays_at) if d else None,
        producer,
        epoch,
        np.ndarray((r, 2), _LE_I8, view, runs_at) if r else None,
        bool(flags & _WIRE_TRANSACTIONAL),
        bool(flags & _WIRE_TIMER),
        checked=checked,
    )


def _from_parsed(blob: bytes | memoryview | np.ndarray, got: tuple[Any, ...]) -> EncodedBatch:
    """:meth:`EncodedBatch.from_bytes` of what ``parse_send`` found and checked in
    ``blob``: the same batch the Python path makes, its structure checked."""
    n, k, d, r, epoch, flags, topics, uniq, producer, at, _data_at, low, high = got
    if producer is not None:  # its form: the one check parse_send leaves to Python
        validate_producer_id(producer)
    view = memoryview(blob).cast("B")  # type: ignore[arg-type]  # ndarray is a buffer
    batch = _wire_batch(
        view, at, (n, k, d, r), topics, PackedKeys(uniq), producer, epoch, flags, checked=True
    )
    batch.__dict__["_body_range"] = (low, high)
    return batch


class OneSend(NamedTuple):
    """A send of one plain record, as :func:`parse_send_one` read it from the wire: what
    the store's single put (``MessageStore.put_one_send``) needs, in plain values, with
    no batch object and no arrays. Checked as ``EncodedBatch.check_structure`` checks a
    batch: the record (its CRC, fields and topic), its key owner, its numbering."""

    topic: str
    queue_id: int
    tag_code: int
    data: memoryview
    """The record's bytes (a view of the request's body)."""
    body_len: int
    key_hashes: list[int]
    """``IndexFile`` hashes of its keys (``index_key_hash``'s masking done)."""
    producer_id: str | None
    producer_epoch: int
    seq: int
    """Its sequence number (an idempotent producer's; 0 for another's)."""


_ONE_HEAD = struct.Struct("<ihiq")  # a record's size, topic index, queue id and tag code
_ONE_SEQ = struct.Struct("<qq")  # a run: its first record and sequence
_ONE_MAX_KEYS = 16  # more keys: a batch (the store's single write takes at most these)


def parse_send_one(blob: bytes | memoryview | np.ndarray) -> OneSend | EncodedBatch:
    """A send from the wire, as :class:`OneSend` when it holds one plain record (one
    topic, no delay, no timer, not transactional, at most 16 keys) that
    ``storage._native.parse_send`` checked, else as :meth:`EncodedBatch.from_bytes`
    reads it (which raises ``InvalidMessageError`` for what it refuses). A broker's
    single send, read this way, skips the batch's object and eight arrays."""
    native = record._native
    parse = getattr(native, "parse_send", None) if native is not None else None
    if parse is None:
        return EncodedBatch.from_bytes(blob)
    got = parse(blob, CLIENT_SYSFLAGS, crc32_address, MAX_TOPIC_LEN)
    if got is None:
        return EncodedBatch.from_bytes(blob)  # the Python path names the error
    n, k, d, r, epoch, flags, topics, _uniq, producer, at, data_at, low, _high = got
    if n != 1 or d or flags or k > _ONE_MAX_KEYS or len(topics) != 1:
        return _from_parsed(blob, got)
    if producer is not None:
        validate_producer_id(producer)
    view = memoryview(blob).cast("B")  # type: ignore[arg-type]  # ndarray is a buffer
    size, _, queue_id, tag = _ONE_HEAD.unpack_from(view, at)
    hashes_at = at + 18
    hashes = (
        [abs(h) & 0x7FFFFFFF for h in struct.unpack_from(f"<{k}i", view, hashes_at)] if k else []
    )  # as the store's put masks them (index_key_hash)
    seq = _ONE_SEQ.unpack_from(view, hashes_at + 8 * k)[1] if r else 0
    return OneSend(topics[0], queue_id, tag, view[data_at:], low, hashes, producer, epoch, seq)


def new_batch(
    data: bytes | memoryview,
    sizes: np.ndarray,
    topics: tuple[str, ...],
    topic_idx: np.ndarray,
    queue_ids: np.ndarray,
    tag_codes: np.ndarray,
    key_hashes: np.ndarray,
    key_owner: np.ndarray,
    uniq_keys: Sequence[str],
    delay_levels: np.ndarray | None = None,
    producer_id: str | None = None,
    producer_epoch: int = 0,
    seq_runs: np.ndarray | None = None,
    transactional: bool = False,
    timer: bool = False,
    checked: bool = False,
    seq_slot_at: tuple[int, int] | None = None,
) -> EncodedBatch:
    """``EncodedBatch(...)`` with the same arguments, without the frozen dataclass's
    ``__init__`` (an ``object.__setattr__`` a field: 5-6 us in a warm loop, against ~1):
    for the paths that make one per message (a broker decoding a send, a producer
    encoding one). The same object, with the same instance dict; ``tests/storage`` holds
    them equal."""
    batch = object.__new__(EncodedBatch)
    batch.__dict__.update(
        data=data,
        sizes=sizes,
        topics=topics,
        topic_idx=topic_idx,
        queue_ids=queue_ids,
        tag_codes=tag_codes,
        key_hashes=key_hashes,
        key_owner=key_owner,
        uniq_keys=uniq_keys,
        delay_levels=delay_levels,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        seq_runs=seq_runs,
        transactional=transactional,
        timer=timer,
        checked=checked,
        seq_slot_at=seq_slot_at,
    )  # ``_body_range``, ``_uniform``: the class's None until found, as after __init__
    return batch


def _min_max(values: np.ndarray) -> tuple[int, int]:
    """(min, max) of a non-empty array, through a list when it is short (see record.SMALL_BATCH)."""
    if len(values) <= record.SMALL_BATCH:
        items = values.tolist()
        return min(items), max(items)
    return int(values.min()), int(values.max())


_FIELD_RULES = {
    "TOTALSIZE": "must be the record's size in the batch: >= 91, within the data",
    "MAGIC": f"must be {MAGIC:#x}",
    "BODYLEN": "must be in [0, TOTALSIZE - 91]",
    "TOPICLEN": "must be the length of the batch's topic for the record",
    "PROPERTIESLEN": "91 + BODYLEN + TOPICLEN + PROPERTIESLEN must be TOTALSIZE",
    "TOPIC": "must be the batch's topic for the record",
    "SYSFLAG": f"a producer may set only the bits {CLIENT_SYSFLAGS:#x}",
    "PROPERTIES": "must be UTF-8 name\\x01value\\x02 pairs",
    "BODYCRC": "must be crc32(body) & 0x7fffffff",
}


def verify_records(
    data: bytes | memoryview, sizes: np.ndarray, topics: Sequence[str], topic_idx: np.ndarray
) -> tuple[int, int]:
    """See :func:`_verify_records`: the (min, max) BODYLEN."""
    low, high, _ = _verify_records(data, sizes, topics, topic_idx)
    return low, high


def _verify_records(
    data: bytes | memoryview, sizes: np.ndarray, topics: Sequence[str], topic_idx: np.ndarray
) -> tuple[int, int, int | None]:
    """Check every record laid back to back with ``sizes`` as the store will trust it,
    and return the (min, max) BODYLEN and how many properties named ``PRODUCER_SEQ``
    the records hold (:func:`seq_pairs`; None from a C module built before it counted
    them).

    Per record: TOTALSIZE is its size in the batch and MAGIC is right; BODYLEN,
    TOPICLEN and PROPERTIESLEN add up to TOTALSIZE; the topic is ``topics[topic_idx[i]]``;
    SYSFLAG holds only :data:`CLIENT_SYSFLAGS`; the properties read as
    :func:`decode_properties` reads them; BODYCRC matches the body. Recovery, a slave
    and a consumer check the same, so a record stored past this check is one they
    accept. Raises ``InvalidMessageError`` naming the first record that fails, the
    field, its value and what it must be. ``topics`` must be valid topic names.
    """
    raw_topics = tuple(t.encode("ascii") for t in topics)
    if sizes.dtype != np.int32 or topic_idx.dtype != np.int16:  # not as the wire has them
        low, high = _min_max(topic_idx) if len(topic_idx) else (0, 0)
        if low < 0 or high >= len(topics) or _min_max(sizes)[1] > (1 << 31) - 1:
            raise InvalidMessageError("encoded batch: a topic index or record size is out of range")
    if record._native is not None:
        sizes32 = np.ascontiguousarray(sizes, dtype=np.int32)
        idx16 = np.ascontiguousarray(topic_idx, dtype=np.int16)
        found = record._native.verify_records(
            data, sizes32, idx16, raw_topics, CLIENT_SYSFLAGS, crc32_address
        )
    else:
        found = _verify_records_py(data, sizes.tolist(), topic_idx.tolist(), raw_topics)
    bad, field, value, expected, low, high = found[:6]
    if bad < 0:
        return low, high, found[6] if len(found) > 6 else None
    assert field is not None
    shown: object = value
    want: object = expected
    if field == "TOPIC":
        start = int(sizes[:bad].sum(dtype=np.int64))
        at = start + HEADER.size + _I32.unpack_from(data, start + OFF_BODYLEN)[0]
        shown, want = bytes(data[at + 1 : at + 1 + data[at]]), raw_topics[int(topic_idx[bad])]
    elif field == "PROPERTIES":
        shown, want = f"<bad byte at {value} of {expected}>", "UTF-8 pairs"
    elif field in ("MAGIC", "SYSFLAG"):
        shown, want = f"{value:#x}", f"{expected:#x}"
    raise InvalidMessageError(
        f"encoded batch: record {bad} of {len(sizes)}: {field}={shown} "
        f"(expected {want}): {_FIELD_RULES[field]}"
    )


def _verify_records_py(
    data: bytes | memoryview, sizes: list[int], topic_idx: list[int], topics: tuple[bytes, ...]
) -> tuple[int, str | None, int, int, int, int, int]:
    """``storage._native.verify_records`` in Python, for where it is not built."""
    n_bytes = len(data)
    low, high = (1 << 31) - 1, -(1 << 31)
    pairs = 0  # properties named PRODUCER_SEQ
    pos = 0
    for i, (size, t) in enumerate(zip(sizes, topic_idx)):
        if size < FIXED_LEN or size > n_bytes - pos:
            return i, "TOTALSIZE", size, n_bytes - pos, low, high, pairs
        (total, magic, crc, _q, _f, _qo, _po, sysflag, *_rest, body_len) = HEADER.unpack_from(
            data, pos
        )
        if total != size:
            return i, "TOTALSIZE", total, size, low, high, pairs
        if magic != MAGIC:
            return i, "MAGIC", magic, MAGIC, low, high, pairs
        if body_len < 0 or body_len > size - FIXED_LEN:
            return i, "BODYLEN", body_len, size - FIXED_LEN, low, high, pairs
        at = pos + HEADER.size + body_len
        topic_len = data[at]
        if not 0 <= t < len(topics) or topic_len != len(topics[t]):
            return (
                i,
                "TOPICLEN",
                topic_len,
                len(topics[t]) if 0 <= t < len(topics) else -1,
                low,
                high,
                pairs,
            )
        p = at + 1 + topic_len
        prop_len = (data[p] << 8) | data[p + 1]
        if FIXED_LEN + body_len + topic_len + prop_len != size:
            return (
                i,
                "PROPERTIESLEN",
                prop_len,
                size - FIXED_LEN - body_len - topic_len,
                low,
                high,
                pairs,
            )
        if bytes(data[at + 1 : p]) != topics[t]:
            return i, "TOPIC", 0, 0, low, high, pairs
        if sysflag & ~CLIENT_SYSFLAGS:
            flags = sysflag & 0xFFFFFFFF
            return i, "SYSFLAG", flags, flags & CLIENT_SYSFLAGS, low, high, pairs
        props = bytes(data[p + 2 : p + 2 + prop_len])
        fault = _properties_fault(props)
        if _SLOT_NAME in props:
            pairs += len(seq_pairs(props))
        if fault >= 0:
            return i, "PROPERTIES", fault, prop_len, low, high, pairs
        want = crc32(data[pos + HEADER.size : at]) & 0x7FFFFFFF
        if crc != want:
            return i, "BODYCRC", crc, want, low, high, pairs
        low, high = min(low, body_len), max(high, body_len)
        pos += size
    if pos != n_bytes:
        return len(sizes), "TOTALSIZE", pos, n_bytes, low, high, pairs
    return -1, None, 0, 0, low, high, pairs


def _properties_fault(raw: bytes) -> int:
    """Where ``raw`` stops reading as :func:`decode_properties` reads it, or -1."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    pair = 0
    for segment in raw.split(b"\x02"):
        if segment and b"\x01" not in segment:
            return pair
        pair += len(segment) + 1
    return -1


def _headers_match(data: bytes | memoryview, sizes: np.ndarray) -> bool:
    """Whether each record laid back to back with ``sizes`` starts with its size and MAGIC
    (where ``storage._native`` is built, ``check_structure`` walks large batches in C).

    ``sizes`` must add up to ``len(data)``.
    """
    if len(sizes) <= record.SMALL_BATCH:
        pos = 0
        for size in sizes.tolist():
            if _SIZE_MAGIC.unpack_from(data, pos) != (size, MAGIC):
                return False
            pos += size
        return True
    sizes64 = sizes.astype(np.int64)
    starts = np.cumsum(sizes64) - sizes64
    words = windows(data, ">u4")
    return bool(np.array_equal(words[starts].astype(np.int64), sizes64)) and bool(
        np.all(words[starts + OFF_MAGIC] == MAGIC)
    )


def body_length_range(data: bytes | memoryview, sizes: np.ndarray) -> tuple[int, int]:
    """(min, max) BODYLEN of the records laid back to back with ``sizes`` (checked ones)."""
    if len(sizes) <= record.SMALL_BATCH:
        lengths = []
        pos = 0
        for size in sizes.tolist():
            lengths.append(_I32.unpack_from(data, pos + OFF_BODYLEN)[0])
            pos += size
        return min(lengths), max(lengths)
    if record._native is not None:
        found = record._native.scan_records(data, np.ascontiguousarray(sizes, dtype=np.int32))
        if found is None:
            raise InvalidMessageError("encoded batch: record headers do not match their sizes")
        return found
    sizes64 = sizes.astype(np.int64)
    starts = np.cumsum(sizes64) - sizes64
    lengths = windows(data, ">i4")[starts + OFF_BODYLEN]
    return int(lengths.min()), int(lengths.max())


PlainEncoder = Callable[
    [Sequence[Message], int, int, bytes, UniqueKeyGenerator], "EncodedBatch | None"
]
"""``(messages, max_message_size, born_ts, born_raw, gen)`` -> the batch encoded, or
``None`` when it is not plain: :func:`storage._fast_encode.encode_plain`."""
_plain_encoder: PlainEncoder | None = None


def use_plain_encoder(encoder: PlainEncoder | None) -> None:
    """Let :func:`encode_batch` hand plain batches to ``encoder``: any batch where
    ``storage._native`` is built, else those of more than ``SMALL_BATCH`` messages
    (``None``: every batch takes the general loop, same bytes).

    ``storage._fast_encode`` registers itself when imported, which the package's
    ``__init__`` does: it builds on this module, so this module cannot import it.
    """
    global _plain_encoder
    _plain_encoder = encoder


def encode_batch(
    messages: Iterable[Message],
    *,
    max_message_size: int = 4 << 20,
    born_host: str = "127.0.0.1:0",
    born_timestamp: int | None = None,
    uniq: UniqueKeyGenerator | None = None,
    reconsume_times: int = 0,
    born: Sequence[tuple[int, str, int]] | None = None,
) -> EncodedBatch:
    """Validate and encode messages into one :class:`EncodedBatch`.

    Raises :class:`InvalidMessageError` naming the first bad field; nothing of
    the batch is usable then, so nothing gets written. ``born`` optionally gives
    each message its own (born timestamp, born host, reconsume times), for
    messages the store re-encodes (delayed delivery, retries).
    """
    born_ts = int(time.time() * 1000) if born_timestamp is None else born_timestamp
    born_raw = host_to_bytes(born_host)
    gen = uniq or default_generator
    if born is None and reconsume_times == 0:
        if not isinstance(messages, (list, tuple)):
            messages = list(messages)
        # the C encoder wins from one message on (as the producer uses it); the numpy
        # one's fixed cost (~70 us) pays off only past record.SMALL_BATCH
        if _plain_encoder is not None and (
            len(messages) > record.SMALL_BATCH or (record._native is not None and messages)
        ):
            fast = _plain_encoder(messages, max_message_size, born_ts, born_raw, gen)
            if fast is not None:
                return fast
    pack = HEADER.pack
    zero8 = b"\x00" * 8
    parts: list[bytes] = []
    sizes: list[int] = []
    topic_index: dict[str, int] = {}
    topic_bytes: dict[str, bytes] = {}
    topic_idx: list[int] = []
    queue_ids: list[int] = []
    tag_cache: dict[str | None, int] = {None: 0}
    tag_codes: list[int] = []
    index_keys: list[str] = []
    key_owner: list[int] = []
    uniq_keys: list[str] = []
    tag_text: dict[str | None, str] = {}
    delays: list[int] | None = None
    transactional = False
    timer = False
    last_user: Any = None
    last_text = ""
    append = parts.append
    fixed = FIXED_LEN - 1
    next_uk = gen.next
    for i, m in enumerate(messages):
        topic = m.topic
        tb = topic_bytes.get(topic)
        if tb is None:
            validate_topic(topic)
            raw_topic = topic.encode("ascii")
            tb = topic_bytes[topic] = bytes((len(raw_topic),)) + raw_topic
            topic_index[topic] = len(topic_index)
        body = m.body
        if body.__class__ is not bytes:
            if not isinstance(body, (bytearray, memoryview)):
                raise InvalidMessageError(f"body: must be bytes, got {type(body).__name__}")
            body = bytes(body)
        blen = len(body)
        if blen == 0:
            raise InvalidMessageError(f"body of message {i} to {topic!r} is empty")
        if blen > max_message_size:
            raise InvalidMessageError(
                f"body of message {i} is {blen} bytes: over max_message_size={max_message_size}"
            )
        qid = m.queue_id
        if qid.__class__ is not int or qid < 0:
            validate_queue_id(qid)
        user = m.properties
        uk = user.get(PROP_UNIQ_KEY) if user else None
        if not uk:
            uk = next_uk()
        tags = m.tags
        prop_text = tag_text.get(tags)
        if prop_text is None:
            if tags is not None:
                check_property_text("tags", tags)
                if not tags:
                    raise InvalidMessageError("tags must be None or a non-empty str")
                tag_cache[tags] = java_hash(tags)
                prop_text = tag_text[tags] = f"TAGS\x01{tags}\x02"
            else:
                prop_text = tag_text[tags] = ""
        if user:
            if user is last_user:  # one dict shared by many messages (a transaction's
                prop_text += last_text  # marks): checked and encoded once per batch
            else:
                if user.get(PROP_TRAN_MSG) == "true":
                    transactional = True
                if PROP_TIMER_DELIVER_MS in user or PROP_TIMER_DELAY_SEC in user:
                    timer = True
                last_text = encode_properties(
                    {k: v for k, v in user.items() if k not in SYSTEM_PROPS}
                ).decode("utf-8")
                last_user = user
                prop_text += last_text
        if m.keys:
            keys = normalize_keys(m.keys)
            prop_text += f"KEYS\x01{KEY_SEP.join(keys)}\x02"
            for key in keys:
                index_keys.append(f"{topic}#{key}")
                key_owner.append(i)
        if m.delay_level:
            if m.delay_level.__class__ is not int or m.delay_level < 0:
                raise InvalidMessageError(f"delay_level={m.delay_level!r}: must be an int >= 0")
            prop_text += f"DELAY\x01{m.delay_level}\x02"
            if delays is None:
                delays = [0] * i
            delays.append(m.delay_level)
        elif delays is not None:
            delays.append(0)
        pb = f"{prop_text}UNIQ_KEY\x01{uk}\x02".encode()
        if len(pb) > MAX_PROPERTIES_LEN:
            raise InvalidMessageError(
                f"properties of message {i} are {len(pb)} bytes: over {MAX_PROPERTIES_LEN}"
            )
        size = fixed + blen + len(tb) + len(pb)
        if born is None:
            m_born_ts, m_born_raw, m_reconsume = born_ts, born_raw, reconsume_times
        else:
            m_born_ts, m_born_host, m_reconsume = born[i]
            m_born_raw = host_to_bytes(m_born_host)
        append(
            pack(
                size,
                MAGIC,
                crc32(body) & 0x7FFFFFFF,
                qid,
                m.flag,
                0,
                0,
                0,
                m_born_ts,
                m_born_raw,
                0,
                zero8,
                m_reconsume,
                0,
                blen,
            )
        )
        append(body)
        append(tb)
        append(len(pb).to_bytes(2, "big"))
        append(pb)
        sizes.append(size)
        topic_idx.append(topic_index[topic])
        queue_ids.append(qid)
        tag_codes.append(tag_cache[tags])
        index_keys.append(f"{topic}#{uk}")
        key_owner.append(i)
        uniq_keys.append(uk)
    if not sizes:
        raise InvalidMessageError("a batch needs at least one message")
    return EncodedBatch(
        data=b"".join(parts),
        sizes=np.array(sizes, dtype=np.int32),
        topics=tuple(topic_index),
        topic_idx=np.array(topic_idx, dtype=np.int16),
        queue_ids=np.array(queue_ids, dtype=np.int32),
        tag_codes=np.array(tag_codes, dtype=np.int64),
        key_hashes=java_hashes(index_keys),
        key_owner=np.array(key_owner, dtype=np.int32),
        uniq_keys=tuple(uniq_keys),
        delay_levels=None if delays is None else np.array(delays, dtype=np.int32),
        transactional=transactional,
        timer=timer,
        checked=True,  # built here, consistent by construction
    )


def encode_message(message: Message, **kwargs: object) -> bytes:
    """One message as a record (store fields zeroed); a convenience for tests and tools."""
    return bytes(encode_batch([message], **kwargs).data)  # type: ignore[arg-type]
