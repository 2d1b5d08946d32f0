"""MessageStore: the facade that wires CommitLog, ConsumeQueues, IndexFile,
checkpoint, flush, recovery and expiry (RocketMQ's ``DefaultMessageStore``).

Invariants kept here:

* a put is one append to the CommitLog under one lock, and its ConsumeQueue
  and index entries are dispatched before the lock is released, so a queue's
  ``max_offset`` never names a record that is not in the CommitLog;
* under SYNC_FLUSH a put returns only after its bytes were fsynced (puts that
  race share one fsync);
* after recovery no ConsumeQueue entry points past the CommitLog's end and
  every record in the CommitLog has its ConsumeQueue entry;
* a put that cannot get disk space (over ``disk_space_warning_level_ratio``, or
  a file that cannot be allocated) raises ``DiskFullError`` having written
  nothing: the files a put needs are allocated before its first byte is written.
  Reads never need space: a store on a full disk opens and serves what it holds.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from . import codec, producer_state, record, replica, timer, transaction
from .checkpoint import Checkpoint, CheckpointFile
from .commitlog import CommitLog
from .config import StoreConfig
from .config_files import JsonConfigFile
from .consume_queue import UNIT, ConsumeQueue
from .consume_queue_store import ConsumeQueueStore
from .errors import (
    DiskFullError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    StoreClosedError,
    StoreCorruptedError,
    StoreLockedError,
)
from .index_file import IndexService
from .message import GetResult, GetStatus, Message, MessageExt, PutResult, PutStatus, RawGetResult
from .producer_state import ProducerStateTable
from .put_result import PutBatchResult, PutResults
from .quarantine import QUARANTINE_TOPIC
from .recovery import recover
from .schedule import (
    SCHEDULE_TOPIC,
    ScheduleMessageService,
    as_message,
    born_of,
    to_schedule,
)
from .services import (
    CleanCommitLogService,
    DiskWatchService,
    FlushConsumeQueueService,
    FlushRealTimeService,
    GroupCommitService,
)
from .subscription import matches, parse_subscription, tag_codes

log = logging.getLogger("raymq.storage.store")

DispatchListener = Callable[[str, int, int], None]
_PRODUCER_STATE = "producer_state"  # config/producer_state.json: the table's snapshot
_DISK_CHECK_S = 0.1  # while writes are taken, the disk's use is looked at this often


def disk_used_ratio(path: str | os.PathLike[str]) -> float:
    """The used share of the space a writer can have on ``path``'s disk, as df's Use% and
    RocketMQ's getDiskPartitionSpaceUsedPercent count it: ``used / (used + available)``.
    Blocks reserved for root, or held back by a thin pool or a quota, are neither: a disk
    whose available space runs out reads 100 % however much of it is reserved, and one
    whose reserve is large does not read nearly full while it holds little."""
    usage = shutil.disk_usage(path)
    room = usage.used + usage.free
    return usage.used / room if room else 0.0


_RECORD_SIZE = struct.Struct(">i")  # a CommitLog record's TOTALSIZE
MAX_SCAN_ENTRIES = 800  # ConsumeQueue entries one filtered pull may look at


LITE_STATE_TOPIC = "RMQ_SYS_LITE_STATE"
"""The topic of lite consumer state records (``storage.lite.state``), written by a Raft
leader through its log only."""
_RESERVED = frozenset(
    {
        SCHEDULE_TOPIC,
        QUARANTINE_TOPIC,
        timer.TIMER_TOPIC,
        transaction.HALF_TOPIC,
        transaction.OP_HALF_TOPIC,
        transaction.CHECK_MAX_TOPIC,
        transaction.COMMIT_TOPIC,
    }
)
"""Topics only the store and its broker write."""


_WRITE_ONE_KEYS = 16
"""The most index keys ``storage._native.write_one`` links for one record."""
_ONE_SEND_ELSEWHERE = _RESERVED | {LITE_STATE_TOPIC}
"""Topics :meth:`MessageStore.put_one_send` leaves to the batch's put (which refuses a
send to most of them, and stores the others as it always has)."""


def _needs_copies(batch: codec.EncodedBatch) -> bool:
    """Whether a producer's batch holds delayed or transactional messages, which the
    store keeps as copies in a system topic before they reach their own."""
    if batch.delay_levels is not None and batch.delay_levels.any():
        return True
    return batch.timer or transaction.may_hold_transactional(batch)


@dataclasses.dataclass(frozen=True, slots=True)
class _Answers:
    """The answers of one read of a queue (:meth:`MessageStore.get_raw`), each naming
    the queue's bounds as the read found them."""

    min_off: int
    max_off: int

    def empty(self, status: GetStatus, next_offset: int) -> RawGetResult:
        return RawGetResult(status, b"", 0, next_offset, self.min_off, self.max_off)

    def found(self, data: bytes | memoryview, sizes: Any, next_offset: int) -> RawGetResult:
        """``data``: the records of ``sizes`` (a list or an array) back to back."""
        sizes = np.asarray(sizes, dtype=np.int32)
        return RawGetResult(
            GetStatus.FOUND, data, len(sizes), next_offset, self.min_off, self.max_off, sizes
        )

    def expired(self, cq: ConsumeQueue) -> RawGetResult:
        """The records were deleted under the read (their CommitLog file expired): the
        consumer is sent to where the queue starts now."""
        first = cq.min_offset
        return RawGetResult(GetStatus.OFFSET_TOO_SMALL, b"", 0, first, first, self.max_off)


