"""Transactional (half) messages as the store keeps them: RocketMQ's
``TransactionalMessageBridge``, the store's half of it.

A producer marks a message transactional with ``TRAN_MSG=true`` and ``PGROUP``
(its producer group). The store does not put it in its topic: it puts a *half*
copy in :data:`HALF_TOPIC` queue 0, with the real topic and queue in
``REAL_TOPIC``/``REAL_QID`` and the SYSFLAG's transaction bits set to
:data:`TRANSACTION_PREPARED_TYPE`, so no consumer of the real topic sees it. The
same shape as a delayed message's schedule copy (``storage.schedule``); a message
both delayed and transactional loses its delay, as RocketMQ's producer drops it.

What happens next is the broker's (``actors.broker.processor.end_transaction``): a commit writes
:func:`committed` (the real message, SYSFLAG :data:`TRANSACTION_COMMIT_TYPE`) and an
op message on :data:`OP_HALF_TOPIC` whose body is the half message's queue
offset; a rollback writes only the op message. This module holds the record
shapes both sides agree on; it knows nothing of brokers or Ray.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from . import codec
from .errors import InvalidMessageError, ProducerFencedError
from .message import Message, MessageExt, copied, to_real_topic
from .properties import (
    MAX_PROPERTIES_LEN,
    PROP_DELAY,
    PROP_KEYS,
    PROP_PRODUCER_GROUP,
    PROP_PRODUCER_SEQ,
    PROP_REAL_QID,
    PROP_REAL_TOPIC,
    PROP_TAGS,
    PROP_TIMER_DELAY_SEC,
    PROP_TIMER_DELIVER_MS,
    PROP_TRAN_MSG,
    PROP_UNIQ_KEY,
    SYSTEM_PROPS,
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


COMMIT_TOPIC = "RMQ_SYS_TXN_COMMIT"
"""Where the marker that ends a one-phase commit's group goes (queue 0), one per
transaction committed that way: the broker's record of what it committed."""
GROUP_FLAG = 0x1000
"""A SYSFLAG bit of the records of a *one-phase commit* (a multi-message transaction held
by one broker, written in one append with no half copies): its messages carry it with
:data:`TRANSACTION_COMMIT_TYPE`, its marker on :data:`COMMIT_TOPIC` (the group's last
record) with no transaction type. A group is kept only with its marker: recovery cuts a
run of members the log ends in (:func:`open_group_at`), and a slave dispatches a group
only once its marker arrived. Above the bits RocketMQ uses (compression types end at
0x700); set by the broker only (a producer may set none but ``CLIENT_SYSFLAGS``)."""
GROUP_MEMBER = 1
GROUP_END = 2


def group_role(sys_flag: int) -> int:
    """0 for a record outside any group, :data:`GROUP_MEMBER` or :data:`GROUP_END`."""
    if not sys_flag & GROUP_FLAG:
        return 0
    return GROUP_MEMBER if sys_flag & TRANSACTION_MASK == TRANSACTION_COMMIT_TYPE else GROUP_END


def as_group(members: codec.EncodedBatch, marker: codec.EncodedBatch) -> codec.EncodedBatch:
    """``members`` then ``marker`` as one batch, their SYSFLAGs marked as a group's."""
    data = bytearray(members.data)
    starts = np.zeros(len(members.sizes), dtype=np.int64)
    np.cumsum(members.sizes[:-1], out=starts[1:])
    field = codec.windows(data, ">i4")
    at = starts + _OFF_SYSFLAG
    field[at] = (field[at] & ~TRANSACTION_MASK) | GROUP_FLAG | TRANSACTION_COMMIT_TYPE
    del field
    end = bytearray(marker.data)
    (flag,) = struct.unpack_from(">i", end, _OFF_SYSFLAG)
    struct.pack_into(">i", end, _OFF_SYSFLAG, (flag & ~TRANSACTION_MASK) | GROUP_FLAG)
    return codec.EncodedBatch.concat(
        [
            dataclasses.replace(members, data=bytes(data)),
            dataclasses.replace(marker, data=bytes(end)),
        ]
    )


