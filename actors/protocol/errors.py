"""Errors a broker raises that its callers catch by type (beside ``storage.errors``)."""

from __future__ import annotations

from storage.errors import BrokerUnavailableError, InvalidMessageError, RayMQError


class PromotionRefusedError(RayMQError):
    """A slave cannot be promoted: the master is alive, or it lacks acknowledged messages
    (or the group elects its master: DLedger)."""


class AnswerDroppedError(BrokerUnavailableError):
    """An injected fault (``actors.broker.faults``) lost the answer to a send that was
    stored: unlike the broker's other answers, it does not mean nothing was written."""


class TransactionStateError(InvalidMessageError):
    """A transaction call that does not fit the transaction's state (ending one decided
    the other way, adding a broker to one already decided). Nothing changed."""


class OnePhaseRefusedError(BrokerUnavailableError):
    """A broker cannot commit a transaction alone (``actors.broker.transaction.one_phase``): the
    producer's epoch is not known there, or its role keeps two phases. Nothing was
    written; the producer commits through the transaction coordinator instead."""


def mark_answered(exc: BaseException) -> BaseException:
    """``exc`` as the broker's own answer (a processor raised it), not a failure of the
    way there and back: see :func:`refused`."""
    exc.raymq_answered = True  # type: ignore[attr-defined]
    return exc


def refused(exc: BaseException) -> bool:
    """The broker answered ``exc``: a RayMQ broker raises before it writes anything, so
    nothing of the request was stored (an injected dropped answer excepted)."""
    return bool(getattr(exc, "raymq_answered", False)) and not isinstance(exc, AnswerDroppedError)
