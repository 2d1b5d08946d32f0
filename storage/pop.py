"""POP consumption's state in the store (RocketMQ 5's ``PopMessageProcessor``,
``AckMessageProcessor``, ``ChangeInvisibleTimeProcessor`` and ``PopReviveService``, the
store's half of them): a consumer receives messages from any queue with an invisible
time, and acks each by its receipt handle.

Per (group, topic, queue) the state is two things:

* ``next``: the pop offset, below which every message was handed out once;
* ``out``: the messages handed out and not done yet, by queue offset, each with its
  check point id (one per pop), pop time, invisible time and how often it was delivered.

Everything in ``[floor, next)`` not in ``out`` is done (acked, filtered out by the tag
expression, or dead-lettered), where ``floor = min(out)`` (``next`` when nothing is
out). The floor is the group's consumer offset: ``on_commit`` hands it to the broker's
offset manager whenever it moves, so lag stays true.

* **Pop** takes the queue's lapsed messages first (lowest offset first), then new ones
  from ``next`` (tag expression applied as a pull does), marks them invisible until
  ``now + invisible_ms`` and signs a receipt handle for each.
* **Ack** by handle removes the message from ``out``; **change invisible** re-arms it
  under a new check point id and signs a new handle (the old one is refused after).
* **Revive**: a message whose invisible time lapsed comes back from the same queue with
  ``reconsume_times`` + 1 (redelivery in place, as RocketMQ's FIFO pop; the invisible
  time is the retry's back-off), until it was delivered ``max_reconsume_times`` + 1
  times: then its dead-letter copy goes to ``%DLQ%<group>`` (the broker hands in the
  send-back path's copy) and it is done. The lapses are found through a heap of
  ``(deadline, ...)`` with stale entries skipped, so a revive pass costs the entries that
  are due, never all that are pending.
* **FIFO**: a FIFO pop takes nothing from a queue with a message in flight; when its
  invisibility lapses the same messages come again first: order per queue.

Durability: a journal (``<store>/pop/journal``), one line per pop, ack, change and dead
letter, each with a sequence number and a CRC, appended with ``write(2)`` before the call
returns, so a process crash (SIGKILL) loses nothing; and a snapshot of the whole state
(``pop/snapshot.json``, written atomically, fsynced) every ``compact_records`` records
and at close, after which the journal starts over. A start loads the snapshot and
replays the journal records after it (a torn last line is cut off). The state is small
(what is in flight), so this is cheaper than RocketMQ's check point and ack messages in
``rmq_sys_REVIVE_LOG`` with a revive consumer merging them. The price: the journal is
not replicated to slaves, so a slave promoted after its master's disk is lost starts
POP from the consumer offsets it synchronised (what was in flight is delivered again:
at least once, nothing lost). Receipt handles are signed with a secret kept in
``pop/secret``, so they stay valid across a restart and cannot be forged or used by
another group.
"""

from __future__ import annotations

import heapq
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from . import codec
from .atomic_file import write_atomically
from .config_files import JsonConfigFile
from .errors import (
    DiskFullError,
    InvalidMessageError,
    InvalidReceiptHandleError,
    OffsetOutOfRangeError,
    RayMQError,
    ReceiptHandleExpiredError,
    StoreCorruptedError,
)
from .message import GetStatus, Message, MessageExt
from .properties import (
    PROP_MAX_RECONSUME_TIMES,
    PROP_ORIGIN_MESSAGE_ID,
    PROP_RECONSUME_TIME,
    PROP_RETRY_TOPIC,
)

log = logging.getLogger("raymq.storage.pop")

POP_DIR = "pop"
DEFAULT_MAX_RECONSUME_TIMES = 16
MAX_POP_MSGS = 1024
MIN_INVISIBLE_MS = 100
MAX_INVISIBLE_MS = 12 * 3600 * 1000  # RocketMQ's proxy: 12 h
_HANDLE_VERSION = "p1"
_GROUP_RE = re.compile(r"[A-Za-z0-9_%|-]{1,120}")
_BROKER_RE = re.compile(r"[A-Za-z0-9_.|@-]{1,127}")  # RayMQ's names, room@name too
_SIG_BYTES = 16