def commit_marker(
    txn_id: str,
    transactional_id: str,
    epoch: int,
    count: int,
    offsets: Mapping[str, Sequence[Sequence[Any]]] | None = None,
) -> Message:
    """The record that ends a one-phase commit's group (its body: who, how many, and the
    consumer offsets committed with it: group -> [[topic, queue id, offset]], which the
    broker re-applies from here when its offset table was not saved after it)."""
    fields: dict[str, Any] = {
        "txn": txn_id,
        "tid": transactional_id,
        "epoch": epoch,
        "count": count,
    }
    if offsets:
        fields["offsets"] = {g: [list(r) for r in rows] for g, rows in offsets.items()}
    body = json.dumps(fields, separators=(",", ":")).encode()
    return Message(COMMIT_TOPIC, body, keys=[txn_id], queue_id=0)


def marker_fields(body: bytes) -> dict[str, Any]:
    """:func:`commit_marker`'s body read back (ValueError when it is not one)."""
    fields = json.loads(body)
    if not isinstance(fields, dict) or not isinstance(fields.get("txn"), str):
        raise ValueError(f"not a commit marker: {body[:80]!r}")
    return fields


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
    return copied(m, HALF_TOPIC, 0, props)


def committed(half: MessageExt) -> Message:
    """The message a commit writes to the real topic and queue (same unique key)."""
    return to_real_topic(half, _TXN_PROPS)


def checked_again(half: MessageExt) -> Message:
    """The half copy a check puts back to the half queue, its check count one higher."""
    props = dict(half.properties)
    props[PROP_CHECK_TIMES] = str(check_times(half) + 1)
    return copied(half, HALF_TOPIC, 0, props)


