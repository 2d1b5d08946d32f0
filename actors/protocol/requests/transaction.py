"""Ends of transactions: a producer's answers (single-message transactions), the
transaction coordinator's decision on a broker, a one-phase commit, and a
transactional producer's commit or abort to the coordinator (``TXN_END``)
(``actors.broker.processor.end_transaction``, ``actors.broker.transaction.one_phase``,
``actors.coordinator.txn``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from actors.protocol.errors import OnePhaseRefusedError, TransactionStateError
from actors.protocol.requests.declare import (
    LIST,
    QUEUE_OFFSETS,
    Codec,
    Field,
    Request,
    body,
    by_group,
    rows,
)
from actors.protocol.requests.fields import (
    COMMIT,
    EPOCH,
    PRODUCER_GROUP,
    TRANSACTIONAL_ID,
    TXN_ID,
)
from storage.errors import InvalidMessageError, ProducerFencedError

END_TRANSACTION = Request(
    "END_TRANSACTION",
    16,
    "end_transaction",
    (
        PRODUCER_GROUP,
        Field("half_offset", "q"),
        Field("transaction_id", "i"),
        COMMIT,
    ),
    served_by=("end_txn", "end_transaction"),
    errors=(InvalidMessageError, TransactionStateError),
    doc="Commit or roll back one half message; False when it was ended before.",
)

_OFFSETS_BY_GROUP = Codec(
    lambda v: {g: QUEUE_OFFSETS.to_wire(qs) for g, qs in v.items()},
    lambda v: (
        None if v is None else {g: QUEUE_OFFSETS.from_wire(qs) for g, qs in by_group(v).items()}
    ),
)
"""``{group: {(topic, queue id): offset}}`` as ``{group: [[topic, queue id, offset]]}``."""

END_TRANSACTION_BATCH = Request(
    "END_TRANSACTION_BATCH",
    20,
    "end_transaction_batch",
    (
        TXN_ID,
        COMMIT,
        Field("half_offsets", "q", LIST, default=None),
        Field("offsets", "k", _OFFSETS_BY_GROUP, default=None, omit=True),
        replace(TRANSACTIONAL_ID, default=None),
        replace(EPOCH, default=None),
        Field("retry", "y", default=False),
    ),
    served_by=("end_txn", "end_transaction_batch"),
    errors=(InvalidMessageError, ProducerFencedError, TransactionStateError),
    doc="The coordinator's decision on every half message of a transaction held here.",
)

END_TRANSACTIONS = Request(
    "END_TRANSACTIONS",
    21,
    "end_transactions",
    (
        PRODUCER_GROUP,
        Field(
            "ends",
            "q",
            Codec(lambda v: [list(e) for e in v], lambda v: rows(v, 3)),
        ),
    ),
    served_by=("end_txn", "end_transactions"),
    errors=(InvalidMessageError,),
    doc="A producer's answers to a check round, ended in one append; how many were.",
)


def _rows_by_group(value: Any) -> Any:
    return {g: [list(r) for r in rs] for g, rs in value.items()}


TXN_COMMIT_ONE_PHASE = Request(
    "TXN_COMMIT_ONE_PHASE",
    22,
    "commit_one_phase",
    (
        TXN_ID,
        TRANSACTIONAL_ID,
        EPOCH,
        body("blob"),
        Field("offsets", "k", Codec(_rows_by_group), default=None, omit=True),
    ),
    served_by=("one_phase", "commit"),
    errors=(InvalidMessageError, ProducerFencedError, OnePhaseRefusedError),
    doc="A transaction one broker holds whole, committed there alone.",
)

BROKER_REQUESTS = (
    END_TRANSACTION,
    END_TRANSACTION_BATCH,
    END_TRANSACTIONS,
    TXN_COMMIT_ONE_PHASE,
)


def _halves_to_wire(value: Any) -> Any:
    return {b: None if h is None else list(h) for b, h in value.items()}


def _offsets_to_wire(value: Any) -> Any:
    return {b: {g: [list(q) for q in qs] for g, qs in gs.items()} for b, gs in value.items()}


TXN_END = Request(
    "TXN_END",
    30,
    "end",
    (
        TXN_ID,
        TRANSACTIONAL_ID,
        EPOCH,
        COMMIT,
        Field("halves", "h", Codec(_halves_to_wire), default=None),
        Field("offsets", "k", Codec(_offsets_to_wire), default=None),
        Field("wait", "w", default=True),
    ),
    errors=(InvalidMessageError, ProducerFencedError, TransactionStateError),
    doc="A transactional producer's commit or abort, to the transaction coordinator.",
)

COORDINATOR_REQUESTS = (TXN_END,)