Key = tuple[str, str, int]  # (group, topic, queue id)
DeadLetter = Callable[[MessageExt, str, int], tuple[Message, tuple[int, str, int]]]
"""``(message with its reconsume times, group, max reconsume times)`` -> its dead-letter
copy and born fields (the broker passes its send-back path's ``send_back_copy``)."""


class ReceiptHandle(NamedTuple):
    """What a receipt handle says (RocketMQ's ``ExtraInfoUtil`` fields, and a signature)."""

    topic: str
    queue_id: int
    offset: int
    pop_time: int
    invisible_ms: int
    broker: str
    ck: str
    sig: str

    @property
    def deadline(self) -> int:
        return self.pop_time + self.invisible_ms

    def body(self) -> str:
        return " ".join(
            (
                _HANDLE_VERSION,
                self.topic,
                str(self.queue_id),
                str(self.offset),
                str(self.pop_time),
                str(self.invisible_ms),
                self.broker,
                self.ck,
            )
        )

    def __str__(self) -> str:
        return f"{self.body()} {self.sig}"

    @classmethod
    def parse(cls, text: object) -> ReceiptHandle:
        if not isinstance(text, str) or len(text) > 512:
            raise InvalidReceiptHandleError(
                f"receipt_handle={text!r:.80}: must be a str this broker handed out"
            )
        parts = text.split(" ")
        if len(parts) != 9 or parts[0] != _HANDLE_VERSION:
            raise InvalidReceiptHandleError(f"receipt_handle={text!r:.80}: malformed")
        _, topic, qid, off, pt, inv, broker, ck, sig = parts
        try:
            return cls(topic, int(qid), int(off), int(pt), int(inv), broker, ck, sig)
        except ValueError:
            raise InvalidReceiptHandleError(f"receipt_handle={text!r:.80}: malformed") from None


@dataclass(slots=True)
class Flight:
    """A message handed out and not done: under check point ``ck`` until its deadline."""

    ck: str
    pop_time: int
    invisible_ms: int
    attempts: int  # its reconsume times at this delivery (0: the first)

    @property
    def deadline(self) -> int:
        return self.pop_time + self.invisible_ms


@dataclass(slots=True)
class Popped:
    """One message a pop handed out: its ``reconsume_times`` is set to this delivery's."""

    message: MessageExt
    receipt_handle: str
    reconsume_times: int


class _Queue:
    __slots__ = ("next", "out", "ready", "floors", "committed")

    def __init__(self, next_offset: int) -> None:
        self.next = next_offset
        self.out: dict[int, Flight] = {}
        self.ready: list[int] = []  # heap: offsets in ``out`` whose invisibility lapsed
        self.floors: list[int] = []  # heap: offsets ever put in ``out`` (stale ones skipped)
        self.committed = -1

    def floor(self) -> int:
        while self.floors and self.floors[0] not in self.out:
            heapq.heappop(self.floors)
        return self.floors[0] if self.floors else self.next

    def in_flight(self) -> int:
        """Messages out and not lapsed."""
        return len(self.out) - len(self.ready)


