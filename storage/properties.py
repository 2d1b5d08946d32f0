"""Message properties: RocketMQ's names (``MessageConst``) and their stored text.

A record's properties are ``name\\x01value\\x02`` pairs, UTF-8, at most
:data:`MAX_PROPERTIES_LEN` bytes. Names and values never contain either
separator; ``KEYS`` holds the message's keys joined by a space.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .errors import InvalidMessageError, StoreCorruptedError

NAME_VALUE_SEP = "\x01"
PROPERTY_SEP = "\x02"
KEY_SEP = " "

# property names, as RocketMQ's MessageConst spells them
PROP_KEYS = "KEYS"
PROP_TAGS = "TAGS"
PROP_DELAY = "DELAY"
PROP_UNIQ_KEY = "UNIQ_KEY"
PROP_REAL_TOPIC = "REAL_TOPIC"
PROP_REAL_QID = "REAL_QID"
PROP_RETRY_TOPIC = "RETRY_TOPIC"
PROP_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROP_RECONSUME_TIME = "RECONSUME_TIME"
PROP_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROP_TRAN_MSG = "TRAN_MSG"
PROP_PRODUCER_GROUP = "PGROUP"
# timer messages (storage.timer): delivery at an epoch ms, or seconds after the put
PROP_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROP_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROP_TIMER_OUT_MS = "TIMER_OUT_MS"
PROP_TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
# a recall's delete marker: the unique key of the timer message it cancels
PROP_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
# RayMQ's own: on the first record of an idempotent producer's batch,
# "producer id,epoch,first sequence,record count" (storage.producer_state)
PROP_PRODUCER_SEQ = "PRODUCER_SEQ"

MAX_PROPERTIES_LEN = 32767
# set by the encoder from Message fields; in ``Message.properties`` they are ignored
SYSTEM_PROPS = frozenset({PROP_TAGS, PROP_KEYS, PROP_DELAY, PROP_UNIQ_KEY, PROP_PRODUCER_SEQ})


def check_property_text(what: str, text: object) -> str:
    """``text`` if it is a str free of both separators, else ``InvalidMessageError``."""
    if not isinstance(text, str):
        raise InvalidMessageError(f"{what}={text!r}: must be a str")
    if NAME_VALUE_SEP in text or PROPERTY_SEP in text:
        raise InvalidMessageError(
            f"{what}={text!r}: must not contain the separators \\x01 or \\x02"
        )
    return text


def normalize_keys(keys: Sequence[str] | str) -> tuple[str, ...]:
    """A message's keys as a tuple, each checked: non-empty, no separator, no space."""
    if isinstance(keys, str):
        keys = (keys,)
    out = []
    for key in keys:
        check_property_text("key", key)
        if not key or KEY_SEP in key:
            raise InvalidMessageError(f"key={key!r}: must be non-empty and contain no space")
        out.append(key)
    return tuple(out)


def encode_properties(props: Mapping[str, str]) -> bytes:
    parts = []
    for name, value in props.items():
        check_property_text("property name", name)
        check_property_text(f"property {name!r}", value)
        if not name:
            raise InvalidMessageError("property name must be non-empty")
        parts.append(f"{name}\x01{value}\x02")
    return "".join(parts).encode("utf-8")


def decode_properties(raw: bytes) -> dict[str, str]:
    if not raw:
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StoreCorruptedError(f"properties are not UTF-8: {exc}") from exc
    props: dict[str, str] = {}
    for pair in text.split(PROPERTY_SEP):
        if not pair:
            continue
        name, sep, value = pair.partition(NAME_VALUE_SEP)
        if not sep:
            raise StoreCorruptedError(f"property {pair[:40]!r} has no name/value separator")
        props[name] = value
    return props
