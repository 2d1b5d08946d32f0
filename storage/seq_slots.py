"""An idempotent producer's ``PRODUCER_SEQ`` property: its value (``id,epoch,first
sequence,count``), the fixed-width slot an encoder reserves for it in a batch's first
record, and where the pairs lie in a record's raw properties (``storage.producer_state``
reads them back)."""

from __future__ import annotations

import re

from .errors import InvalidMessageError
from .properties import (
    NAME_VALUE_SEP,
    PROP_PRODUCER_SEQ,
    PROPERTY_SEP,
)

_VALID_PRODUCER_IDS: set[str] = set()  # checked already: a broker sees the same few
PRODUCER_ID_RE = re.compile(r"[A-Za-z0-9_.:@%|-]{1,160}")


def seq_value(producer_id: str, epoch: int, seq: int, count: int, width: int = 0) -> bytes:
    """A ``PRODUCER_SEQ`` value, ``id,epoch,first sequence,count``; with ``width`` (a
    reserved slot's, :func:`seq_slot`) the numbers zero-padded to fill it exactly
    (``int()`` reads them back the same)."""
    if not width:
        return f"{producer_id},{epoch},{seq},{count}".encode("ascii")
    # %-formatting of bytes: a fifth of the cost of nested format specs, once per send
    return _PADDED % (producer_id.encode("ascii"), epoch, seq, count)


# a reserved PRODUCER_SEQ slot's numbers: epoch <= 0x7FFFFFFF, sequence < 2**62, count
_SLOT_EPOCH, _SLOT_SEQ, _SLOT_COUNT = 10, 19, 10
_PADDED = b"%%s,%%0%dd,%%0%dd,%%0%dd" % (_SLOT_EPOCH, _SLOT_SEQ, _SLOT_COUNT)
_SLOT_NAME = f"{PROP_PRODUCER_SEQ}{NAME_VALUE_SEP}".encode("ascii")


def seq_slot(producer_id: str) -> bytes:
    """The ``PRODUCER_SEQ`` property an encoder reserves in a batch's first record for
    ``producer_id`` (``name\\x01value\\x02``): the value is a run of count 0, which
    :meth:`EncodedBatch.with_sequence` overwrites in place and a replay ignores (a slot
    never bound names no run)."""
    validate_producer_id(producer_id)
    width = len(producer_id) + 3 + _SLOT_EPOCH + _SLOT_SEQ + _SLOT_COUNT
    return _SLOT_NAME + seq_value(producer_id, 0, 0, 0, width) + PROPERTY_SEP.encode("ascii")


def bound_slot(producer_id: str, epoch: int, seq: int, count: int) -> bytes:
    """The pair :func:`seq_slot` holds once bound to this run (``name\x01value\x02``,
    the value zero-padded as :meth:`EncodedBatch.with_sequence` writes it)."""
    return b"%s%s\x02" % (_SLOT_NAME, _PADDED % (producer_id.encode("ascii"), epoch, seq, count))


def slot_at(first_size: int, slot: bytes) -> tuple[int, int]:
    """Where :func:`seq_slot`'s value lies in a batch whose first record (of
    ``first_size`` bytes) ends with it: (offset, width)."""
    width = len(slot) - len(_SLOT_NAME) - 1
    return first_size - 1 - width, width


def parse_seq_value(value: bytes) -> tuple[str, int, int, int]:
    """A ``PRODUCER_SEQ`` value read back as (producer id, epoch, first sequence, count),
    as recovery and slaves read it (``storage.producer_state``); ``ValueError`` when it
    is not one. The broker checks a batch's marks with this same reading, so what it
    accepts is what a replay rebuilds."""
    pid, epoch, seq, count = value.decode("ascii").split(",")
    return pid, int(epoch), int(seq), int(count)


def seq_pairs(props: bytes) -> list[tuple[int, int]]:
    """Where the value of every ``PRODUCER_SEQ`` pair in a record's raw properties lies,
    in order, as (start, stop): a pair begins the properties or follows ``\\x02`` (a
    name that only ends with ``PRODUCER_SEQ`` is another property's), and its value runs
    to the next ``\\x02``, or to the end (``stop == len(props)``) when none closes it."""
    out = []
    at = props.find(_SLOT_NAME)
    while at >= 0:
        if at == 0 or props[at - 1] == 2:
            start = at + len(_SLOT_NAME)
            stop = props.find(b"\x02", start)
            out.append((start, stop if stop >= 0 else len(props)))
        at = props.find(_SLOT_NAME, at + 1)
    return out


def validate_producer_id(producer_id: object) -> str:
    """A producer id as the broker allocates them: ASCII, no separator, at most 160."""
    if producer_id.__class__ is str and producer_id in _VALID_PRODUCER_IDS:
        return producer_id  # type: ignore[return-value]
    if not isinstance(producer_id, str) or not PRODUCER_ID_RE.fullmatch(producer_id):
        raise InvalidMessageError(
            f"producer_id={producer_id!r}: must match {PRODUCER_ID_RE.pattern}"
        )
    if len(_VALID_PRODUCER_IDS) > 4096:
        _VALID_PRODUCER_IDS.clear()
    _VALID_PRODUCER_IDS.add(producer_id)
    return producer_id