def default_dead_letter(
    m: MessageExt, group: str, max_reconsume_times: int
) -> tuple[Message, tuple[int, str, int]]:
    """A dead-letter copy to ``%DLQ%<group>`` (the broker passes its own, the send-back
    path's)."""
    props = dict(m.properties)
    props.setdefault(PROP_RETRY_TOPIC, m.topic)
    props.setdefault(PROP_ORIGIN_MESSAGE_ID, m.msg_id)
    props[PROP_RECONSUME_TIME] = str(m.reconsume_times + 1)
    props[PROP_MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    copy = Message(f"%DLQ%{group}", m.body, tags=m.tags, keys=m.keys, properties=props, flag=m.flag)
    return copy, (m.born_timestamp, m.born_host, m.reconsume_times + 1)


class PopStore:
    """The POP state of one store (see the module's docstring). Thread-safe: every call
    runs under one lock. ``put`` writes a batch the store itself built (dead letters):
    the store's own ``_put_encoded`` by default, the broker's role on a broker.
    ``initial_offset(group, topic, queue_id)`` is where a group's first pop of a queue
    starts (default: the queue's first message); ``on_commit(group, topic, queue_id,
    offset)`` is told each new floor."""

    def __init__(
        self,
        store: Any,
        broker_name: str,
        *,
        put: Callable[[codec.EncodedBatch], object] | None = None,
        initial_offset: Callable[[str, str, int], int] | None = None,
        on_commit: Callable[[str, str, int, int], None] | None = None,
        dead_letter: DeadLetter = default_dead_letter,
        max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
        compact_records: int = 4096,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(broker_name, str) or not _BROKER_RE.fullmatch(broker_name):
            raise InvalidMessageError(f"broker_name={broker_name!r}: not a valid broker name")
        if not isinstance(max_reconsume_times, int) or max_reconsume_times < 0:
            raise InvalidMessageError(
                f"max_reconsume_times={max_reconsume_times!r}: must be an int >= 0"
            )
        self.store = store
        self.broker_name = broker_name
        self._put = put if put is not None else store._put_encoded
        self._initial = initial_offset or (lambda g, t, q: store.min_offset(t, q))
        self._on_commit = on_commit
        self._dead_letter = dead_letter
        self.max_reconsume_times = max_reconsume_times
        self._compact_records = compact_records
        self._clock = clock
        self._lock = threading.RLock()
        self._queues: dict[Key, _Queue] = {}
        self._timers: list[tuple[int, int, Key, int, str]] = []  # (deadline, seq, key, off, ck)
        self._tseq = 0
        self._rr: dict[tuple[str, str], int] = {}  # where the next pop of (group, topic) starts
        self._seq = 0  # the journal's last record
        self._records = 0  # records in the journal since the last snapshot
        self._snapshot_flights = 0  # messages in flight the last snapshot wrote
        self._closed = False
        self.stats = {"popped": 0, "acked": 0, "changed": 0, "revived": 0, "dead": 0}
        root = Path(store.config.store_dir) / POP_DIR
        root.mkdir(parents=True, exist_ok=True)
        self._secret = _load_secret(root / "secret")
        self._snapshot = JsonConfigFile(root / "snapshot.json")
        self._journal_path = root / "journal"
        self._load()
        self._fd = os.open(self._journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for key, q in self._queues.items():  # the offset manager may have missed the last
            self._commit(key, q)

    # ------------------------------------------------------------ handles
    def _sign(self, group: str, body: str) -> str:
        mac = hmac.new(self._secret, f"{group}\n{body}".encode(), "sha256")
        return mac.hexdigest()[: 2 * _SIG_BYTES]

    def _handle(self, group: str, topic: str, qid: int, off: int, fl: Flight) -> str:
        h = ReceiptHandle(
            topic, qid, off, fl.pop_time, fl.invisible_ms, self.broker_name, fl.ck, ""
        )
        return str(h._replace(sig=self._sign(group, h.body())))

    def _verify(self, group: str, topic: str, text: object, now: int) -> ReceiptHandle:
        """The handle, checked: signed here for ``group``, of ``topic``, not expired."""
        h = ReceiptHandle.parse(text)
        if h.broker != self.broker_name:
            raise InvalidReceiptHandleError(
                f"receipt handle of broker {h.broker!r}: this is broker {self.broker_name!r}"
            )
        if h.topic != topic:
            raise InvalidReceiptHandleError(
                f"receipt handle of topic {h.topic!r}, not of topic {topic!r}"
            )
        if not hmac.compare_digest(h.sig, self._sign(group, h.body())):
            raise InvalidReceiptHandleError(
                f"receipt handle not issued to group {group!r} on topic {topic!r} "
                "(forged, or another group's)"
            )
        if now >= h.deadline:
            raise ReceiptHandleExpiredError(
                f"receipt handle of {topic}:{h.queue_id} offset {h.offset} expired "
                f"{now - h.deadline} ms ago (invisible {h.invisible_ms} ms from {h.pop_time}): "
                "the message comes again under a new handle"
            )
        return h

    # ------------------------------------------------------------ pop
    def pop(
        self,
        group: str,
        topic: str,
        queue_ids: Sequence[int],
        max_msgs: int,
        invisible_ms: int,
        *,
        fifo: bool = False,
        tags: str | None = None,
    ) -> list[Popped]:
        """Up to ``max_msgs`` messages of ``topic`` from ``queue_ids`` (round robin: each
        pop of the group starts one queue further), invisible for ``invisible_ms``."""
        _check_group(group)
        codec.validate_topic(topic)
        _check_int("max_msgs", max_msgs, 1, MAX_POP_MSGS)
        _check_int("invisible_ms", invisible_ms, MIN_INVISIBLE_MS, MAX_INVISIBLE_MS)
        qids = [codec.validate_queue_id(q) for q in queue_ids]
        out: list[Popped] = []
        with self._lock:
            self._check_open()
            now = self._now()
            self._revive_due(now)
            if not qids:
                return out
            start = self._rr.get((group, topic), 0)
            self._rr[(group, topic)] = start + 1
            for i in range(len(qids)):
                qid = qids[(start + i) % len(qids)]
                out.extend(
                    self._pop_queue(
                        group, topic, qid, max_msgs - len(out), invisible_ms, fifo, tags, now
                    )
                )
                if len(out) >= max_msgs:
                    break
            self._maybe_compact()
        self.stats["popped"] += len(out)
        return out

    def _pop_queue(
        self,
        group: str,
        topic: str,
        qid: int,
        n: int,
        invisible_ms: int,
        fifo: bool,
        tags: str | None,
        now: int,
    ) -> list[Popped]:
        key = (group, topic, qid)
        q = self._queue(key)
        if fifo and q.in_flight():
            return []  # one batch in flight per queue: order
        picks: list[tuple[int, MessageExt, int]] = []
        next_before = q.next
        fl_ck = secrets.token_hex(8)
        try:  # the record before the state: a failed write hands out nothing, changes nothing
            while q.ready and len(picks) < n:
                off = heapq.heappop(q.ready)
                fl = q.out.get(off)
                if fl is None:  # acked meanwhile (the clock went back)
                    continue
                m = self._read(topic, qid, off)
                if m is None:  # expired from the store meanwhile: nothing to deliver
                    log.warning(
                        "pop %s: %s:%d offset %d is gone from the store", group, topic, qid, off
                    )
                    self._append({"op": "dead", "k": list(key), "o": off})
                    del q.out[off]
                    continue
                picks.append((off, m, fl.attempts + 1))
            if len(picks) < n:
                picks.extend(self._read_new(group, topic, qid, q, n - len(picks), tags))
            if not picks and q.next == next_before:
                self._commit(key, q)
                return []
            self._append(
                {
                    "op": "pop",
                    "k": list(key),
                    "c": fl_ck,
                    "t": now,
                    "i": invisible_ms,
                    "o": [off for off, _, _ in picks],
                    "a": [a for _, _, a in picks],
                    "n": q.next,
                }
            )
        except BaseException:
            q.next = next_before
            for off, _, attempts in picks:
                if attempts:  # taken from the lapsed ones: they stay lapsed
                    heapq.heappush(q.ready, off)
            raise
        popped = []
        for off, m, attempts in picks:
            fl = Flight(fl_ck, now, invisible_ms, attempts)
            if off not in q.out:
                heapq.heappush(q.floors, off)
            q.out[off] = fl
            self._arm(key, off, fl)
            popped.append(
                Popped(
                    m._replace(reconsume_times=attempts),
                    self._handle(group, topic, qid, off, fl),
                    attempts,
                )
            )
        self._commit(key, q)
        return popped

    def _read_new(
        self, group: str, topic: str, qid: int, q: _Queue, n: int, tags: str | None
    ) -> list[tuple[int, MessageExt, int]]:
        got = self.store.get(group, topic, qid, q.next, n, tags)
        if got.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY):
            log.warning(
                "pop %s: %s:%d offset %d outside [%d, %d]: moving to %d",
                group,
                topic,
                qid,
                q.next,
                got.min_offset,
                got.max_offset,
                got.next_offset,
            )
            q.next = got.next_offset
            got = self.store.get(group, topic, qid, q.next, n, tags)
        if got.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
            q.next = max(q.next, got.next_offset)
        return [(m.queue_offset, m, 0) for m in got.messages]

    def _read(self, topic: str, qid: int, off: int) -> MessageExt | None:
        cq = self.store.find_consume_queue(topic, qid)
        entry = cq.entry(off) if cq is not None else None
        if entry is None or entry[1] == 0:
            return None
        try:
            return self.store.message_at(int(entry[0]))  # type: ignore[no-any-return]
        except (OffsetOutOfRangeError, StoreCorruptedError, ValueError):
            return None

    def raw_records(self, popped: Sequence[Popped]) -> tuple[list[Popped], bytes]:
        """The records of ``popped`` exactly as the CommitLog holds them, back to back (a
        receive's answer on the data path: nothing re-encoded), and the popped messages
        they are, in order. One gone from the store meanwhile (expired) is left out: it
        is in flight, comes back after its invisible time and is then dropped as gone."""
        kept: list[Popped] = []
        parts: list[bytes] = []
        for p in popped:
            m = p.message
            try:
                data = self.store.commitlog.read(m.commitlog_offset, m.store_size)
            except (OffsetOutOfRangeError, StoreCorruptedError, ValueError):
                log.warning("pop: %s is gone from the store before its answer", m.msg_id)
                continue
            kept.append(p)
            parts.append(data)
        return kept, b"".join(parts)

    # ------------------------------------------------------------ ack, change
    def ack(self, group: str, topic: str, receipt_handle: str) -> bool:
        """Done with the message: True; False when it was acked before (nothing changes)."""
        _check_group(group)
        with self._lock:
            self._check_open()
            found = self._in_flight(group, topic, receipt_handle, self._now())
            if found is None:
                return False
            key, q, h = found
            self._append({"op": "ack", "k": list(key), "o": h.offset, "c": h.ck})
            del q.out[h.offset]
            self._commit(key, q)
            self._maybe_compact()
        self.stats["acked"] += 1
        return True

    def ack_many(
        self, group: str, topic: str, receipt_handles: Sequence[str]
    ) -> list[RayMQError | None]:
        """:meth:`ack` of several handles as one operation: one lock, one journal write
        (all of them or, on a write error, none). Per handle: None (acked now, before, or
        earlier in the same list) or the error refusing it, which changes nothing."""
        _check_group(group)
        out: list[RayMQError | None] = []
        taken: list[tuple[Key, _Queue, int]] = []
        records: list[dict[str, Any]] = []
        with self._lock:
            self._check_open()
            now = self._now()
            seen: set[tuple[Key, int]] = set()
            for text in receipt_handles:
                try:
                    found = self._in_flight(group, topic, text, now)
                except RayMQError as exc:
                    out.append(exc)
                    continue
                out.append(None)
                if found is None or (found[0], found[2].offset) in seen:
                    continue
                key, q, h = found
                seen.add((key, h.offset))
                taken.append((key, q, h.offset))
                records.append({"op": "ack", "k": list(key), "o": h.offset, "c": h.ck})
            if records:
                self._append_many(records)  # raises: nothing was acked
                for _key, q, offset in taken:
                    del q.out[offset]
                for key, q in {key: q for key, q, _ in taken}.items():
                    self._commit(key, q)
                self._maybe_compact()
        self.stats["acked"] += len(taken)
        return out

    def _in_flight(
        self, group: str, topic: str, receipt_handle: object, now: int
    ) -> tuple[Key, _Queue, ReceiptHandle] | None:
        """The handle's message in flight (lock held), None when it was acked before;
        ``InvalidReceiptHandleError`` for a handle refused or superseded."""
        h = self._verify(group, topic, receipt_handle, now)
        key = (group, topic, h.queue_id)
        q = self._queues.get(key)
        fl = q.out.get(h.offset) if q is not None else None
        if q is None or fl is None:
            return None
        if fl.ck != h.ck:
            raise InvalidReceiptHandleError(
                f"receipt handle of {topic}:{h.queue_id} offset {h.offset} was superseded "
                "(by a later receive or change of its invisible duration)"
            )
        return key, q, h

    def change_invisible(
        self, group: str, topic: str, receipt_handle: str, invisible_ms: int
    ) -> str:
        """Make the message invisible for ``invisible_ms`` from now; its new handle (the
        old one is refused from now on)."""
        _check_group(group)
        _check_int("invisible_ms", invisible_ms, MIN_INVISIBLE_MS, MAX_INVISIBLE_MS)
        with self._lock:
            self._check_open()
            now = self._now()
            h = self._verify(group, topic, receipt_handle, now)
            key = (group, topic, h.queue_id)
            q = self._queues.get(key)
            fl = q.out.get(h.offset) if q is not None else None
            if q is None or fl is None:
                raise InvalidReceiptHandleError(
                    f"{topic}:{h.queue_id} offset {h.offset} is not in flight (acked already)"
                )
            if fl.ck != h.ck:
                raise InvalidReceiptHandleError(
                    f"receipt handle of {topic}:{h.queue_id} offset {h.offset} was superseded "
                    "(by a later receive or change of its invisible duration)"
                )
            new = Flight(secrets.token_hex(8), now, invisible_ms, fl.attempts)
            self._append(
                {
                    "op": "change",
                    "k": list(key),
                    "o": h.offset,
                    "c": h.ck,
                    "n": new.ck,
                    "t": now,
                    "i": invisible_ms,
                }
            )
            q.out[h.offset] = new
            self._arm(key, h.offset, new)
            self._maybe_compact()
        self.stats["changed"] += 1
        return self._handle(group, topic, h.queue_id, h.offset, new)

    def forward_to_dlq(self, group: str, topic: str, receipt_handle: str) -> None:
        """Send the message to ``%DLQ%<group>`` now and mark it done (RocketMQ 5's
        ``ForwardMessageToDeadLetterQueue``: the consumer gives up on it)."""
        _check_group(group)
        with self._lock:
            self._check_open()
            h = self._verify(group, topic, receipt_handle, self._now())
            key = (group, topic, h.queue_id)
            q = self._queues.get(key)
            fl = q.out.get(h.offset) if q is not None else None
            if q is None or fl is None or fl.ck != h.ck:
                raise InvalidReceiptHandleError(
                    f"{topic}:{h.queue_id} offset {h.offset} is not in flight under this "
                    "handle (acked, or superseded)"
                )
            m = self._read(topic, h.queue_id, h.offset)
            if m is None:
                raise InvalidReceiptHandleError(
                    f"{topic}:{h.queue_id} offset {h.offset} is gone from the store"
                )
            self._bury([(key, h.offset, m._replace(reconsume_times=fl.attempts))], retry=False)

    # ------------------------------------------------------------ revive
    def next_due_ms(self) -> int | None:
        """When the earliest in-flight message's invisibility lapses (or a stale entry's)."""
        try:  # read without the lock (the broker's event loop asks): a race is harmless
            return self._timers[0][0]
        except IndexError:
            return None

    def revive(self) -> list[tuple[str, str, int]]:
        """Take back every message whose invisible time lapsed: ready to pop again, or dead
        lettered after ``max_reconsume_times``. The queues that got messages back."""
        with self._lock:
            if self._closed:
                return []
            return self._revive_due(self._now())

    def _revive_due(self, now: int) -> list[Key]:
        timers = self._timers
        woken: set[Key] = set()
        dead: list[tuple[Key, int, MessageExt]] = []
        while timers and timers[0][0] <= now:
            _, _, key, off, ck = heapq.heappop(timers)
            q = self._queues.get(key)
            fl = q.out.get(off) if q is not None else None
            if q is None or fl is None or fl.ck != ck:
                continue  # acked or re-armed since
            if fl.attempts >= self.max_reconsume_times:
                m = self._read(key[1], key[2], off)
                if m is None:
                    del q.out[off]
                    self._append({"op": "dead", "k": list(key), "o": off})
                    self._commit(key, q)
                    continue
                dead.append((key, off, m._replace(reconsume_times=fl.attempts)))
                continue
            heapq.heappush(q.ready, off)
            woken.add(key)
            self.stats["revived"] += 1
        if dead:
            self._bury(dead)
        return sorted(woken)

    def _bury(self, dead: list[tuple[Key, int, MessageExt]], retry: bool = True) -> None:
        """Store the dead-letter copies (one put), then mark them done; a failed put leaves
        them out, tried again in a second (``retry``) or raised."""
        copies, born = [], []
        for (group, _, _), _, m in dead:
            # a copy for the DLQ, whatever the count (forward_to_dlq may come early)
            limit = min(self.max_reconsume_times, m.reconsume_times)
            c, b = self._dead_letter(m, group, limit)
            copies.append(c)
            born.append(b)
        try:
            batch = codec.encode_batch(
                copies, max_message_size=self.store.config.max_message_size, born=born
            )
            self._put(batch)
        except Exception as exc:  # noqa: BLE001 - a full disk, a slave: later
            if not retry:
                raise
            log.error("pop: %d dead letter(s) not stored (%s): trying again", len(dead), exc)
            again = self._now() + 1000
            for key, off, _ in dead:
                fl = self._queues[key].out[off]
                self._timers_push(again, key, off, fl.ck)
            return
        for key, off, m in dead:
            q = self._queues[key]
            q.out.pop(off, None)
            self._append({"op": "dead", "k": list(key), "o": off})
            self._commit(key, q)
            log.warning(
                "pop: %s of %s:%d offset %d delivered %d times without an ack: dead-lettered",
                m.msg_id,
                key[1],
                key[2],
                off,
                m.reconsume_times + 1,
            )
        self.stats["dead"] += len(dead)

    # ------------------------------------------------------------ queries
    def in_flight(self, group: str, topic: str) -> int:
        """Messages of ``topic`` handed to ``group`` and not done (lapsed ones included)."""
        with self._lock:
            return sum(
                len(q.out) for (g, t, _), q in self._queues.items() if (g, t) == (group, topic)
            )

    def floor(self, group: str, topic: str, queue_id: int) -> int | None:
        """The queue's consumer offset as POP sees it (None: never popped)."""
        with self._lock:
            q = self._queues.get((group, topic, queue_id))
            return None if q is None else q.floor()

    # ------------------------------------------------------------ state
    def _now(self) -> int:
        return int(self._clock() * 1000)

    def _check_open(self) -> None:
        if self._closed:
            raise RayMQError("the POP state is closed")

    def _queue(self, key: Key) -> _Queue:
        q = self._queues.get(key)
        if q is None:
            start = int(self._initial(*key))
            q = self._queues[key] = _Queue(max(start, 0))
        return q

    def _arm(self, key: Key, off: int, fl: Flight) -> None:
        self._timers_push(fl.deadline, key, off, fl.ck)

    def _timers_push(self, deadline: int, key: Key, off: int, ck: str) -> None:
        self._tseq += 1
        heapq.heappush(self._timers, (deadline, self._tseq, key, off, ck))

    def _commit(self, key: Key, q: _Queue) -> None:
        floor = q.floor()
        if floor != q.committed:
            q.committed = floor
            if self._on_commit is not None:
                self._on_commit(key[0], key[1], key[2], floor)

    def _append(self, record: dict[str, Any]) -> None:
        self._append_many([record])

    def _append_many(self, records: list[dict[str, Any]]) -> None:
        """The records' journal lines in one write: all of them, or (on an error) none."""
        lines = []
        for i, record in enumerate(records, 1):
            record["s"] = self._seq + i
            text = json.dumps(record, separators=(",", ":"))
            lines.append(f"{zlib.crc32(text.encode()):08x} {text}\n")
        data = "".join(lines).encode()
        error: OSError | None = None
        try:
            written = os.write(self._fd, data)  # in the page cache: a process crash keeps it
        except OSError as exc:
            written, error = 0, exc
        if written != len(data):
            if written:  # a short write: cut it, so the next record starts on its own line
                os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
            raise DiskFullError(f"POP journal {self._journal_path}: write failed ({error})")
        self._seq += len(records)
        self._records += len(records)

    def _maybe_compact(self) -> None:
        """Snapshot once the journal holds ``compact_records`` records and at least as many
        as the last snapshot held messages in flight: a snapshot writes every message in
        flight (under the lock), so with many in flight it is not taken again every few
        thousand operations, and its cost per operation stays bounded."""
        if self._records >= max(self._compact_records, self._snapshot_flights):
            try:
                self._checkpoint()
            except OSError as exc:  # the journal still holds everything: later
                log.error("pop: snapshot failed (%s): the journal grows until one succeeds", exc)
                self._records = 0

    def _checkpoint(self) -> None:
        """Snapshot the state (fsynced, atomically), then start the journal over."""
        self._snapshot.save(
            {
                "seq": self._seq,
                "queues": [
                    [
                        g,
                        t,
                        qid,
                        q.next,
                        [
                            [o, f.ck, f.pop_time, f.invisible_ms, f.attempts]
                            for o, f in sorted(q.out.items())
                        ],
                    ]
                    for (g, t, qid), q in sorted(self._queues.items())
                ],
            }
        )
        os.ftruncate(self._fd, 0)
        self._records = 0
        self._snapshot_flights = sum(len(q.out) for q in self._queues.values())

    def checkpoint(self) -> None:
        with self._lock:
            if not self._closed:
                self._checkpoint()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._checkpoint()
            self._closed = True
            os.close(self._fd)

    def _load(self) -> None:
        snap = self._snapshot.load()
        base = int(snap.get("seq", 0))
        for g, t, qid, nxt, flights in snap.get("queues", []):
            q = self._queues[(g, t, int(qid))] = _Queue(int(nxt))
            for o, ck, pt, iv, att in flights:
                q.out[int(o)] = Flight(ck, int(pt), int(iv), int(att))
            self._snapshot_flights += len(flights)
        self._seq = base
        replayed = self._replay(base)
        for key, q in self._queues.items():
            q.floors = sorted(q.out)
            for off, fl in q.out.items():
                self._arm(key, off, fl)
        if self._queues:
            log.info(
                "pop state loaded: %d queue(s), %d message(s) in flight, %d journal record(s) "
                "replayed",
                len(self._queues),
                sum(len(q.out) for q in self._queues.values()),
                replayed,
            )

    def _replay(self, base: int) -> int:
        if not self._journal_path.exists():
            return 0
        data = self._journal_path.read_bytes()
        pos = replayed = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            if end < 0:
                break
            line = data[pos:end]
            try:
                crc, text = line.split(b" ", 1)
                if int(crc, 16) != zlib.crc32(text):
                    break
                record = json.loads(text)
            except ValueError:
                break
            pos = end + 1
            if record["s"] <= base:
                continue
            self._apply(record)
            self._seq = record["s"]
            replayed += 1
        if pos < len(data):
            log.warning("pop journal: cut a torn tail of %d byte(s)", len(data) - pos)
            with open(self._journal_path, "r+b") as fh:
                fh.truncate(pos)
        self._records = replayed
        return replayed

    def _apply(self, r: dict[str, Any]) -> None:
        g, t, qid = r["k"]
        key = (g, t, int(qid))
        op = r["op"]
        if op == "pop":
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = _Queue(r["n"])
            for off, att in zip(r["o"], r["a"]):
                q.out[off] = Flight(r["c"], r["t"], r["i"], att)
            q.next = max(q.next, r["n"])
            return
        q = self._queues.get(key)
        fl = q.out.get(r["o"]) if q is not None else None
        if q is None or fl is None:
            return
        if op == "ack" and fl.ck == r["c"]:
            del q.out[r["o"]]
        elif op == "change" and fl.ck == r["c"]:
            q.out[r["o"]] = Flight(r["n"], r["t"], r["i"], fl.attempts)
        elif op == "dead":
            del q.out[r["o"]]


def _load_secret(path: Path) -> bytes:
    if path.exists():
        secret = path.read_bytes()
        if len(secret) >= 16:
            return secret
        log.error("%s is too short: making a new one (handles out are refused)", path)
    secret = secrets.token_bytes(32)
    try:
        write_atomically(path, secret, tmp=path.with_suffix(".tmp"), mode=0o600)
    except OSError as exc:  # a full disk: handles work until the next start
        log.error("could not keep the receipt handles' secret in %s: %s", path, exc)
    return secret


def _check_group(group: object) -> str:
    if not isinstance(group, str) or not _GROUP_RE.fullmatch(group):
        raise InvalidMessageError(f"group={group!r}: must match [A-Za-z0-9_%|-]{{1,120}}")
    return group


def _check_int(what: str, value: object, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InvalidMessageError(f"{what}={value!r}: must be an int in {lo}..{hi}")
    return value
