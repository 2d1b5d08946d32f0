"""Consumer state of lite topics as records of a group's log (a Raft group's CommitLog).

In a Raft group the consumer state the leader holds (committed offsets, subscriptions,
lite topics deleted by hand) is written as records of the system topic
:data:`STATE_TOPIC`, each naming its change in its body (JSON) and marked by the
``__LITE_STATE`` property. The leader proposes a record like any put; every member
applies it, in CommitLog order, once it is committed, when :meth:`LiteStore.catch_up
<storage.lite.store.LiteStore.catch_up>` reaches it. So a new leader holds the state
its predecessor acknowledged.

The changes (``op``):

* ``commit``: ``group``, ``parent``, ``lite``, ``offset``: a group's committed offset;
* ``delete``: ``parent``, ``lite``: a lite topic deleted now, its offsets with it;
* ``subscribe``: ``group``, ``parent``, ``client``, ``names``, ``action`` (``add``,
  ``remove`` or ``complete``): a client's lite subscriptions change; a subscription
  creates the lite topics it names;
* ``gone``: ``group``, ``parent``, ``clients``: clients the leader stopped hearing from
  lose their subscriptions;
* ``expire``: ``parent``, ``seen``, ``names``: the leader found these lite topics past
  their parent's TTL when it had applied the log up to CommitLog offset ``seen``; each
  member deletes those of them with no write (and not created) at or after ``seen``, so
  every member expires the same topics at the same point of the log, whatever its own
  clock says, and a write racing the expiry keeps its topic.

The store applies ``commit``, ``delete``, ``expire`` and the lite topics a ``subscribe``
creates (with the record's time as their last write); it hands every change to its ``state_listener`` (the broker's subscription
tables). After a crash it applies again the records past its last flush, each only to
the lite topic it meant (:mod:`storage.lite.store` says how it tells them).
"""

from __future__ import annotations

import json
from typing import Any

from .. import codec
from ..errors import InvalidMessageError
from ..message import Message
from ..store import LITE_STATE_TOPIC

STATE_TOPIC = LITE_STATE_TOPIC
"""The system topic of lite consumer state records (queue 0); a producer's put to it is
refused (``MessageStore.put_encoded``): only a Raft leader's own proposals write it."""
PROP_LITE_STATE = "__LITE_STATE"
"""The property that marks a lite state record (its value: the change's ``op``)."""
OPS = ("commit", "delete", "subscribe", "gone", "expire")

_FIELDS = {
    "commit": ("group", "parent", "lite", "offset"),
    "delete": ("parent", "lite"),
    "subscribe": ("group", "parent", "client", "names", "action"),
    "gone": ("group", "parent", "clients"),
    "expire": ("parent", "seen", "names"),
}


def encode_state(op: dict[str, Any], max_message_size: int) -> codec.EncodedBatch:
    """The one-record batch that carries ``op`` (checked: its kind and fields)."""
    return encode_states([op], max_message_size)


def encode_states(ops: list[dict[str, Any]], max_message_size: int) -> codec.EncodedBatch:
    """One batch of a record per change, in order (each checked: its kind and fields):
    a group's log takes them in one entry, every member applies them in order."""
    messages = []
    for op in ops:
        kind = op.get("op")
        if kind not in _FIELDS or set(op) != {"op", *_FIELDS[kind]}:
            raise InvalidMessageError(f"a lite state change {op!r}: op one of {OPS} and its fields")
        body = json.dumps(op, separators=(",", ":")).encode("utf-8")
        messages.append(Message(STATE_TOPIC, body, properties={PROP_LITE_STATE: kind}))
    return codec.encode_batch(messages, max_message_size=max_message_size)


def decode_state(body: bytes) -> dict[str, Any] | None:
    """The change a state record's body holds; None for a body that holds none."""
    try:
        op = json.loads(body)
    except ValueError:
        return None
    if not isinstance(op, dict) or op.get("op") not in _FIELDS:
        return None
    if set(op) != {"op", *_FIELDS[op["op"]]}:
        return None
    return op
