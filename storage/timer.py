"""Timer messages: RocketMQ 5's timer wheel (``TimerMessageStore``), delivery at any time.

A message whose property ``TIMER_DELIVER_MS`` (epoch ms) or ``TIMER_DELAY_SEC``
(seconds from the put; converted then) names a time in the future is stored in the
system topic ``rmq_sys_wheel_timer``, queue 0, with its real topic and queue in
``REAL_TOPIC``/``REAL_QID`` and its delivery time in ``TIMER_DELIVER_MS``. A time
now or past is delivered at once (the message goes to its own topic, the timer
properties dropped). A negative or non-numeric value, or a time more than
``timer_max_delay_ms`` ahead, is refused at the put with ``InvalidMessageError``
and nothing of the batch is written.

The wheel (:class:`TimerWheel`) has three files under ``<store>/timer/``:

* ``wheel``: ``timer_wheel_slots`` slots of 32 bytes, one per
  ``timer_precision_ms`` of time on a ring (slot = time // precision % slots): the
  slot's time, and the first and last timer-log positions of its chain, and how
  many entries it holds. A slot whose time is not the one asked for is empty (it
  belongs to a round already delivered). Held in memory and written back by the
  pages changed; the pages of slots never used are never touched, in memory or
  on disk (a sparse file).
* ``log/<20-digit offset>``: the append-only timer log, 40-byte entries (previous
  entry of the same slot, CommitLog offset and size of the timer-topic record,
  delivery ms, slot ms, flags). A slot's entries are a chain from its last
  entry back through the ``prev`` pointers, so a tick reads only the due slot's
  entries, never the pending ones of other slots. Files wholly before the first
  entry of every pending slot are deleted.
* ``checkpoint.json``: how far the timer topic's ConsumeQueue is in the wheel
  (``enqueue_offset``), the log's length then (``log_end``), the first slot time
  not yet delivered (``read_time_ms``), and whether the wheel was closed cleanly.

The service (:class:`TimerMessageService`) runs, each tick: *enqueue* (the timer
topic's ConsumeQueue from ``enqueue_offset``: each record's entry appended to the
log and linked into its slot), then *dequeue* (the slots from ``read_time_ms`` to
now: each due entry's record put to its real topic and queue with the same
unique key, keys, tags, flag, born time and reconsume count, the timer
properties dropped; entries of a slot due within ``precision`` are delivered as
soon as their own time comes, so a message arrives at or after its time, within
one tick). A time further than ``timer_roll_window_slots`` from the wheel's read
time is parked in the window's last slot flagged *roll*; when that slot comes the
record is put again to the timer topic (``TIMER_ROLL_TIMES`` + 1) and so enters
the wheel again nearer its time, as RocketMQ rolls them; the re-put also keeps
the record out of CommitLog expiry.

**Recall** (RocketMQ 5.3's ``RecallMessage``, :meth:`TimerMessageService.recall`): a
pending timer message is cancelled by a *delete marker*, a record put to the timer topic
with the same real topic and delivery time and the message's unique key in
``TIMER_DEL_UNIQKEY``, as RocketMQ's broker does. Its entry is flagged ``DELETE`` and
lands in the message's slot (or rolls with it); when the slot is due, the entries whose
real topic and unique key a due marker names are dropped, and the marker itself is never
delivered. The marker is put under the wheel's lock only while the delivery time is
still ahead of the store's clock, so a tick cannot have delivered the message, and the
next tick enqueues the marker before it delivers anything: a recall answered is a
message never delivered; one whose time has come is refused (``TimerRecallError``). The
marker is a CommitLog record like any other: it replicates, and survives a restart.

Recovery and delivery guarantee: **at-least-once**. The checkpoint is written
after the deliveries it covers are flushed, and after the log and wheel are. At
open, after a crash, the log is cut back to the checkpoint's ``log_end`` and the
wheel rebuilt from the log (the entries of each pending slot, in log order, are
exactly its chain); what the timer topic got after ``enqueue_offset`` is enqueued
again from its ConsumeQueue (which the store's own recovery rebuilt from the
CommitLog). Slots from ``read_time_ms`` on are delivered again, but first each
entry's delivered copy is looked for by unique key in its real topic (as the
schedule service does after a crash), so a process crash repeats nothing; a lost
index (power loss without SYNC_FLUSH) can repeat a delivery, never lose one. A
slave keeps no wheel of its own: promoted, it enqueues the timer topic it
replicated and skips, by the same lookup, the entries its old master delivered.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from . import codec
from .config import StoreConfig
from .config_files import JsonConfigFile
from .errors import (
    InvalidConfigError,
    InvalidMessageError,
    StoreClosedError,
    StoreCorruptedError,
    TimerRecallError,
)
from .message import Message, MessageExt, copied, to_real_topic
from .properties import (
    PROP_DELAY,
    PROP_REAL_QID,
    PROP_REAL_TOPIC,
    PROP_TIMER_DEL_UNIQKEY,
    PROP_TIMER_DELAY_SEC,
    PROP_TIMER_DELIVER_MS,
    PROP_TIMER_OUT_MS,
    PROP_TIMER_ROLL_TIMES,
    PROP_UNIQ_KEY,
    check_property_text,
    decode_properties,
)
from .services import DeliveryStore, ServiceThread

log = logging.getLogger("raymq.storage.timer")

TIMER_TOPIC = "rmq_sys_wheel_timer"
TIMER_PROPS = (
    PROP_TIMER_DELIVER_MS,
    PROP_TIMER_DELAY_SEC,
    PROP_TIMER_OUT_MS,
    PROP_TIMER_ROLL_TIMES,
)
_HIDDEN = (*TIMER_PROPS, PROP_REAL_TOPIC, PROP_REAL_QID, PROP_DELAY, PROP_TIMER_DEL_UNIQKEY)
ROLL = 1  # an entry parked in a nearer slot, to be put again to the timer topic
DELETE = 2  # a recall's delete marker: the entry of its unique key in its slot is dropped
_BATCH = 256  # records read or delivered at once

SLOT = np.dtype(
    [("time", "<i8"), ("first", "<i8"), ("last", "<i8"), ("num", "<i4"), ("magic", "<i4")]
)
ENTRY = np.dtype(
    [
        ("prev", "<i8"),
        ("offset", "<i8"),
        ("deliver", "<i8"),
        ("slot", "<i8"),
        ("size", "<i4"),
        ("flags", "<i4"),
    ]
)
ENTRY_SIZE = ENTRY.itemsize  # 40
_PAGE = 4096  # the wheel is written back by pages of 128 slots


# ------------------------------------------------------------------ the put side
def deliver_ms_of(props: Mapping[str, str], now_ms: int, max_delay_ms: int) -> int | None:
    """The delivery time a message's properties ask for (None: not a timer message).

    ``TIMER_DELAY_SEC`` (whole seconds from now) wins over ``TIMER_DELIVER_MS`` (epoch
    ms), as in RocketMQ. Raises ``InvalidMessageError`` for a value that is not a
    non-negative integer, or further than ``max_delay_ms`` ahead."""
    text = props.get(PROP_TIMER_DELAY_SEC)
    name = PROP_TIMER_DELAY_SEC
    if text is None:
        text = props.get(PROP_TIMER_DELIVER_MS)
        name = PROP_TIMER_DELIVER_MS
        if text is None:
            return None
    value = text.strip()
    if not value.isascii() or not value.isdigit():
        raise InvalidMessageError(f"{name}={text!r}: must be a whole number >= 0")
    if len(value) > 18:  # beyond any sane time; also keeps it an int64
        raise InvalidMessageError(f"{name}={text!r}: too far ahead")
    deliver = now_ms + int(value) * 1000 if name == PROP_TIMER_DELAY_SEC else int(value)
    if deliver - now_ms > max_delay_ms:
        raise InvalidMessageError(
            f"{name}={text!r}: delivery {deliver - now_ms} ms from now is over "
            f"timer_max_delay_ms={max_delay_ms}"
        )
    return deliver


def for_put(m: MessageExt, queue_id: int, now_ms: int, config: StoreConfig) -> Message | None:
    """What the store writes for a producer's message that may ask for a time: its
    timer-topic copy when the time is ahead, the message itself without the timer
    properties when it is now or past, None when it asks for none."""
    deliver = deliver_ms_of(m.properties, now_ms, config.timer_max_delay_ms)
    if deliver is None:
        return None
    if not config.timer_wheel_enable:
        raise InvalidMessageError(
            f"{PROP_TIMER_DELIVER_MS}: timer messages are disabled on this store "
            "(timer_wheel_enable=False)"
        )
    props = {k: v for k, v in m.properties.items() if k not in _HIDDEN}
    topic, qid = m.topic, queue_id
    if deliver > now_ms:
        props[PROP_TIMER_DELIVER_MS] = str(deliver)
        props[PROP_REAL_TOPIC] = m.topic
        props[PROP_REAL_QID] = str(queue_id)
        topic, qid = TIMER_TOPIC, 0
    return copied(m, topic, qid, props)


_DELIVER_TAG = f"{PROP_TIMER_DELIVER_MS}\x01".encode()
_DEL_TAG = f"{PROP_TIMER_DEL_UNIQKEY}\x01".encode()


def _is_marker(raw: bytes) -> bool:
    """Whether a timer record's properties make it a recall's delete marker."""
    return _DEL_TAG in raw and PROP_TIMER_DEL_UNIQKEY in decode_properties(raw)


def _deleted_key(m: MessageExt) -> tuple[str, str] | None:
    """(real topic, unique key) a delete marker cancels; None for any other record."""
    uk = m.properties.get(PROP_TIMER_DEL_UNIQKEY)
    real = m.properties.get(PROP_REAL_TOPIC)
    return (real, uk) if uk and real else None


def recall_marker(topic: str, uniq_key: str, deliver_ms: int) -> Message:
    """The timer-topic record that cancels ``topic``'s timer message ``uniq_key`` due at
    ``deliver_ms`` (RocketMQ's ``TIMER_DEL_UNIQKEY`` marker; body ``0`` as there)."""
    props = {
        PROP_TIMER_DELIVER_MS: str(deliver_ms),
        PROP_REAL_TOPIC: topic,
        PROP_REAL_QID: "0",
        PROP_TIMER_DEL_UNIQKEY: uniq_key,
    }
    return Message(TIMER_TOPIC, b"0", properties=props, queue_id=0)


def _deliver_ms(raw: bytes) -> int:
    """``TIMER_DELIVER_MS`` of a stored record's properties, without parsing them all."""
    at = raw.find(_DELIVER_TAG)
    if at < 0 or (at > 0 and raw[at - 1] != 2):
        return int(decode_properties(raw)[PROP_TIMER_DELIVER_MS])
    start = at + len(_DELIVER_TAG)
    return int(raw[start : raw.index(b"\x02", start)])


def _delivered_copy(m: MessageExt) -> Message:
    """The message a due timer-topic record delivers to its real topic."""
    return to_real_topic(m, _HIDDEN)


def _rolled_copy(m: MessageExt) -> Message:
    """The record put again to the timer topic to re-enter the wheel nearer its time."""
    props = dict(m.properties)
    props[PROP_TIMER_ROLL_TIMES] = str(int(props.get(PROP_TIMER_ROLL_TIMES, "0") or 0) + 1)
    return copied(m, TIMER_TOPIC, 0, props)


# ------------------------------------------------------------------ the timer log
class TimerLog:
    """Append-only 40-byte entries in files of ``file_size`` bytes named by their start."""

    def __init__(self, root: Path, file_size: int) -> None:
        self.root = root
        self.file_size = file_size - file_size % ENTRY_SIZE
        root.mkdir(parents=True, exist_ok=True)
        self._files: list[tuple[int, int]] = []  # (start, fd), by start
        for path in sorted(root.iterdir()):
            if path.name.isdigit() and len(path.name) == 20:
                fd = os.open(path, os.O_RDWR)
                self._files.append((int(path.name), fd))
        self._dirty: set[int] = set()
        if self._files:
            start, fd = self._files[-1]
            length = os.fstat(fd).st_size
            self.end = start + length - length % ENTRY_SIZE
        else:
            self.end = 0

    @property
    def min_pos(self) -> int:
        return self._files[0][0] if self._files else self.end

    def _fd_for(self, pos: int, create: bool = False) -> tuple[int, int]:
        for start, fd in reversed(self._files):
            if start <= pos:
                if pos < start + self.file_size:
                    return start, fd
                break
        if not create:
            raise StoreCorruptedError(f"timer log has no file holding position {pos}")
        start = pos - pos % self.file_size
        fd = os.open(self.root / f"{start:020d}", os.O_RDWR | os.O_CREAT, 0o644)
        self._files.append((start, fd))
        return start, fd

    def append(self, entries: np.ndarray) -> None:
        """Write ``entries`` at :attr:`end` (their positions were computed from it)."""
        data = entries.tobytes()
        done = 0
        while done < len(data):
            start, fd = self._fd_for(self.end, create=True)
            room = start + self.file_size - self.end
            chunk = data[done : done + room]
            os.pwrite(fd, chunk, self.end - start)
            self._dirty.add(fd)
            done += len(chunk)
            self.end += len(chunk)

    def read(self, pos: int) -> np.void:
        start, fd = self._fd_for(pos)
        raw = os.pread(fd, ENTRY_SIZE, pos - start)
        if len(raw) != ENTRY_SIZE:
            raise StoreCorruptedError(f"timer log entry at {pos} is cut short")
        return np.frombuffer(raw, dtype=ENTRY)[0]

    def read_all(self, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Every entry before ``end`` and their positions (a rebuild after a crash)."""
        parts, positions = [], []
        for start, fd in self._files:
            stop = min(start + self.file_size, end)
            if stop <= start:
                continue
            raw = os.pread(fd, stop - start, 0)
            n = len(raw) // ENTRY_SIZE
            # count=, not raw[: n * ENTRY_SIZE]: a file with a torn last entry was copied whole
            parts.append(np.frombuffer(raw, dtype=ENTRY, count=n))
            positions.append(start + ENTRY_SIZE * np.arange(n, dtype=np.int64))
        if not parts:
            return np.empty(0, dtype=ENTRY), np.empty(0, dtype=np.int64)
        return np.concatenate(parts), np.concatenate(positions)

    def truncate(self, end: int) -> None:
        """Drop every entry from ``end`` on (those written after the last checkpoint)."""
        end = max(end - end % ENTRY_SIZE, 0)
        keep = []
        for start, fd in self._files:
            if start >= end:
                os.close(fd)
                self._dirty.discard(fd)
                os.unlink(self.root / f"{start:020d}")
            else:
                keep.append((start, fd))
        self._files = keep
        if keep:
            start, fd = keep[-1]
            os.ftruncate(fd, end - start)
        self.end = end

    def delete_before(self, pos: int) -> int:
        """Delete the files that end at or before ``pos`` (never the last); return how many."""
        deleted = 0
        while len(self._files) > 1 and self._files[0][0] + self.file_size <= pos:
            start, fd = self._files.pop(0)
            os.close(fd)
            self._dirty.discard(fd)
            os.unlink(self.root / f"{start:020d}")
            deleted += 1
        return deleted

    def disk_bytes(self) -> int:
        return sum(os.fstat(fd).st_size for _, fd in self._files)

    def flush(self) -> None:
        for fd in list(self._dirty):
            os.fsync(fd)
        self._dirty.clear()

    def close(self) -> None:
        for _, fd in self._files:
            os.close(fd)
        self._files = []


# ------------------------------------------------------------------ the wheel
class TimerWheel:
    """The wheel, its log and checkpoint: the timer state of one store, opened and
    recovered with it. The service that drives it (:class:`TimerMessageService`) may be
    started and stopped many times (a broker's role changes); one runs at a time."""

    def __init__(self, root: Path, config: StoreConfig, now_ms: int, abnormal_start: bool) -> None:
        self.precision = config.timer_precision_ms
        self.slots = config.timer_wheel_slots
        self.roll_slots = config.timer_roll_window_slots
        self.root = root
        self.lock = threading.RLock()  # held by a tick, and by close
        self.closed = False
        root.mkdir(parents=True, exist_ok=True)
        self._checkpoint = JsonConfigFile(root / "checkpoint.json")
        saved = self._checkpoint.load()
        self.log = TimerLog(root / "log", config.timer_log_file_size)
        if saved and int(saved.get("precision_ms", self.precision)) != self.precision:
            raise InvalidConfigError(
                f"timer_precision_ms={self.precision}: the timer wheel in {root} was built "
                f"with {saved['precision_ms']} ms; empty it or keep that precision"
            )
        path = root / "wheel"
        size = self.slots * SLOT.itemsize
        resized = path.exists() and path.stat().st_size != size
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        # in memory, written back page by page (not mapped: a write to a mapped hole on a
        # full disk kills the process); zeros from calloc: untouched pages cost nothing
        self._map = np.zeros(self.slots, dtype=SLOT)
        self._dirty_pages: set[int] = set()
        if resized:
            os.ftruncate(self._fd, 0)
        else:
            self._load()
        os.ftruncate(self._fd, size)  # sparse: pages of slots never used take no disk
        self.w_time = self._map["time"]
        self.w_first = self._map["first"]
        self.w_last = self._map["last"]
        self.w_num = self._map["num"]
        self.enqueue_offset = int(saved.get("enqueue_offset", 0))
        self.read_time_ms = int(saved.get("read_time_ms", self._floor(now_ms)))
        log_end = int(saved.get("log_end", 0))
        clean = bool(saved.get("clean", False)) and not abnormal_start and not resized
        self.clean_start = clean and self.log.end == log_end
        if not self.clean_start:
            self.log.truncate(min(log_end, self.log.end))
            self._rebuild()
        self.checkpoint(clean=False)
        log.info(
            "timer wheel %s opened (%s): %d slots of %d ms, read time %d, log [%d, %d), "
            "timer queue enqueued to %d",
            root,
            "clean" if self.clean_start else "rebuilt from its log",
            self.slots,
            self.precision,
            self.read_time_ms,
            self.log.min_pos,
            self.log.end,
            self.enqueue_offset,
        )

    def _load(self) -> None:
        """Read the wheel file's data extents (its holes are empty slots)."""
        raw = self._map.view(np.uint8)
        size = min(os.fstat(self._fd).st_size, len(raw))
        pos = 0
        while pos < size:
            try:
                start = os.lseek(self._fd, pos, os.SEEK_DATA)
                end = min(os.lseek(self._fd, start, os.SEEK_HOLE), size)
            except OSError:  # no data past pos
                break
            data = os.pread(self._fd, end - start, start)
            raw[start : start + len(data)] = np.frombuffer(data, dtype=np.uint8)
            pos = end

    def _write_back(self) -> None:
        raw = self._map.view(np.uint8)
        for page in sorted(self._dirty_pages):
            at = page * _PAGE
            os.pwrite(self._fd, raw[at : at + _PAGE].data, at)  # a view of the page, no copy
        self._dirty_pages.clear()
        os.fsync(self._fd)

    def _floor(self, ms: int) -> int:
        return ms - ms % self.precision

    def _index(self, slot_ms: int) -> int:
        return (slot_ms // self.precision) % self.slots

    def _rebuild(self) -> None:
        """The slots of every pending entry of the log (after a crash, or a new size)."""
        used = np.flatnonzero(self.w_num != 0)
        self._map[used] = 0
        self._dirty_pages.update((used * SLOT.itemsize // _PAGE).tolist())
        entries, positions = self.log.read_all(self.log.end)
        pending = entries["slot"] >= self.read_time_ms
        if not pending.any():
            return
        slot_ms = entries["slot"][pending].astype(np.int64)
        pos = positions[pending]
        if int(slot_ms.max()) >= self.read_time_ms + self.slots * self.precision:
            raise InvalidConfigError(
                f"timer_wheel_slots={self.slots}: pending timer entries lie beyond the wheel; "
                "use at least the number of slots the wheel was built with"
            )
        times, first_i, counts = np.unique(slot_ms, return_index=True, return_counts=True)
        _, last_rev = np.unique(slot_ms[::-1], return_index=True)
        last_i = len(slot_ms) - 1 - last_rev
        idx = (times // self.precision) % self.slots
        self.w_time[idx] = times
        self.w_first[idx] = pos[first_i]
        self.w_last[idx] = pos[last_i]
        self.w_num[idx] = counts
        self._dirty_pages.update((idx * SLOT.itemsize // _PAGE).tolist())

    # -- entries
    def add(
        self, records: Sequence[tuple[int, int, int]], flags: Sequence[int] | None = None
    ) -> int:
        """Link ``(commitlog offset, size, delivery ms)`` records into their slots (with
        their ``flags``, e.g. ``DELETE``); return how many were parked to roll. The log is
        written first: if that fails (a full disk) neither it nor the wheel changed."""
        if not records:
            return 0
        n = len(records)
        rec = np.array(records, dtype=np.int64).reshape(n, 3)
        p = self.precision
        read = self.read_time_ms
        roll_at = read + self.roll_slots * p
        slot_ms = np.maximum(rec[:, 2] - rec[:, 2] % p, read)
        roll = slot_ms >= roll_at
        slot_ms[roll] = roll_at - p
        start = self.log.end
        pos = start + ENTRY_SIZE * np.arange(n, dtype=np.int64)
        k = (slot_ms // p) % self.slots
        # each record's previous entry in its slot: the record before it in the batch with
        # the same slot, or for the first, the slot's last entry if it is of the same time
        order = np.argsort(k, kind="stable")
        ks, ps = k[order], pos[order]
        head = np.ones(n, dtype=bool)
        head[1:] = ks[1:] != ks[:-1]
        prev_sorted = np.empty(n, dtype=np.int64)
        prev_sorted[1:] = ps[:-1]
        kh = ks[head]
        same = (self.w_time[kh] == slot_ms[order][head]) & (self.w_num[kh] > 0)
        prev_sorted[head] = np.where(same, self.w_last[kh], -1)
        prev = np.empty(n, dtype=np.int64)
        prev[order] = prev_sorted
        out = np.zeros(n, dtype=ENTRY)
        out["prev"], out["offset"], out["deliver"] = prev, rec[:, 0], rec[:, 2]
        marks = np.zeros(n, dtype=np.int64) if flags is None else np.asarray(flags, np.int64)
        out["slot"], out["size"] = slot_ms, rec[:, 1]
        out["flags"] = np.where(roll, ROLL, 0) | (marks & DELETE)
        try:
            self.log.append(out)
        except OSError:
            self.log.truncate(start)
            raise
        # per slot touched: first (kept if it had entries of that time), last, count
        tail = np.ones(n, dtype=bool)
        tail[:-1] = ks[1:] != ks[:-1]
        counts = np.diff(np.append(np.flatnonzero(head), n))
        self.w_first[kh] = np.where(same, self.w_first[kh], ps[head])
        self.w_num[kh] = np.where(same, self.w_num[kh], 0) + counts
        self.w_time[kh] = slot_ms[order][head]
        self.w_last[kh] = ps[tail]
        self._dirty_pages.update(np.unique(kh * SLOT.itemsize // _PAGE).tolist())
        return int(roll.sum())

    def slot_count(self, slot_ms: int) -> int:
        k = self._index(slot_ms)
        return int(self.w_num[k]) if self.w_time[k] == slot_ms else 0

    def chain(self, slot_ms: int) -> list[tuple[int, np.void]]:
        """The entries of ``slot_ms``'s slot with their log positions, oldest first."""
        k = self._index(slot_ms)
        if self.w_time[k] != slot_ms or self.w_num[k] == 0:
            return []
        out = []
        pos = int(self.w_last[k])
        first = int(self.w_first[k])
        for _ in range(int(self.w_num[k])):
            if pos < self.log.min_pos:
                log.error("timer slot %d: entry %d was deleted; its chain ends there", slot_ms, pos)
                break
            e = self.log.read(pos)
            out.append((pos, e))
            if pos == first:
                break
            pos = int(e["prev"])
            if pos < 0:
                break
        out.reverse()
        return out

    def next_pending(self, until_ms: int) -> int | None:
        """The first slot time in [read time, ``until_ms``] that holds entries."""
        start = self.read_time_ms
        if until_ms < start:
            return None
        count = min((until_ms - start) // self.precision + 1, self.slots)
        times = start + self.precision * np.arange(count, dtype=np.int64)
        idx = (times // self.precision) % self.slots
        hit = np.flatnonzero((self.w_time[idx] == times) & (self.w_num[idx] > 0))
        return int(times[hit[0]]) if len(hit) else None

    def pending_slots(self) -> int:
        return int(np.count_nonzero((self.w_time >= self.read_time_ms) & (self.w_num > 0)))

    def pending_entries(self) -> int:
        live = (self.w_time >= self.read_time_ms) & (self.w_num > 0)
        return int(self.w_num[live].sum())

    # -- durability
    def checkpoint(self, clean: bool = False) -> None:
        """Make the log and wheel durable, then record how far they go."""
        self.log.flush()
        self._write_back()
        self._checkpoint.save(
            {
                "enqueue_offset": self.enqueue_offset,
                "log_end": self.log.end,
                "read_time_ms": self.read_time_ms,
                "precision_ms": self.precision,
                "slots": self.slots,
                "clean": clean,
            }
        )

    def clean_log(self) -> int:
        """Delete the log files no pending slot reaches back into."""
        live = (self.w_time >= self.read_time_ms) & (self.w_num > 0)
        oldest = int(self.w_first[live].min()) if live.any() else self.log.end
        return self.log.delete_before(oldest)

    def disk_bytes(self) -> int:
        """What the wheel takes on disk: the log's bytes and the wheel's allocated blocks."""
        st = os.fstat(self._fd)
        return self.log.disk_bytes() + st.st_blocks * 512

    def close(self, clean: bool = True) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            if clean:
                try:
                    self.checkpoint(clean=True)
                except OSError as exc:
                    log.warning("timer wheel %s: no clean checkpoint (%s)", self.root, exc)
            self.log.close()
            os.close(self._fd)


# ------------------------------------------------------------------ the service
def _born_of(messages: Sequence[MessageExt]) -> list[tuple[int, str, int]]:
    return [(m.born_timestamp, m.born_host, m.reconsume_times) for m in messages]


IDLE_CHECKPOINT_S = 60.0
"""How often a wheel whose read time alone went on (nothing enqueued or due) saves it:
a restart walks the slots since, which holds no entry, in one ``next_pending``. Saving
it each tick flushed the CommitLog, wrote the checkpoint and scanned every slot once a
second on every idle broker."""


class TimerMessageService(ServiceThread):
    """Enqueue the timer topic into the wheel and deliver what is due (module docstring)."""

    name = "timer"

    def __init__(self, store: DeliveryStore, wheel: TimerWheel) -> None:
        cfg = store.config
        super().__init__(cfg.timer_interval_ms / 1000)
        self.store = store
        self.wheel = wheel
        self.flush_interval_s = cfg.timer_flush_interval_ms / 1000
        self._started_ms = store.now_ms()
        self._cur_time = -1  # the slot being delivered, its entries, those delivered
        self._cur_count = 0
        self._cur: list[tuple[int, np.void]] = []
        self._done: set[int] = set()
        self._verify = True  # look for copies delivered before a restart
        self._dirty = False  # entries enqueued or delivered since the last checkpoint
        self._moved = False  # only the read time went on (nothing was due)
        self._last_checkpoint = time.monotonic()
        self.delivered = 0
        self.parked = 0  # entries parked in a nearer slot to roll
        self.rolled = 0  # records put again to the timer topic
        self.entries_read = 0  # timer-log entries read by dequeues: what a tick costs
        self.recalled = 0  # messages a recall's marker kept from delivery

    def run_once(self) -> int:
        """One tick: enqueue, deliver what is due; return how many were delivered."""
        with self.wheel.lock:
            if self.wheel.closed:
                return 0
            self._enqueue()
            delivered = self._dequeue(self.store.now_ms())
            since = time.monotonic() - self._last_checkpoint
            if (self._dirty and since >= self.flush_interval_s) or (
                self._moved and since >= IDLE_CHECKPOINT_S
            ):
                self.checkpoint()
            return delivered

    def checkpoint(self) -> None:
        with self.wheel.lock:
            if self.wheel.closed:
                return
            if self._dirty:
                self.store.commitlog.flush()  # the deliveries it will claim are durable first
            self.wheel.checkpoint()
            if self._dirty:  # only entries enqueued or delivered move what the log must keep
                self.wheel.clean_log()
            self._dirty = self._moved = False
            self._last_checkpoint = time.monotonic()

    def stop(self) -> None:
        super().stop()
        if self._dirty or self._moved:
            try:
                self.checkpoint()
            except Exception:
                log.exception("timer: checkpoint at stop failed")

    # -- enqueue
    def _enqueue(self) -> None:
        cq = self.store.find_consume_queue(TIMER_TOPIC, 0)
        if cq is None:
            return
        wheel = self.wheel
        if wheel.enqueue_offset > cq.max_offset:  # the queue lost a tail in a crash
            log.warning(
                "timer queue ends at %d, before the wheel's %d: enqueueing from there",
                cq.max_offset,
                wheel.enqueue_offset,
            )
            wheel.enqueue_offset = cq.max_offset
        offset = max(wheel.enqueue_offset, cq.min_offset)
        cl = self.store.commitlog
        while True:
            entries = cq.read(offset, _BATCH)
            if not len(entries):
                break
            ok = (entries["size"] > 0) & (entries["offset"] >= cl.min_offset)
            picked = entries[ok]
            records: list[tuple[int, int, int]] = []
            flags: list[int] = []
            if len(picked):
                data = cl.read_runs(picked["offset"], picked["size"])
                msgs = codec.decode_records(data, check_crc=False)
                for m, phys, size in zip(msgs, picked["offset"].tolist(), picked["size"].tolist()):
                    try:
                        deliver = _deliver_ms(m.raw_properties)
                    except (KeyError, ValueError):
                        log.error("timer record at %d has no delivery time: dropped", phys)
                        continue
                    if deliver < wheel.read_time_ms and self._delivered_before(m):
                        continue  # its time passed while this wheel did not run
                    records.append((phys, size, deliver))
                    flags.append(DELETE if _is_marker(m.raw_properties) else 0)
            self.parked += wheel.add(records, flags)
            offset += len(entries)
            wheel.enqueue_offset = offset
            self._dirty = True

    def _delivered_before(self, m: MessageExt) -> bool:
        """Whether a copy of timer record ``m`` went on already (its real topic, or the
        timer topic again for a roll), found by unique key: a restart or failover."""
        uk = m.properties.get(PROP_UNIQ_KEY)
        real = m.properties.get(PROP_REAL_TOPIC)
        if not uk or not real or not self.store.config.message_index_enable:
            return False
        for topic in (real, TIMER_TOPIC):
            for x in self.store.query_by_key(topic, uk, max_count=16):
                if x.commitlog_offset > m.commitlog_offset:
                    return True
        return False

    # -- dequeue
    def _dequeue(self, now_ms: int) -> int:
        wheel = self.wheel
        p = wheel.precision
        delivered = 0
        while True:
            slot_ms = wheel.read_time_ms
            if now_ms < slot_ms:
                break
            count = wheel.slot_count(slot_ms)
            if slot_ms != self._cur_time or count != self._cur_count:
                if slot_ms != self._cur_time:
                    self._done.clear()
                self._cur_time, self._cur_count = slot_ms, count
                self._cur = wheel.chain(slot_ms)
                self.entries_read += len(self._cur)
            due = [
                (pos, e)
                for pos, e in self._cur
                if pos not in self._done and (e["flags"] & ROLL or int(e["deliver"]) <= now_ms)
            ]
            due.sort(key=lambda pe: (int(pe[1]["deliver"]), pe[0]))
            verify = self._verify and slot_ms < self._started_ms
            missing = False  # a due entry not delivered before a restart
            deleted = self._deleted(due)
            for i in range(0, len(due), _BATCH):
                sent, fresh = self._deliver(due[i : i + _BATCH], verify, deleted)
                delivered += sent
                missing = missing or fresh
            if due:
                self._dirty = True
            if now_ms < slot_ms + p:
                break  # the slot's later entries are not due yet
            if missing or not verify:
                self._verify = False  # the slots after this one were never started
            # on to the next slot holding entries, or to the current one
            wheel.read_time_ms = slot_ms + p
            nxt = wheel.next_pending(now_ms - now_ms % p)
            wheel.read_time_ms = nxt if nxt is not None else now_ms - now_ms % p
            self._moved = True
        self.delivered += delivered
        return delivered

    def _deleted(self, due: list[tuple[int, np.void]]) -> set[tuple[str, str]]:
        """(real topic, unique key) of the messages the due delete markers cancel (a
        marker due to roll cancels nothing yet: it rolls with its message)."""
        marks = [e for _, e in due if e["flags"] & DELETE and not e["flags"] & ROLL]
        if not marks:
            return set()
        cl = self.store.commitlog
        marks = [e for e in marks if cl.min_offset <= int(e["offset"]) < cl.max_offset]
        if not marks:
            return set()
        offsets = np.array([int(e["offset"]) for e in marks], dtype=np.int64)
        sizes = np.array([int(e["size"]) for e in marks], dtype=np.int32)
        out = set()
        for m in codec.decode_records(cl.read_runs(offsets, sizes), check_crc=False):
            key = _deleted_key(m)
            if key is not None:
                out.add(key)
        return out

    def _deliver(
        self, due: list[tuple[int, np.void]], verify: bool, deleted: set[tuple[str, str]]
    ) -> tuple[int, bool]:
        """Put the due entries' records where they go (not those ``deleted`` names, nor
        the delete markers themselves); return (how many were delivered to their
        topics, whether any was found not delivered before a restart)."""
        cl = self.store.commitlog
        live = []
        for pos, e in due:
            if cl.min_offset <= int(e["offset"]) < cl.max_offset:
                live.append(e)
            else:
                log.error(
                    "timer entry at %d: its record at %d is not in the CommitLog (expired): lost",
                    pos,
                    int(e["offset"]),
                )
                self._done.add(pos)
        if not live:
            return 0, False
        offsets = np.array([int(e["offset"]) for e in live], dtype=np.int64)
        sizes = np.array([int(e["size"]) for e in live], dtype=np.int32)
        originals = codec.decode_records(cl.read_runs(offsets, sizes), check_crc=False)
        out: list[Message] = []
        kept: list[MessageExt] = []
        fresh = False
        sent = 0
        for e, m in zip(live, originals):
            if m.topic != TIMER_TOPIC or m.commitlog_offset != int(e["offset"]):
                log.error("timer entry for %d names no timer record: dropped", int(e["offset"]))
                continue
            roll = bool(e["flags"] & ROLL)
            if not roll:
                if e["flags"] & DELETE:
                    continue  # a marker: its work is done
                real = m.properties.get(PROP_REAL_TOPIC)
                uk = m.properties.get(PROP_UNIQ_KEY)
                if real and uk and (real, uk) in deleted:
                    self.recalled += 1
                    log.info("timer message %s of %s was recalled: not delivered", uk, real)
                    continue
            if verify and self._delivered_before(m):
                continue
            fresh = True
            try:
                out.append(_rolled_copy(m) if roll else _delivered_copy(m))
            except (KeyError, ValueError, InvalidMessageError) as exc:
                log.error(
                    "timer record at %d cannot be delivered (%s): dropped", m.commitlog_offset, exc
                )
                continue
            kept.append(m)
            if roll:
                self.rolled += 1
            else:
                sent += 1
        if out:
            batch = codec.encode_batch(
                out, max_message_size=self.store.config.max_message_size, born=_born_of(kept)
            )
            self.store._put_encoded(batch)  # raises: these entries stay due, tried next tick
        self._done.update(pos for pos, e in due)
        return sent, fresh

    def recall(self, topic: str, uniq_key: str, deliver_ms: int) -> None:
        """Cancel ``topic``'s timer message ``uniq_key`` due at ``deliver_ms`` (module
        docstring, "Recall"): its delete marker is put, and it will never be delivered.
        Raises ``TimerRecallError`` when its time has come (delivered, or being
        delivered) or is further than ``timer_max_delay_ms`` ahead; nothing is written
        then. Recalling it again, or a key never sent, writes a marker that cancels
        nothing more (RocketMQ's broker answers those alike)."""
        if not topic or not uniq_key:
            raise TimerRecallError("a recall names a topic and a unique key")
        check_property_text("topic", topic)
        check_property_text("unique key", uniq_key)
        with self.wheel.lock:
            if self.wheel.closed:
                raise StoreClosedError("the timer wheel is closed")
            now = self.store.now_ms()
            if deliver_ms <= now:
                raise TimerRecallError(
                    f"timer message {uniq_key} of {topic}: its time {deliver_ms} has come "
                    f"({now - deliver_ms} ms ago): delivered, or being delivered"
                )
            if deliver_ms - now > self.store.config.timer_max_delay_ms:
                raise TimerRecallError(
                    f"timer message {uniq_key} of {topic}: {deliver_ms} is further ahead "
                    "than any timer message can be"
                )
            batch = codec.encode_batch(
                [recall_marker(topic, uniq_key, deliver_ms)],
                max_message_size=self.store.config.max_message_size,
            )
            self.store._put_encoded(batch)  # enqueued by the next tick, before its deliveries
        log.info("timer message %s of %s due at %d: recall marker put", uniq_key, topic, deliver_ms)

    def pending(self) -> int:
        """Timer messages waiting in the wheel (a rolled one counts where it is parked)."""
        with self.wheel.lock:
            if self.wheel.closed:
                return 0
            done = len(self._done) if self._cur_time == self.wheel.read_time_ms else 0
            return self.wheel.pending_entries() - done