class MessageStore:
    """A RocketMQ-style message store in one directory of the local disk.

    ``clock`` (seconds, like ``time.time``) stamps messages, drives expiry and paces
    the disk checks; ``disk_usage`` returns the used ratio of the store's disk. Both are
    injectable for tests; the defaults are the real ones.
    """

    def __init__(
        self,
        config: StoreConfig,
        *,
        clock: Callable[[], float] = time.time,
        disk_usage: Callable[[], float] | None = None,
        start_services: bool = True,
    ) -> None:
        self.config = config
        self.root = Path(config.store_dir)
        self._clock = clock
        self._disk_usage = disk_usage or self._real_disk_usage
        self._store_host = codec.host_to_bytes(config.store_host)
        self._put_lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()  # a checkpoint's write (checkpoint_now)
        self._checkpoint_turn = threading.Lock()  # one checkpoint_now at a time
        self._truncations = 0  # truncate_commitlog's count, under both locks
        self._listeners: list[DispatchListener] = []
        self._cqs = ConsumeQueueStore(
            self.root / "consumequeue",
            config.consume_queue_file_entries,
            preallocate=config.preallocate,
        )
        self._closed = False
        self._dispatched = 0  # commitlog offset below which every record is dispatched
        self._disk_ratio = 0.0  # the disk's used share, when last looked at
        self._disk_checked = float("-inf")  # when, by ``clock``
        self._over_warning_level = False
        self._disk_lock = threading.Lock()  # one measure at a time (a put's, the watch's)
        self._disk_watch: DiskWatchService | None = None  # measures off the put's thread
        self._allocation_failed = False  # the last put found no room for a file
        self._services: list = []
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._acquire_lock()
        self.producers = ProducerStateTable(
            config.producer_state_keep_runs, config.producer_state_expire_ms
        )
        # transactional producers' fences (``storage.transaction``), set by the broker
        self.txn_fences = transaction.TransactionalFences()
        self._producer_snapshot_ms = 0.0  # when last taken, by ``clock``
        self._snapshot_lock = threading.Lock()
        self.commitlog = CommitLog(
            self.root / "commitlog", config.commitlog_file_size, preallocate=config.preallocate
        )
        self.index = IndexService(
            self.root / "index",
            config.index_hash_slots,
            config.index_max_entries,
            preallocate=config.preallocate,
        )
        self._checkpoint: CheckpointFile | None = None
        try:
            self._checkpoint = CheckpointFile(self.root / "checkpoint")
            self.abnormal_start = (self.root / "abort").exists()
            self._recover()
            self._dispatched = self.commitlog.max_offset
            self._recover_producers()
            self._create_abort_file()
            cp = self._checkpoint.value
            self._checkpoint.write(
                Checkpoint(
                    cp.physic_timestamp,
                    cp.logics_timestamp,
                    cp.index_timestamp,
                    self.commitlog.max_offset,
                    self.commitlog.max_offset,
                    -1,
                )
            )
            # timer messages: the wheel opens with the store (rebuilt if it crashed)
            self.timer_wheel = timer.TimerWheel(
                self.root / "timer", config, self.now_ms(), self.abnormal_start
            )
        except BaseException:
            self._release_files()
            raise
        # part of the put path, not upkeep: runs whether or not the services do
        self._group_commit: GroupCommitService | None = None
        if config.sync_flush:
            self._group_commit = GroupCommitService(self.commitlog)
            self._group_commit.start()
        self.schedule = ScheduleMessageService(self)
        # timer messages (storage.timer): like the schedule service, its service runs
        # here or, in a broker, on the master only
        self.timer = timer.TimerMessageService(self, self.timer_wheel)
        if start_services:
            self._services.append(self.schedule)
            if config.timer_wheel_enable:
                self._services.append(self.timer)
            if not config.sync_flush:
                self._services.append(FlushRealTimeService(self))
            self._services.append(FlushConsumeQueueService(self))
            self._services.append(CleanCommitLogService(self))
            for service in self._services:
                service.start()
            self.watch_disk()

    # ------------------------------------------------------------ lifecycle
    def _acquire_lock(self) -> int:
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise StoreLockedError(
                f"{self.root} is in use by another process (its 'lock' file is held)"
            ) from exc
        return fd

    def _create_abort_file(self) -> None:
        fd = os.open(self.root / "abort", os.O_WRONLY | os.O_CREAT, 0o644)
        os.fsync(fd)
        os.close(fd)

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """A clean stop: flush everything, record the exact end, remove ``abort``."""
        if self._closed:
            return
        for service in self._services:
            service.stop()
        if self._group_commit is not None:
            self._group_commit.stop()  # the flush below serves whoever still waits
        self.timer_wheel.close(clean=True)  # timer: after its service stopped
        with self._put_lock:
            self._closed = True
            end = self.commitlog.max_offset
            self.commitlog.flush()
            self._cqs.flush()
            self.index.flush()
            assert self._checkpoint is not None
            now = int(self._clock() * 1000)
            # clean only when every record has its entries: a slave's records appended but
            # not dispatched yet get them (and their producers' numbers) from the recovery
            # at the next start
            done = self._dispatched
            self._write_producers(self._producer_snapshot(done))
            with self._checkpoint_lock:
                self._checkpoint.write(
                    Checkpoint(now, now, now, end, done, end if done == end else -1)
                )
            (self.root / "abort").unlink(missing_ok=True)
        self._release_files()
        log.info("store %s closed cleanly at commitlog offset %d", self.root, end)

    def _release_files(self) -> None:
        group_commit = getattr(self, "_group_commit", None)
        if group_commit is not None:
            group_commit.stop()
        wheel = getattr(self, "timer_wheel", None)
        if wheel is not None:
            wheel.close(clean=False)  # timer: closed cleanly by close() before, if at all
        self.commitlog.close()
        self._cqs.close()
        self.index.close()
        if self._checkpoint is not None:
            self._checkpoint.close()
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.root} is closed")

    # ------------------------------------------------------------ recovery
    def _recover(self) -> None:
        started = time.monotonic()
        assert self._checkpoint is not None
        recover(
            commitlog=self.commitlog,
            queues=self._cqs,
            index=self.index,
            config=self.config,
            checkpoint=self._checkpoint.value if self._checkpoint.valid else None,
            abnormal_start=self.abnormal_start,
        )
        log.info(
            "store %s recovered (%s start) in %.2fs: commitlog [%d, %d), %d queues",
            self.root,
            "abnormal" if self.abnormal_start else "normal",
            time.monotonic() - started,
            self.commitlog.min_offset,
            self.commitlog.max_offset,
            len(self._cqs),
        )

    def _recover_producers(self) -> None:
        """The idempotent producers' table: its snapshot, then the records after it."""
        data = self.config_file(_PRODUCER_STATE).load()
        covered = self.producers.load(data) if data else 0
        end = self.commitlog.max_offset
        if covered > end:  # the CommitLog lost a tail the snapshot saw (a crash)
            self.producers.truncate(end)
        started = time.monotonic()
        found = producer_state.replay(self.producers, self.commitlog, covered, end)
        if found or len(self.producers):
            log.info(
                "store %s: %d idempotent producer queue(s) known; %d run(s) replayed from "
                "commitlog offset %d in %.2fs",
                self.root,
                len(self.producers),
                found,
                max(covered, self.commitlog.min_offset),
                time.monotonic() - started,
            )

    def _producer_snapshot(self, offset: int) -> dict[str, object]:
        """The producers' table as covering the CommitLog up to ``offset`` (the caller
        holds the put lock, so no put is between the two)."""
        self.producers.expire(int(self._clock() * 1000))
        self.producers.changed = False
        self._producer_snapshot_ms = self._clock() * 1000
        return self.producers.snapshot(offset)

    def _write_producers(self, snapshot: dict[str, object]) -> None:
        with self._snapshot_lock:  # one writer of the file at a time
            self.config_file(_PRODUCER_STATE).save(snapshot)

    # ------------------------------------------------------------ queues
    def _cq(self, topic: str, queue_id: int) -> ConsumeQueue:
        return self._cqs.find_or_create(topic, queue_id)

    def find_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue's ConsumeQueue, or None when nothing was ever put to it."""
        return self._cqs.find(topic, queue_id)

    def queues(self) -> list[tuple[str, int]]:
        return sorted(self._cqs)

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self._cqs})

    def add_dispatch_listener(self, listener: DispatchListener) -> None:
        """Call ``listener(topic, queue_id, max_offset)`` after new messages are dispatched."""
        self._listeners.append(listener)

    # ------------------------------------------------------------ put
    def put(self, message: Message) -> PutResult:
        return self.put_batch([message])[0]

    def put_batch(self, messages: Iterable[Message]) -> PutResults:
        """Validate, encode and store messages as one append; nothing is written on error.
        The results read as a list of :class:`PutResult`, each built when read."""
        batch = codec.encode_batch(messages, max_message_size=self.config.max_message_size)
        return PutResults(self.put_encoded(batch))

    def put_encoded(self, batch: codec.EncodedBatch) -> PutBatchResult:
        """Store a batch a producer encoded (the broker's path): patch, append, dispatch."""
        return self._durable(*self.put_encoded_written(batch))

    def put_encoded_written(self, batch: codec.EncodedBatch) -> tuple[PutBatchResult, int]:
        """:meth:`put_encoded` up to the write, without waiting for SYNC_FLUSH's flush:
        the result and the CommitLog end to wait for with :meth:`wait_durable` (0: none).
        A server writes its requests in the order they came this way (an idempotent
        producer's runs must arrive in sequence), and waits for their flushes together."""
        return self._write(self._checked(batch))

    def put_one_written(self, batch: codec.EncodedBatch) -> tuple[int, int, int]:
        """:meth:`put_encoded_written` of a batch of one record (the lite store's single
        put), answering only what such a caller reads: the record's CommitLog offset,
        the store time written in it (ms), and the end to wait for (0: none). The same
        checks, bytes and entries; no result arrays are built."""
        batch = self._checked(batch)
        if (
            batch.producer_id is not None
            or len(batch) != 1
            or len(batch.topics) != 1
            or batch.topics[0] == SCHEDULE_TOPIC
        ):  # as _append tells them: not for _append_one
            result, end = self._write(batch)
            return int(result.commitlog_offsets[0]), self.now_ms(), end
        self._refuse_if_disk_full()
        with self._put_lock:
            self._check_open()
            topic, queue_id, _, phys, store_ts, top, end = self._append_one_at(batch)
        self._notify([(topic, queue_id, top)])
        return phys, store_ts, end if self.config.sync_flush else 0

    def _checked(self, batch: codec.EncodedBatch) -> codec.EncodedBatch:
        """:meth:`put_encoded_written`'s checks (raised before anything is written); the
        batch to write (copies where delayed or transactional messages need them)."""
        self._check_open()
        batch.check_structure()
        self._check_bodies(batch)
        for topic in batch.topics:
            if topic == SCHEDULE_TOPIC:
                raise InvalidMessageError(f"topic={topic!r} is reserved for delayed messages")
            if topic == QUARANTINE_TOPIC:
                raise InvalidMessageError(f"topic={topic!r} is reserved for damaged records")
            if topic == timer.TIMER_TOPIC:
                raise InvalidMessageError(f"topic={topic!r} is reserved for timer messages")
            if topic == transaction.COMMIT_TOPIC:
                raise InvalidMessageError(f"topic={topic!r} is reserved for commit markers")
            if topic == LITE_STATE_TOPIC:
                raise InvalidMessageError(f"topic={topic!r} is reserved for lite consumer state")
        if batch.producer_id is None and _needs_copies(batch):
            batch = self._to_copies(batch)
        return batch

    def put_group(self, batch: codec.EncodedBatch, marker: Message) -> PutBatchResult:
        """Store ``batch`` and then ``marker`` (``transaction.commit_marker``) in one
        append, as a *one-phase commit*: all of it or, after a crash that cut the append
        short, none of it (recovery drops a group whose marker is missing; a slave
        dispatches it once the marker arrived). The messages are stored as a committed
        transaction's (SYSFLAG ``TRANSACTION_COMMIT_TYPE``); they must be plain: no delay,
        no timer, no half message, no idempotent numbering. The result covers the batch's
        messages and, last, the marker."""
        self._check_open()
        batch.check_structure()
        if not len(batch):
            raise InvalidMessageError("a one-phase commit of no message")
        if (
            batch.transactional
            or batch.timer
            or batch.delay_levels is not None
            or batch.producer_id is not None
        ):
            raise InvalidMessageError(
                "a one-phase commit stores plain messages: no delay, timer, half message "
                "or idempotent numbering"
            )
        if marker.topic != transaction.COMMIT_TOPIC:
            raise InvalidMessageError(f"a commit marker goes to {transaction.COMMIT_TOPIC}")
        self._check_bodies(batch)
        for topic in batch.topics:
            if topic in _RESERVED or topic.upper().startswith("RMQ_SYS_"):
                raise InvalidMessageError(f"topic={topic!r} is reserved: no commit writes it")
        end = codec.encode_batch([marker], max_message_size=self.config.max_message_size)
        return self._put_encoded(transaction.as_group(batch, end))

    def _check_bodies(self, batch: codec.EncodedBatch) -> None:
        shortest, longest = batch.body_range()
        if longest > self.config.max_message_size or shortest <= 0:
            raise InvalidMessageError(
                f"a body of {longest} bytes is over max_message_size="
                f"{self.config.max_message_size} (or empty)"
            )

    def _to_copies(self, batch: codec.EncodedBatch) -> codec.EncodedBatch:
        """The batch to store for one whose delayed messages must go to the schedule
        topic and whose transactional ones to the half topic (``storage.transaction``),
        the others as they came: built from the records' bytes when only transactional
        ones need copies (``transaction.half_copies``, the same bytes), else re-encoded."""
        if batch.transactional:
            fast = transaction.half_copies(batch, self.txn_fences)
            if fast is not None:
                return fast
        return self._reencoded_copies(batch)

    def _reencoded_copies(self, batch: codec.EncodedBatch) -> codec.EncodedBatch:
        """:meth:`_to_copies` by decoding each record and encoding its copy (the general
        path, and the reference the byte-level one must match)."""
        top = len(self.config.delay_levels_ms)
        originals = codec.decode_records(batch.data, check_crc=False)
        levels = [0] * len(originals) if batch.delay_levels is None else batch.delay_levels.tolist()
        now_ms = self.now_ms()
        messages: list[Message] = []
        halves: list[int] = []
        # a record's QUEUEID is written from ``queue_ids`` at the put (``with_queue``)
        for i, (m, level, qid) in enumerate(zip(originals, levels, batch.queue_ids.tolist())):
            if transaction.is_transactional(m):  # a delay does not apply to it
                self.txn_fences.check(m)  # raises before anything is written
                messages.append(transaction.to_half(m, qid))
                halves.append(i)
            elif level:
                messages.append(to_schedule(m, min(level, top), qid))
            elif batch.timer and (at := timer.for_put(m, qid, now_ms, self.config)) is not None:
                messages.append(at)  # the timer topic's copy, or its own topic if due
            else:
                messages.append(dataclasses.replace(as_message(m), queue_id=qid))
        out = codec.encode_batch(
            messages, max_message_size=self.config.max_message_size, born=born_of(originals)
        )
        if halves:
            out = transaction.with_transaction_type(
                out, halves, transaction.TRANSACTION_PREPARED_TYPE
            )
        return out

    def _put_encoded(self, batch: codec.EncodedBatch) -> PutBatchResult:
        return self._durable(*self._write(batch))

    def put_one_send(self, one: codec.OneSend) -> tuple[int, int] | None:
        """The put of a single send read as :class:`~storage.batch.OneSend` (a broker's
        usual request on an ASYNC_FLUSH store), in plain values: the record's queue
        offset and CommitLog offset. The same checks, bytes, entries, index keys and
        producer numbering as :meth:`put_encoded` of its batch, with no batch, arrays or
        result object. None, with nothing written, for what it leaves to
        :meth:`put_encoded`: a SYNC_FLUSH store, a reserved topic, a numbering that is
        not simply the queue's next, a record the last files have no room for."""
        topic = one.topic
        if self.config.sync_flush or topic in _ONE_SEND_ELSEWHERE or record._native is None:
            return None
        self._check_open()
        if one.body_len > self.config.max_message_size or one.body_len <= 0:
            raise InvalidMessageError(
                f"a body of {one.body_len} bytes is over max_message_size="
                f"{self.config.max_message_size} (or empty)"
            )
        self._refuse_if_disk_full()
        pid, queue_id = one.producer_id, one.queue_id
        with self._put_lock:
            self._check_open()
            if pid is not None and not self.producers.is_next(
                pid, one.producer_epoch, topic, queue_id, one.seq
            ):
                return None  # a retry, a new epoch, a gap: the batch's check decides
            data = one.data
            size = len(data)
            store_ts = int(self._clock() * 1000)
            cq = self._cq(topic, queue_id)
            written = self._write_one(
                cq, data, size, queue_id, one.tag_code, store_ts, one.key_hashes
            )
            if written is None:
                return None
            base, phys = written
            self._dispatched = phys + size
            if pid is not None:
                self.producers.record(
                    pid, one.producer_epoch, topic, queue_id, one.seq, 1, base, phys, store_ts
                )
        self._notify([(topic, queue_id, base + 1)])
        return base, phys

    def _durable(self, result: PutBatchResult, end: int) -> PutBatchResult:
        """``result`` once the CommitLog is durable up to ``end`` (0: at once), or marked
        ``FLUSH_DISK_TIMEOUT`` when SYNC_FLUSH's flush did not come in time."""
        if end and not self.wait_durable(end):
            result.status = PutStatus.FLUSH_DISK_TIMEOUT
        return result

    def _write(self, batch: codec.EncodedBatch) -> tuple[PutBatchResult, int]:
        """Append and dispatch ``batch``: its result, and (SYNC_FLUSH) the CommitLog end
        a caller waits for before the batch is durable (0: nothing to wait for)."""
        self._refuse_if_disk_full()
        end = 0
        notes: list[tuple[str, int, int]] = []
        with self._put_lock:
            self._check_open()
            if batch.producer_id is None:
                queue_offsets, phys, notes, end = self._append(batch)
            else:
                queue_offsets, phys, notes, end = self._append_idempotent(batch)
        self._notify(notes)
        result = PutBatchResult(
            PutStatus.PUT_OK,
            batch.topics,
            batch.topic_idx,
            batch.queue_ids,
            queue_offsets,
            phys,
            batch.uniq_keys,
            self.config.store_host,
        )
        return result, end if self.config.sync_flush else 0

    def _append_idempotent(
        self, batch: codec.EncodedBatch
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[str, int, int]], int]:
        """An idempotent producer's batch (put lock held): the runs stored before are
        answered with the offsets they were stored at and not written again; the others
        are written and remembered (``storage.producer_state``)."""
        runs = batch.runs()
        decided = self.producers.check(batch, runs)  # raises before anything is written
        if len(runs) == 1 and decided[0] is None and not _needs_copies(batch):
            # the usual batch: one new run, nothing delayed or transactional
            written = self._append(batch)
            now = int(self._clock() * 1000)
            if len(batch) == 1:  # a single send: plain ints to the producer table
                pid, (topic, queue_id, _) = batch.producer_id, written[2][0]
                assert pid is not None
                base, at = int(written[0][0]), int(written[1][0])
                seq = runs[0][2]
                self.producers.record(
                    pid, batch.producer_epoch, topic, queue_id, seq, 1, base, at, now
                )
                return written
            self.producers.record_batch(batch, runs, decided, written[0], written[1], now)
            return written
        fresh = [(a, c) for (a, c, _), hit in zip(runs, decided) if hit is None]
        n = len(batch)
        queue_offsets = np.empty(n, dtype=np.int64)
        phys = np.empty(n, dtype=np.int64)
        notes: list[tuple[str, int, int]] = []
        end = 0
        if fresh:
            part = batch if len(fresh) == len(runs) else batch.select(fresh)
            if _needs_copies(part):
                assert part.producer_id is not None
                part = self._to_copies(part).with_runs(
                    part.producer_id, part.producer_epoch, part.runs()
                )
            part_qoffs, part_phys, notes, end = self._append(part)
            if part is batch:  # every run new (a merged call's usual case): as written
                now = int(self._clock() * 1000)
                self.producers.record_batch(batch, runs, decided, part_qoffs, part_phys, now)
                return part_qoffs, part_phys, notes, end
        k = 0
        for (a, c, _), hit in zip(runs, decided):
            if hit is None:
                queue_offsets[a : a + c] = part_qoffs[k : k + c]
                phys[a : a + c] = part_phys[k : k + c]
                k += c
            elif hit == producer_state.STORED_LONG_AGO:  # stored, where no longer known
                queue_offsets[a : a + c] = phys[a : a + c] = -1
            else:  # stored before: where it went, and durable before it is answered
                queue_offsets[a : a + c] = hit[0] + np.arange(c, dtype=np.int64)
                phys[a : a + c], stop = self._records_from(hit[1], c)
                end = max(end, stop)
        if fresh:
            now = int(self._clock() * 1000)
            self.producers.record_batch(batch, runs, decided, queue_offsets, phys, now)
        return queue_offsets, phys, notes, end

    def _records_from(self, offset: int, count: int) -> tuple[list[int], int]:
        """The CommitLog offsets of ``count`` records stored back to back from ``offset``,
        and where the last one ends (they may differ in size from what was sent: a
        delayed message is stored as its schedule copy, a transactional one as its half
        copy)."""
        out = []
        size = _RECORD_SIZE.unpack_from
        for _ in range(count):
            mf = self.commitlog.files.find(offset)
            if mf is None:
                raise StoreCorruptedError(f"no commitlog file holds offset {offset}")
            out.append(offset)
            # unpack in place: a slice of the mmap would copy the file to its end
            offset += size(mf.buffer, offset - mf.from_offset)[0]
        return out, offset

    def _append(
        self, batch: codec.EncodedBatch
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[str, int, int]], int]:
        """Write ``batch`` (put lock held): its queue offsets, CommitLog offsets, the
        queues fed (for :meth:`_notify`) and the CommitLog's new end."""
        if len(batch) == 1 and len(batch.topics) == 1 and batch.topics[0] != SCHEDULE_TOPIC:
            return self._append_one(batch)
        return self._append_many(batch)

    def _append_many(
        self, batch: codec.EncodedBatch
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[str, int, int]], int]:
        """:meth:`_append` of any batch, as arrays."""
        n = len(batch)
        uniform = batch.uniform
        tag_codes = batch.tag_codes
        sched_idx = batch.topics.index(SCHEDULE_TOPIC) if SCHEDULE_TOPIC in batch.topics else -1
        store_ts = int(self._clock() * 1000)
        if sched_idx >= 0 and batch.delay_levels is not None:
            # a schedule entry's tag field is its delivery time
            sched = batch.topic_idx == sched_idx
            delays = np.asarray(self.config.delay_levels_ms, dtype=np.int64)
            tag_codes = tag_codes.copy()
            tag_codes[sched] = store_ts + delays[batch.delay_levels[sched] - 1]
        groups: list[tuple[tuple[str, int], np.ndarray | None]]
        if uniform:
            groups = [((batch.topics[0], int(batch.queue_ids[0])), None)]
        else:
            keys = batch.topic_idx.astype(np.int64) << 32 | batch.queue_ids.astype(np.int64)
            uniq, inverse = np.unique(keys, return_inverse=True)
            groups = [
                (
                    (batch.topics[int(k >> 32)], int(k & 0xFFFFFFFF)),
                    np.flatnonzero(inverse == g),
                )
                for g, k in enumerate(uniq.tolist())
            ]
        bases = [self._cq(topic, qid).max_offset for (topic, qid), _ in groups]
        if uniform:
            queue_offsets = np.arange(bases[0], bases[0] + n, dtype=np.int64)
        else:
            queue_offsets = np.empty(n, dtype=np.int64)
            for base, (_, members) in zip(bases, groups):
                assert members is not None  # set for every group of a mixed batch
                queue_offsets[members] = base + np.arange(len(members), dtype=np.int64)
        try:  # every file this put needs, then the bytes
            for base, ((topic, qid), members) in zip(bases, groups):
                self._cq(topic, qid).reserve(base, n if members is None else len(members))
            phys = self.commitlog.append(
                batch.data,
                batch.sizes,
                batch.queue_ids,
                queue_offsets,
                store_ts,
                self._store_host,
            )
        except DiskFullError as exc:
            self._no_room(exc)
            raise
        self._allocation_failed = False
        for base, ((topic, qid), members) in zip(bases, groups):
            if members is None:
                self._cq(topic, qid).append(base, phys, batch.sizes, tag_codes)
            else:
                self._cq(topic, qid).append(
                    base, phys[members], batch.sizes[members], tag_codes[members]
                )
        if self.config.message_index_enable and len(batch.key_hashes):
            # codec.index_key_hash for all: abs wraps MIN_VALUE to itself, the mask
            # then makes it 0 (two array calls, where a masked store took four)
            hashes = np.abs(batch.key_hashes) & 0x7FFFFFFF
            self.index.put(hashes, phys[batch.key_owner], store_ts)
        end = self._dispatched = self.commitlog.max_offset
        notes = [(topic, qid, self._cqs[(topic, qid)].max_offset) for (topic, qid), _ in groups]
        return queue_offsets, phys, notes, end

    def _append_one(
        self, batch: codec.EncodedBatch
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[str, int, int]], int]:
        """:meth:`_append` of a batch of one record (a single send), in plain ints: the
        same bytes, entries and index keys, at a third of the arrays' cost."""
        topic, queue_id, base, phys, _, top, end = self._append_one_at(batch)
        return (
            np.array([base], dtype=np.int64),
            np.array([phys], dtype=np.int64),
            [(topic, queue_id, top)],
            end,
        )

    def _append_one_at(self, batch: codec.EncodedBatch) -> tuple[str, int, int, int, int, int, int]:
        """:meth:`_append_one`'s write (put lock held): the record's topic, queue id,
        queue offset, CommitLog offset and store time, its queue's new max offset and
        the CommitLog's new end."""
        topic = batch.topics[0]
        (queue_id,) = batch.queue_ids.tolist()
        (tag,) = batch.tag_codes.tolist()
        (size,) = batch.sizes.tolist()
        data = batch.data if len(batch.data) == size else memoryview(batch.data)[:size]
        store_ts = int(self._clock() * 1000)
        cq = self._cq(topic, queue_id)
        if record._native is not None:
            # masked as _append's arrays mask them: abs(MIN_VALUE) is 2**31 here, which the
            # mask makes 0
            hashes = [abs(h) & 0x7FFFFFFF for h in batch.key_hashes.tolist()]
            written = self._write_one(cq, data, size, queue_id, tag, store_ts, hashes)
            if written is not None:
                base, phys = written
                end = self._dispatched = phys + size
                return topic, queue_id, base, phys, store_ts, base + 1, end
        try:  # every file this put needs, then the bytes
            base = cq.reserve_next()
            phys = self.commitlog.append_one(data, queue_id, base, store_ts, self._store_host)
        except DiskFullError as exc:
            self._no_room(exc)
            raise
        self._allocation_failed = False
        cq.append_one(base, phys, size, tag)
        if self.config.message_index_enable and len(batch.key_hashes):
            # as _append's arrays: abs(MIN_VALUE) is 2**31 here, which the mask makes 0
            hashes = [abs(h) & 0x7FFFFFFF for h in batch.key_hashes.tolist()]
            self.index.put_at(hashes, phys, store_ts)
        end = self._dispatched = phys + size
        return topic, queue_id, base, phys, store_ts, base + 1, end

    def _write_one(
        self,
        cq: ConsumeQueue,
        data: bytes | memoryview,
        size: int,
        queue_id: int,
        tag: int,
        store_ts: int,
        hashes: list[int],
    ) -> tuple[int, int] | None:
        """:meth:`_append_one_at`'s write in one C call (``storage._native.write_one``)
        when the last CommitLog file, the queue's last file and the last index file all
        have room for it and the record has a few keys at most: the same bytes, entries and
        links as the Python path, then the write positions moved. Returns the record's
        queue offset and CommitLog offset, or None (nothing written): the Python path's
        case, which allocates and rolls files. ``hashes``: its keys' IndexFile hashes,
        masked (``index_key_hash``)."""
        log_files = self.commitlog.files.files
        cq_files = cq.files.files
        if not log_files or not cq_files:
            return None
        tail, last = log_files[-1], cq_files[-1]
        rel, pos = tail.wrote_position, last.wrote_position
        if size > tail.file_size - rel - codec.END_FILE_MIN_BLANK or pos + UNIT > last.file_size:
            return None
        base = (last.from_offset + pos) // UNIT
        phys = tail.from_offset + rel
        native = record._native
        assert native is not None
        index_args: tuple[Any, ...] = (None, 0, 0, None, 0, 0, 0, 0, 0)
        f = None
        keys = len(hashes)
        if self.config.message_index_enable and keys:
            files = self.index.files
            if keys > _WRITE_ONE_KEYS or not files:
                return None
            f = files[-1]
            if f.index_count + keys > f.max_entries:  # the rest would go to a new file
                return None
            diff = f.time_diff(store_ts, phys)
            index_args = (
                f.file.buffer,
                f.slots,
                f.index_count,
                hashes,
                diff,
                f.begin_ts,
                f.begin_offset,
                max(f.end_offset, phys),
                f.slot_count,
            )
        fresh = native.write_one(
            tail.buffer,
            rel,
            data,
            queue_id,
            base,
            phys,
            store_ts,
            self._store_host,
            last.buffer,
            pos,
            tag,
            *index_args,
        )
        tail.wrote_position = rel + size  # published: readers see the record
        last.wrote_position = pos + UNIT
        if f is not None:  # what the header now says (IndexFile._added)
            f.slot_count += fresh
            f.index_count += keys
            f.end_ts = store_ts
            f.end_offset = index_args[7]
            f.dirty = True
        if tail.wrote_position * 2 > tail.file_size:  # as CommitLog.append_one
            self.commitlog.files.prepare_next()
        return base, phys

    # ------------------------------------------------------------ disk space
    def _no_room(self, exc: DiskFullError) -> None:
        """A put found no room for the files it needs: writes are refused until one
        finds some (logged once, when it starts)."""
        if not self._allocation_failed:
            log.error("store %s: refusing writes: %s", self.root, exc)
        self._allocation_failed = True

    def _refuse_if_disk_full(self) -> None:
        """Raise ``DiskFullError`` while the disk is used over
        ``disk_space_warning_level_ratio`` (RocketMQ's diskSpaceWarningLevelRatio)."""
        self._look_at_disk()
        if self._over_warning_level:
            limit = self.config.disk_space_warning_level_ratio
            raise DiskFullError(
                f"store {self.root}: disk_used_ratio={self._disk_ratio:.3f} is over "
                f"disk_space_warning_level_ratio={limit}: writes are refused until it is below"
            )

    def _look_at_disk(self, wait: bool = False) -> None:
        """Measure the disk's use: at most every 100 ms while writes are taken, at every
        call once they are not (so they resume at the first put after room is made).
        While writes are taken and the store's services run, the measure is the disk
        watch's (``DiskWatchService``), woken here: a put does not wait for it (``wait``:
        measured here all the same)."""
        now = self._clock()
        if not self.disk_full and abs(now - self._disk_checked) < _DISK_CHECK_S:
            return
        watch = self._disk_watch
        if watch is not None and not self.disk_full and not wait:
            self._disk_checked = now  # asked once per interval, not by every put till then
            watch.wakeup()
            return
        self.measure_disk()

    def watch_disk(self) -> None:
        """From now on, measure the disk's use on a thread of its own (``DiskWatchService``,
        stopped with the store): a put no longer waits for ``statvfs``. Started with the
        store's services; a broker's role, which starts them itself, starts it too."""
        if self._disk_watch is None:
            watch = DiskWatchService(self)
            self._services.append(watch)
            watch.start()
            self._disk_watch = watch

    def measure_disk(self) -> None:
        """Measure the disk's use now; writes are refused while it is over
        ``disk_space_warning_level_ratio``, taken again once it is below."""
        with self._disk_lock:
            self._disk_checked = self._clock()
            ratio = self._disk_ratio = self._disk_usage()
            self._disk_level(ratio)

    def _disk_level(self, ratio: float) -> None:
        limit = self.config.disk_space_warning_level_ratio
        over = ratio > limit
        if over != self._over_warning_level:
            self._over_warning_level = over
            if over:
                log.error(
                    "store %s: disk %.1f%% used, over disk_space_warning_level_ratio=%.2f: "
                    "refusing writes until it is below",
                    self.root,
                    100 * ratio,
                    limit,
                )
            else:
                log.warning(
                    "store %s: disk %.1f%% used, below disk_space_warning_level_ratio=%.2f: "
                    "taking writes again",
                    self.root,
                    100 * ratio,
                    limit,
                )

    @property
    def disk_full(self) -> bool:
        """Whether writes are refused for want of disk space (reads go on)."""
        return self._over_warning_level or self._allocation_failed

    def wait_durable(self, end: int) -> bool:
        """SYNC_FLUSH: wait for the group commit to flush up to ``end``, at most
        ``sync_flush_timeout_ms``; False when it did not (RocketMQ's FLUSH_DISK_TIMEOUT:
        the message is stored and will be flushed, but not yet)."""
        assert self._group_commit is not None
        timeout_ms = self.config.sync_flush_timeout_ms
        if self._group_commit.wait(end, timeout_ms / 1000):
            return True
        log.warning(
            "commitlog not flushed up to %d within sync_flush_timeout_ms=%d: FLUSH_DISK_TIMEOUT "
            "(stored; the flush goes on)",
            end,
            timeout_ms,
        )
        return False

    def _notify(self, notes: list[tuple[str, int, int]]) -> None:
        for listener in self._listeners:
            for topic, qid, max_offset in notes:
                try:
                    listener(topic, qid, max_offset)
                except Exception:
                    log.exception("dispatch listener failed")

    # ------------------------------------------------------------ replication
    @property
    def dispatched_offset(self) -> int:
        """CommitLog offset below which every record is in the ConsumeQueues."""
        return self._dispatched

    def read_commitlog(self, offset: int, max_bytes: int = 1 << 20) -> bytes:
        """Master side: raw CommitLog bytes from ``offset`` (within one file)."""
        return replica.read_chunk(self.commitlog, offset, max_bytes)

    def append_commitlog(
        self, offset: int, data: bytes | memoryview, *, dispatch: bool = True
    ) -> int:
        """Slave side: append master bytes at ``offset``; returns the new end offset.

        With ``dispatch=False`` the records get their ConsumeQueue and index entries
        only at the next :meth:`dispatch_replicated` (acknowledge first, index after).
        """
        with self._put_lock:
            self._check_open()
            joining = self.commitlog.files.last() is None and len(data) > 0
            end = replica.append_bytes(self.commitlog, offset, data)
            if joining:  # its first file starts at offset: nothing before it to dispatch
                self._dispatched = offset
        if self.config.sync_flush:
            self.commitlog.flush_until(end)
        if dispatch:
            self.dispatch_replicated()
        return end

    def dispatch_replicated(self) -> None:
        """Queue and index entries for every whole record appended but not yet dispatched."""
        with self._put_lock:
            self._check_open()
            self._dispatched, notes = replica.dispatch(
                self.commitlog, self._cqs, self.index, self.config, self._dispatched, self.producers
            )
        self._notify(notes)

    def truncate_commitlog(self, offset: int) -> None:
        """Drop the CommitLog past ``offset`` and every queue entry pointing there."""
        with self._put_lock:
            self._check_open()
            with self._checkpoint_lock:  # a checkpoint of offsets read before: not written
                self._truncations += 1
            replica.truncate(self.commitlog, self._cqs, self.config, offset)
            self.producers.truncate(offset)
            self._dispatched = min(self._dispatched, offset)

    # ------------------------------------------------------------ get
    def get_raw(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        tags: str | None = None,
        *,
        view: bool = False,
    ) -> RawGetResult:
        """Up to ``max_count`` records from ``offset`` as one blob (tag filter by hash).
        With ``view``, records that lie back to back in the CommitLog (a producer's batch
        for one queue) come as a memoryview of it, not a copy; it keeps the file mapped
        while held, so it is for an answer on its way out, not to keep."""
        self._check_open()
        codec.validate_topic(topic)
        codec.validate_queue_id(queue_id)
        if not isinstance(offset, int) or offset < 0:
            raise OffsetOutOfRangeError(f"offset={offset!r}: must be an int >= 0")
        if max_count <= 0:
            raise InvalidMessageError(f"max_count={max_count}: must be > 0")
        subscribed = parse_subscription(tags)
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return _Answers(0, 0).empty(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0)
        min_off, max_off = cq.min_offset, cq.max_offset
        answers = _Answers(min_off, max_off)
        if max_off == 0:
            return answers.empty(GetStatus.NO_MESSAGE_IN_QUEUE, 0)
        if offset < min_off:
            return answers.empty(GetStatus.OFFSET_TOO_SMALL, min_off)
        if offset == max_off:
            return answers.empty(GetStatus.OFFSET_OVERFLOW_ONE, offset)
        if offset > max_off:
            return answers.empty(
                GetStatus.OFFSET_OVERFLOW_BADLY, min_off if min_off == 0 else max_off
            )
        if subscribed is None and max_off - offset <= codec.SMALL_BATCH:
            few = self._get_few(cq, offset, max_count, view, answers)
            if few is not None:
                return few
        scan = max_count if subscribed is None else max(max_count, MAX_SCAN_ENTRIES)
        entries = cq.read(offset, scan)
        if not len(entries):
            return answers.empty(GetStatus.OFFSET_FOUND_NULL, offset)
        phys = entries["offset"].astype(np.int64)
        keep = (phys >= self.commitlog.min_offset) & (entries["size"] > 0)  # not holes
        if subscribed is not None:
            keep &= np.isin(entries["tag"], tag_codes(subscribed))
        picked = np.flatnonzero(keep)[:max_count]
        if len(picked) == max_count:
            next_offset = offset + int(picked[-1]) + 1
        else:
            next_offset = offset + len(entries)
        if not len(picked):
            return answers.empty(GetStatus.NO_MATCHED_MESSAGE, next_offset)
        sizes = entries["size"][picked]
        try:
            data = self.commitlog.read_runs(phys[picked], sizes, view=view)
        except (OffsetOutOfRangeError, ValueError):
            return answers.expired(cq)
        return answers.found(data, sizes, next_offset)

    def _get_few(
        self, cq: ConsumeQueue, offset: int, max_count: int, view: bool, answers: _Answers
    ) -> RawGetResult | None:
        """:meth:`get_raw` of the few newest records of a queue, with no tag filter (a
        held pull's answer), in plain ints: the same result, or None when they are not
        one run of live records in one file (the general path's case)."""
        entries = cq.read_few(offset, max_count)
        if not entries:
            return answers.empty(GetStatus.OFFSET_FOUND_NULL, offset)
        start = end = entries[0][0]
        if start < self.commitlog.min_offset:
            return None
        sizes = []
        for phys, size, _ in entries:
            if phys != end or size <= 0:  # a hole, or records apart: the general path
                return None
            sizes.append(size)
            end += size
        try:
            mf = self.commitlog.files.find(start)
            if mf is None or end - mf.from_offset > mf.file_size:
                return None
            data = (self.commitlog.view if view else self.commitlog.read)(start, end - start)
        except (OffsetOutOfRangeError, ValueError):
            return answers.expired(cq)
        return answers.found(data, sizes, offset + len(entries))

    def get(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        tags: str | None = None,
    ) -> GetResult:
        """Like :meth:`get_raw`, decoded, with tags matched exactly."""
        raw = self.get_raw(group, topic, queue_id, offset, max_count, tags)
        messages = (
            codec.decode_records(raw.data, check_crc=False, starts=raw.starts())
            if raw.count
            else []
        )
        subscribed = parse_subscription(tags)
        if subscribed is not None:
            messages = [m for m in messages if matches(subscribed, m.tags)]
        status = raw.status
        if status is GetStatus.FOUND and not messages:
            status = GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, messages, raw.next_offset, raw.min_offset, raw.max_offset)

    # ------------------------------------------------------------ offsets and lookups
    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cqs.get((topic, queue_id))
        return cq.min_offset if cq else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cqs.get((topic, queue_id))
        return cq.max_offset if cq else 0

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms``."""
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return 0
        lo, hi = cq.min_offset, cq.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            entry = cq.entry(mid)
            if entry is None or entry[0] < self.commitlog.min_offset or entry[1] == 0:
                lo = mid + 1
                continue
            if self.commitlog.store_timestamp_at(entry[0]) < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def message_at(self, commitlog_offset: int) -> MessageExt:
        """The record that starts at ``commitlog_offset``."""
        self._check_open()
        if not self.commitlog.min_offset <= commitlog_offset < self.commitlog.max_offset:
            raise OffsetOutOfRangeError(
                f"commitlog offset {commitlog_offset} outside "
                f"[{self.commitlog.min_offset}, {self.commitlog.max_offset})"
            )
        return self.commitlog.message_at(commitlog_offset)

    def message_by_id(self, msg_id: str, topic: str | None = None) -> MessageExt:
        """By offset message id (this store's host), or by unique key within ``topic``."""
        try:
            host, offset = codec.parse_offset_msg_id(msg_id)
        except InvalidMessageError:
            host, offset = "", -1
        if host == self.config.store_host:
            try:
                return self.message_at(offset)
            except (OffsetOutOfRangeError, StoreCorruptedError):
                if topic is None:
                    raise
        if topic is not None:
            for m in self.query_by_key(topic, msg_id, max_count=1):
                return m
        raise OffsetOutOfRangeError(f"no message with id {msg_id!r} in store {self.root}")

    def query_by_key(
        self,
        topic: str,
        key: str,
        max_count: int = 64,
        begin_ms: int = 0,
        end_ms: int | None = None,
    ) -> list[MessageExt]:
        """Messages of ``topic`` with ``key`` (or unique key ``key``) stored in the range."""
        self._check_open()
        codec.validate_topic(topic)
        end = end_ms if end_ms is not None else (1 << 62)
        h = codec.index_key_hash(codec.java_hash(f"{topic}#{key}"))
        out: list[MessageExt] = []
        for offset in self.index.query(h, max_count * 4 + 16, begin_ms, end):
            if not self.commitlog.min_offset <= offset < self.commitlog.max_offset:
                continue
            try:
                m = self.commitlog.message_at(offset)
            except (OffsetOutOfRangeError, StoreCorruptedError, ValueError):
                continue
            if m.topic == topic and (key in m.keys or m.properties.get(codec.PROP_UNIQ_KEY) == key):
                out.append(m)
                if len(out) >= max_count:
                    break
        return out

    # ------------------------------------------------------------ durability and upkeep
    def flush(self) -> None:
        """Flush the CommitLog, ConsumeQueues and index now, and record a checkpoint."""
        self.commitlog.flush()
        self.checkpoint_now()

    def checkpoint_now(self, least_pages: int = 0) -> None:
        """Flush the ConsumeQueues (those with at least ``least_pages`` dirty pages; 0:
        all) and the index, then record how far both are durable. One call at a time
        (the flush service's and an explicit :meth:`flush`), so checkpoints are written
        in the order their offsets were read and never move back but by a truncation."""
        with self._checkpoint_turn:
            self._checkpoint_once(least_pages)

    def _checkpoint_once(self, least_pages: int) -> None:
        with self._put_lock:
            if self._closed:
                return
            # a slave's records appended but not dispatched yet have no entries to flush
            logics = self._dispatched
            truncations = self._truncations
            cqs = list(self._cqs.values())
        for cq in cqs:
            pending = cq.flush(least_pages)
            if pending is not None:  # entries from there on may not survive a crash yet
                logics = min(logics, pending)
        self.index.flush()
        now = int(self._clock() * 1000)
        with self._put_lock:
            if self._closed or self._checkpoint is None:
                return
            flushed = self.commitlog.flushed_offset
            snapshot = None
            since = now - self._producer_snapshot_ms
            if self.producers.changed and since >= self.config.producer_snapshot_interval_ms:
                snapshot = self._producer_snapshot(self._dispatched)
        # the checkpoint's write and fdatasync outside the put lock, so no put waits for
        # a disk sync; under a lock of its own that close() takes for its last write,
        # which this one may precede but never follow. Nothing new durable since the
        # last write: no write (an idle broker synced a file every interval). Recovery
        # reads the offsets only; timestamps older than now are as good.
        with self._checkpoint_lock:
            cp = self._checkpoint
            if self._closed or cp is None or truncations != self._truncations:
                return  # closed, or the offsets read may lie past a truncation since
            last = cp.value
            if (last.physic_offset, last.logics_offset, last.clean_end) != (flushed, logics, -1):
                cp.write(Checkpoint(now, now, now, flushed, logics, -1))
        if snapshot is not None:  # written outside the put lock: puts go on meanwhile
            self._write_producers(snapshot)

    def _real_disk_usage(self) -> float:
        return disk_used_ratio(self.root)

    def clean_expired_files(self) -> int:
        """One expiry pass; return how many CommitLog files were deleted.

        At a ``delete_when`` hour, files untouched for ``file_reserved_hours`` go; while
        the disk is used over ``disk_max_used_ratio`` they go at any hour, and over
        ``disk_clean_forcibly_ratio`` the oldest go at once whatever their age (RocketMQ's
        CleanCommitLogService). The file being written is never deleted.
        """
        now = self._clock()
        hour = time.localtime(now).tm_hour
        at_delete_hour = hour in {int(h) for h in self.config.delete_when.split(";")}
        reserved_s = self.config.file_reserved_hours * 3600
        deleted = 0
        while deleted < self.config.delete_files_batch_max:
            files = self.commitlog.files.files
            if len(files) <= 1:
                break
            oldest = files[0]
            ratio = self._disk_usage()
            pressure = ratio > self.config.disk_max_used_ratio
            forcibly = ratio > min(
                self.config.disk_clean_forcibly_ratio, self.config.disk_space_warning_level_ratio
            )
            old_enough = now - oldest.mtime() >= reserved_s
            if not (forcibly or (old_enough and (at_delete_hour or pressure))):
                break
            with self._put_lock:
                if self._closed:
                    break
                self.commitlog.files.delete_first(1)
            log.info(
                "deleted commitlog file %s (%s)",
                oldest.path.name,
                "disk %.0f%% used, over disk_clean_forcibly_ratio" % (100 * ratio)
                if forcibly and not old_enough
                else "expired",
            )
            deleted += 1
        if deleted:
            min_offset = self.commitlog.min_offset
            with self._put_lock:
                self._cqs.delete_expired(min_offset)
                self.index.delete_expired(min_offset)
        return deleted

    def config_file(self, name: str) -> JsonConfigFile:
        """``config/<name>.json`` (topics, consumerOffset, subscriptionGroup, delayOffset)."""
        if not name or not all(c.isalnum() or c in "_-" for c in name):
            raise InvalidMessageError(f"config name={name!r}: letters, digits, _ and - only")
        return JsonConfigFile(self.root / "config" / f"{name}.json")

    @property
    def store_host(self) -> str:
        return self.config.store_host

    def stats(self) -> dict[str, int | float | bool]:
        """What a broker shows of its store: CommitLog offsets, flushes since open, and
        its disk (``disk_full``: writes refused for want of space)."""
        cl = self.commitlog
        self._look_at_disk(wait=True)  # not on a message's path: the figure of now
        return {
            "commitlog_min_offset": cl.min_offset,
            "commitlog_max_offset": cl.max_offset,
            "commitlog_flushed_offset": cl.flushed_offset,
            "commitlog_flushes": cl.flush_count,
            "dispatched_offset": self._dispatched,
            "queues": len(self._cqs),
            "disk_used_ratio": round(self._disk_ratio, 4),
            "disk_full": self.disk_full,
        }

    def now_ms(self) -> int:
        """The store's clock (``clock`` given at open) in milliseconds."""
        return int(self._clock() * 1000)