def discarded(half: MessageExt) -> Message:
    """The copy of a half message checked too often, for :data:`CHECK_MAX_TOPIC`."""
    return copied(half, CHECK_MAX_TOPIC, 0, dict(half.properties))


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

    def epoch_of(self, transactional_id: str) -> int:
        """The fence of ``transactional_id`` (-1: none known here)."""
        return self._epochs.get(transactional_id, -1)

    def check(self, m: MessageExt) -> None:
        """ProducerFencedError when ``m`` comes from an epoch below its id's fence."""
        self.check_properties(m.properties)

    def check_properties(self, props: Mapping[str, str]) -> None:
        """:meth:`check` of a message with these properties."""
        tid = props.get(PROP_TXN_PRODUCER)
        if tid is None:
            return
        try:
            epoch = int(props.get(PROP_TXN_EPOCH, ""))
        except ValueError as exc:
            raise InvalidMessageError(
                f"{PROP_TXN_EPOCH}={props.get(PROP_TXN_EPOCH)!r}: not an epoch"
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


# ------------------------------------------------------------ copies, byte level
# The half copy of a send and the committed copy of a half message, built from the
# records' bytes: what decoding them and encoding ``to_half``/``committed``'s messages
# (``codec.encode_batch``) writes, byte for byte and array for array, without building
# a message object. A record's properties as encoders write them end with its KEYS and
# UNIQ_KEY pairs; what comes before (tags, the producer's and the transaction's
# properties) is the same for the records of one send to one queue, so it is rebuilt
# once per distinct head, not per record. Anything the re-encoding path would treat its
# own way goes to it (None).

_ZERO8 = b"\x00" * 8
_ENCODE_MAX = 4 << 20  # encode_batch's default max_message_size (the commit path's)
_GENERIC = object()  # a head that is not in the usual order: rebuilt record by record
_LAST = object()  # shapes' entry for the head seen last: (key, head + UNIQ_KEY's name, shape)


def _pairs(raw: bytes) -> dict[str, str] | None:
    """Properties as :func:`codec.decode_properties` reads them, or None when they hold
    anything the re-encoding path would treat its own way (not UTF-8, a pair without
    separator, an empty name, a name twice, a value holding ``\\x01``, empty tags, a
    delivery time)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    props: dict[str, str] = {}
    for pair in text.split("\x02"):
        if not pair:
            continue
        name, sep, value = pair.partition("\x01")
        if not sep or not name or "\x01" in value or name in props:
            return None
        props[name] = value
    if props.get(PROP_TAGS) == "" or PROP_TIMER_DELIVER_MS in props:
        return None
    return None if PROP_TIMER_DELAY_SEC in props else props


_SEQ_PAIR = b"\x02" + PROP_PRODUCER_SEQ.encode("ascii") + b"\x01"


def _tail(raw: bytes) -> tuple[bytes, str | None, str] | None:
    """(the properties before KEYS and UNIQ_KEY, the KEYS value or None, the UNIQ_KEY
    value) when UNIQ_KEY is the last pair and KEYS, if anywhere at the end, the one
    before it; None otherwise (the caller parses them all). A ``PRODUCER_SEQ`` pair after
    UNIQ_KEY (an idempotent producer's mark on a run's first record) is left out: no
    copy keeps it (it is one of ``SYSTEM_PROPS``; a run's copies get their own)."""
    if raw[-1:] != b"\x02":
        return None
    seq = raw.rfind(_SEQ_PAIR)
    if seq >= 0 and raw.find(b"\x02", seq + 1) == len(raw) - 1:
        raw = raw[: seq + 1]  # up to and with the separator before it
    u = raw.rfind(b"UNIQ_KEY\x01")
    if u < 0 or (u and raw[u - 1] != 2):
        return None
    uk = raw[u + 9 : -1]
    if not uk or b"\x02" in uk or b"\x01" in uk:
        return None
    head = raw[:u]
    keys = None
    k = head.rfind(b"KEYS\x01")
    if k >= 0 and (k == 0 or head[k - 1] == 2) and head.find(b"\x02", k) == len(head) - 1:
        keys = head[k + 5 : -1]
        head = head[:k]
        if b"\x01" in keys:
            return None
    try:
        return head, None if keys is None else keys.decode("utf-8"), uk.decode("utf-8")
    except UnicodeDecodeError:
        return None


class _Shape:
    """What a record's copy is, but its body, keys and unique key."""

    __slots__ = ("topic", "queue_id", "sys_flag", "head", "tags", "tag_code", "transactional")

    def __init__(
        self, topic: str, queue_id: int, sys_flag: int, props: dict[str, str], user: list
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.sys_flag = sys_flag
        tags = self.tags = props.get(PROP_TAGS)
        text = f"TAGS\x01{tags}\x02" if tags is not None else ""
        self.head = (text + "".join([f"{k}\x01{v}\x02" for k, v in user])).encode()
        self.tag_code = 0 if tags is None else codec.java_hash(tags)
        # as the encoder flags a batch
        self.transactional = any(k == PROP_TRAN_MSG and v == "true" for k, v in user)


def _half_shape(
    props: dict[str, str], topic: str, qid: int, fences: TransactionalFences
) -> _Shape | None:
    """The copy ``MessageStore._reencoded_copies`` writes of a record (properties
    ``props`` but KEYS and UNIQ_KEY) sent to ``topic``/``qid``."""
    if topic == HALF_TOPIC or qid < 0 or not codec.TOPIC_RE.fullmatch(topic):
        return None
    user = [(k, v) for k, v in props.items() if k not in SYSTEM_PROPS]
    if props.get(PROP_TRAN_MSG) != "true":
        return _Shape(topic, qid, 0, props, user)
    fences.check_properties(props)  # before anything is written, as to_half's path
    real_qid = str(qid)
    user = [(k, real_qid if k == PROP_REAL_QID else v) for k, v in user if k != PROP_REAL_TOPIC]
    user.append((PROP_REAL_TOPIC, topic))
    if PROP_REAL_QID not in props:
        user.append((PROP_REAL_QID, real_qid))
    return _Shape(HALF_TOPIC, 0, TRANSACTION_PREPARED_TYPE, props, user)


def _commit_shape(props: dict[str, str]) -> _Shape | None:
    """The copy :func:`committed` makes of a half message (properties ``props`` but KEYS
    and UNIQ_KEY), SYSFLAG :data:`TRANSACTION_COMMIT_TYPE`."""
    topic = props.get(PROP_REAL_TOPIC)
    qid_text = props.get(PROP_REAL_QID, "")
    if topic is None or not codec.TOPIC_RE.fullmatch(topic):
        return None
    if not (qid_text.isascii() and qid_text.isdigit()) or int(qid_text) > 0x7FFFFFFF:
        return None
    user = [(k, v) for k, v in props.items() if k not in SYSTEM_PROPS and k not in _TXN_PROPS]
    return _Shape(topic, int(qid_text), TRANSACTION_COMMIT_TYPE, props, user)


class _CopyBuilder:
    """Records appended as ``codec.encode_batch`` lays them out, and its arrays."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.sizes: list[int] = []
        self.topic_index: dict[str, int] = {}
        self.topic_fields: dict[str, bytes] = {}
        self.topic_idx: list[int] = []
        self.queue_ids: list[int] = []
        self.tag_codes: list[int] = []
        self.index_keys: list[str] = []
        self.key_owner: list[int] = []
        self.uniq_keys: list[str] = []
        self.transactional = False

    def add(
        self,
        shape: _Shape,
        head: tuple[int, int, bytes, int],  # FLAG, BORNTIMESTAMP, BORNHOST, RECONSUMETIMES
        body: bytes,
        keys_text: str | None,
        uk: str,
    ) -> bool:
        """Append one record; False when its properties are too long (re-encoding
        refuses it)."""
        topic = shape.topic
        keys = [k for k in keys_text.split(" ") if k] if keys_text else []
        pb = shape.head
        if keys:
            pb += f"KEYS\x01{' '.join(keys)}\x02".encode()
        pb += f"UNIQ_KEY\x01{uk}\x02".encode()
        if len(pb) > MAX_PROPERTIES_LEN:
            return False
        field = self.topic_fields.get(topic)
        if field is None:
            field = self.topic_fields[topic] = bytes((len(topic),)) + topic.encode("ascii")
            self.topic_index[topic] = len(self.topic_index)
        flag, born_ts, born_raw, reconsume = head
        blen = len(body)
        size = codec.FIXED_LEN - 1 + blen + len(field) + len(pb)
        self.parts += (
            codec.HEADER.pack(
                size,
                codec.MAGIC,
                codec.crc32(body) & 0x7FFFFFFF,
                shape.queue_id,
                flag,
                0,
                0,
                shape.sys_flag,
                born_ts,
                born_raw,
                0,
                _ZERO8,
                reconsume,
                0,
                blen,
            ),
            body,
            field,
            len(pb).to_bytes(2, "big"),
            pb,
        )
        i = len(self.sizes)
        self.sizes.append(size)
        self.topic_idx.append(self.topic_index[topic])
        self.queue_ids.append(shape.queue_id)
        self.tag_codes.append(shape.tag_code)
        for key in keys:
            self.index_keys.append(f"{topic}#{key}")
            self.key_owner.append(i)
        self.index_keys.append(f"{topic}#{uk}")
        self.key_owner.append(i)
        self.uniq_keys.append(uk)
        self.transactional = self.transactional or shape.transactional
        return True

    def batch(self) -> codec.EncodedBatch | None:
        if not self.sizes:
            return None
        return codec.EncodedBatch(
            data=b"".join(self.parts),
            sizes=np.array(self.sizes, dtype=np.int32),
            topics=tuple(self.topic_index),
            topic_idx=np.array(self.topic_idx, dtype=np.int16),
            queue_ids=np.array(self.queue_ids, dtype=np.int32),
            tag_codes=np.array(self.tag_codes, dtype=np.int64),
            key_hashes=codec.java_hashes(self.index_keys),
            key_owner=np.array(self.key_owner, dtype=np.int32),
            uniq_keys=tuple(self.uniq_keys),
            transactional=self.transactional,
            checked=True,  # built here, consistent by construction
        )


def _parts(
    raw: bytes,
    shapes: dict[Any, Any],
    key: Any,
    shape_of: Callable[[dict[str, str]], _Shape | None],
    split: tuple[bytes, str | None, str] | None = None,
) -> tuple[_Shape, str | None, str] | None:
    """A record's copy shape, KEYS value and unique key from its properties ``raw``: the
    shape of a head seen before (``shapes[(head, *key)]``) reused; None when the record
    is one the re-encoding path treats its own way. ``split``: ``_tail(raw)``, when
    the caller has it."""
    if split is None:
        last = shapes.get(_LAST)
        if last is not None and last[0] == key and raw.startswith(last[1]) and raw[-1:] == b"\x02":
            # the head of the record before and its unique key alone: what _tail would
            # split it into, without searching (a batch's records share one head)
            uk_raw = raw[len(last[1]) : -1]
            if uk_raw and b"\x01" not in uk_raw and b"\x02" not in uk_raw:
                try:
                    return last[2], None, uk_raw.decode("utf-8")
                except UnicodeDecodeError:
                    return None
        split = _tail(raw)
    if split is not None:
        head, keys_text, uk = split
        shape = shapes.get((head, key), _GENERIC)
        if shape is _GENERIC:
            props = _pairs(head)
            if props is None or PROP_KEYS in props or PROP_UNIQ_KEY in props:
                shape = None  # rebuilt from all its properties, below
            else:
                shape = shape_of(props)
                if shape is None:
                    return None
            shapes[(head, key)] = shape
        if shape is not None:
            shapes[_LAST] = (key, head + b"UNIQ_KEY\x01", shape)
            return shape, keys_text, uk
    props = _pairs(raw)
    if props is None:
        return None
    uk = props.pop(PROP_UNIQ_KEY, "")
    keys_text = props.pop(PROP_KEYS, None)
    generic = shape_of(props) if uk else None  # no unique key: re-encoding draws one
    return None if generic is None else (generic, keys_text, uk)


def half_copies(
    batch: codec.EncodedBatch, fences: TransactionalFences
) -> codec.EncodedBatch | None:
    """The batch the store puts for a producer's ``batch`` holding transactional records:
    each transactional one as its half copy (:func:`to_half`, SYSFLAG
    :data:`TRANSACTION_PREPARED_TYPE`), each other one as it came, built from the
    records' bytes; the same bytes and arrays as ``MessageStore._reencoded_copies``.

    None when the batch holds anything that path handles its own way (delayed or timer
    messages, a record in the half topic, a missing unique key, empty tags, properties
    it would reject): the caller re-encodes then. Raises as that path does for a fenced
    producer (:meth:`TransactionalFences.check`).
    """
    if batch.timer or (batch.delay_levels is not None and batch.delay_levels.any()):
        return None
    data = bytes(batch.data)
    unpack = codec.HEADER.unpack_from
    head_size = codec.HEADER.size
    out = _CopyBuilder()
    shapes: dict[Any, Any] = {}
    pos = 0
    qids = batch.queue_ids.tolist()
    for i, size in enumerate(batch.sizes.tolist()):
        end = pos + size
        fields = unpack(data, pos)
        blen = fields[14]
        at = pos + head_size + blen
        if blen <= 0 or at + 3 > end:
            return None
        prop_at = at + 1 + data[at]
        if prop_at + 2 > end or prop_at + 2 + ((data[prop_at] << 8) | data[prop_at + 1]) != end:
            return None
        topic_raw = data[at + 1 : prop_at]
        if not topic_raw.isascii():
            return None
        topic = topic_raw.decode("ascii")
        qid = qids[i]
        parts = _parts(
            data[prop_at + 2 : end],
            shapes,
            (topic, qid),
            lambda props, t=topic, q=qid: _half_shape(props, t, q, fences),  # type: ignore[misc]
        )
        if parts is None:
            return None
        head = (fields[4], fields[8], fields[9], fields[12])
        if not out.add(parts[0], head, data[pos + head_size : at], parts[1], parts[2]):
            return None
        pos = end
    return out.batch() if pos == len(data) else None


def committed_copies(halves: list[MessageExt]) -> codec.EncodedBatch | None:
    """The committed copies of ``halves`` (:func:`committed`, SYSFLAG
    :data:`TRANSACTION_COMMIT_TYPE`, born timestamp, host and reconsume times kept) as
    the broker's commit writes them, built from the stored records' bytes. None when a
    half message holds anything that path treats its own way (see :func:`half_copies`)."""
    out = _CopyBuilder()
    shapes: dict[Any, Any] = {}
    hosts: dict[str, bytes] = {}
    for half in halves:
        if half.topic != HALF_TOPIC or not 0 < len(half.body) <= _ENCODE_MAX:
            return None
        parts = _parts(half.raw_properties, shapes, None, _commit_shape)
        if parts is None or not parts[2].isascii():
            return None
        born = hosts.get(half.born_host)
        if born is None:
            born = hosts[half.born_host] = codec.host_to_bytes(half.born_host)
        head = (half.flag, half.born_timestamp, born, half.reconsume_times)
        if not out.add(parts[0], head, half.body, parts[1], parts[2]):
            return None
    return out.batch()


class HalfRecords:
    """Half messages' records as read from the CommitLog (``read_runs``), walked without
    decoding them into messages: each one's queue offset, multi-message transaction id
    and what its committed copy is made of. :meth:`committed` builds the copies of some
    of them: byte for byte what :func:`committed_copies` builds from the decoded half
    messages (the commit of a multi-message transaction reads its halves this way)."""

    __slots__ = ("queue_offsets", "txn_ids", "_items")

    def __init__(self) -> None:
        self.queue_offsets: list[int] = []
        self.txn_ids: list[str | None] = []
        self._items: list[tuple[Any, ...]] = []

    @classmethod
    def read(cls, data: bytes | memoryview, sizes: Sequence[int]) -> HalfRecords | None:
        """The records of ``data`` (back to back, ``sizes`` bytes each); None when one is
        not a half message, or holds anything the decoding path treats its own way."""
        data = bytes(data)
        out = cls()
        shapes: dict[Any, Any] = {}
        txn_of: dict[bytes, str | None] = {}  # properties head -> its transaction id
        unpack = codec.HEADER.unpack_from
        head_size = codec.HEADER.size
        half_topic = HALF_TOPIC.encode("ascii")
        pos = 0
        for size in sizes:
            end = pos + int(size)
            if end > len(data):
                return None
            fields = unpack(data, pos)
            blen = fields[14]
            at = pos + head_size + blen
            if fields[0] != size or fields[1] != codec.MAGIC or not 0 < blen <= _ENCODE_MAX:
                return None
            if at + 3 > end or data[at + 1 : at + 1 + data[at]] != half_topic:
                return None
            prop_at = at + 1 + data[at]
            if prop_at + 2 + ((data[prop_at] << 8) | data[prop_at + 1]) != end:
                return None
            raw = data[prop_at + 2 : end]
            split = _tail(raw)
            if split is None:
                return None
            head = split[0]
            if head not in txn_of:
                props = _pairs(head)
                if props is None:
                    return None
                txn_of[head] = props.get(PROP_GLOBAL_TXN)
            parts = _parts(raw, shapes, None, _commit_shape, split)
            if parts is None or not parts[2].isascii():
                return None
            out.queue_offsets.append(int(fields[5]))
            out.txn_ids.append(txn_of[head])
            # FLAG, BORNTIMESTAMP, BORNHOST, RECONSUMETIMES as the copy keeps them
            born = (fields[4], fields[8], fields[9], fields[12])
            out._items.append((parts, born, data[pos + head_size : at]))
            pos = end
        return out if pos == len(data) else None

    def copy_key(self, i: int) -> tuple[str, str]:
        """Where record ``i``'s committed copy goes and the unique key it keeps:
        (real topic, UNIQ_KEY)."""
        (shape, _, uk), _, _ = self._items[i]
        return shape.topic, uk

    def committed(self, picked: Sequence[int]) -> codec.EncodedBatch | None:
        """The committed copies of the records at ``picked`` (indexes), in that order."""
        out = _CopyBuilder()
        for i in picked:
            (shape, keys_text, uk), born, body = self._items[i]
            if not out.add(shape, born, body, keys_text, uk):
                return None
        return out.batch()
