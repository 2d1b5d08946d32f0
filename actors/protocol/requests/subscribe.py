"""Subscriptions: a consumer's stream of new records for the queues it holds, within
a credit it renews (``actors.broker.processor.subscribe``).

SUBSCRIBE opens the stream on the consumer's connection; the broker answers it many
times (the wire's ``STREAM`` flag): first ``{"s": id}``, the subscription's id, once it
is open, then each answer the new records of some of its queues
(``pulls_to_wire``'s blob, the queues in ``"k"`` in the same order and in ``"p"`` the
offset each was read from: a consumer takes an answer that starts where it expects the
queue to be and knows any other for one written before its last update), until UNSUBSCRIBE,
the connection's end or the broker's shutdown gives its last answer. CREDIT adds to
the messages (and bytes) the broker may still write; SUBSCRIPTION_UPDATE adds and
drops queues (a rebalance). The three name the subscription by that id, on the same
connection. Called through Ray (the Broker's methods of the same names) they are
refused: a stream is the socket's.
"""

from __future__ import annotations

from actors.protocol.requests.declare import (
    INT,
    LIST,
    NOTHING,
    QUEUE_OFFSETS,
    RESULT,
    Field,
    Request,
)
from actors.protocol.requests.fields import CLIENT_ID, GROUP
from storage.errors import InvalidMessageError, PermissionDeniedError, TopicNotFoundError

SUBSCRIPTION = Field("subscription", "s", INT)
"""A subscription's id on this connection (its SUBSCRIBE's first answer)."""
QUEUES = Field("queues", "k", QUEUE_OFFSETS)
"""``{(topic, queue id): next offset}``."""
CREDIT_MESSAGES = Field("credit", "n", INT, default=0)
CREDIT_BYTES = Field("credit_bytes", "b", INT, default=0)

_ERRORS = (InvalidMessageError, TopicNotFoundError, PermissionDeniedError)


SUBSCRIBE = Request(
    "SUBSCRIBE",
    50,
    "subscribe",
    (
        GROUP,
        QUEUES,
        Field("tags", "t", default=None),
        CREDIT_MESSAGES,
        CREDIT_BYTES,
        Field("max_count", "m", INT, default=32),
        Field("client_id", CLIENT_ID.key, default=""),
    ),
    answer=RESULT,
    served_by=("subscriber", "subscribe"),
    ordered=False,  # a stream the broker holds open: it takes the socket at once
    errors=_ERRORS,
    doc="Answers many times (STREAM): ``{'s': id}`` once open, then "
    "``{'k': [[topic, queue id]], 'p': [offset read from]}`` and ``pulls_to_wire``'s blob; the last answer's "
    "result is why it ended.",
)


def _control(name: str, code: int, method: str, fields: tuple[Field, ...], doc: str) -> Request:
    """A request about an open subscription (named by its id, on the connection that
    opened it): served by the subscriber's coroutine of the same name, answered with
    nothing, taking the socket at once as its SUBSCRIBE did."""
    return Request(
        name,
        code,
        method,
        fields,
        answer=NOTHING,
        served_by=("subscriber", method),
        ordered=False,
        errors=_ERRORS,
        doc=doc,
    )


CREDIT = _control(
    "CREDIT",
    51,
    "subscription_credit",
    (SUBSCRIPTION, CREDIT_MESSAGES, CREDIT_BYTES),
    "Adds ``credit`` messages (``credit_bytes`` bytes, when the subscription counts "
    "bytes) to what the broker may write; neither may be negative.",
)

SUBSCRIPTION_UPDATE = _control(
    "SUBSCRIPTION_UPDATE",
    52,
    "update_subscription",
    (
        SUBSCRIPTION,
        Field("add", "a", QUEUE_OFFSETS, default=None),
        Field("drop", "d", LIST, default=None),
    ),
    "Adds queues (``{(topic, queue id): offset}``) and drops others "
    "(``[[topic, queue id]]``): a rebalance.",
)

UNSUBSCRIBE = _control(
    "UNSUBSCRIBE",
    53,
    "unsubscribe",
    (SUBSCRIPTION,),
    "Ends the subscription: its SUBSCRIBE gets its last answer.",
)

REQUESTS = (SUBSCRIBE, CREDIT, SUBSCRIPTION_UPDATE, UNSUBSCRIBE)

__all__ = ["REQUESTS", "SUBSCRIBE", "CREDIT", "SUBSCRIPTION_UPDATE", "UNSUBSCRIBE"]
