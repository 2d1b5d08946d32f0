"""Idempotent producers: which sequence numbers each producer has stored on each queue.

Kafka's idempotent producer, on RocketMQ's CommitLog. A producer gets an id from a
broker (``actors.broker``) and numbers what it sends to each queue ``0, 1, 2, ...``
within an epoch; every batch carries ``(producer id, epoch)`` and, per run of records
bound for one queue, the run's first sequence (``EncodedBatch.seq_runs``). Under the
store's put lock, before anything is written, :meth:`ProducerStateTable.check`
decides for each run:

* its first sequence is the queue's next one: written;
* it is one of the last ``keep_runs`` runs stored (same first sequence, same count):
  not written again, answered with the offsets it was stored at;
* it lies below the next sequence otherwise: :class:`DuplicateSequenceError`
  (stored before, too long ago to answer with its offsets);
* it skips sequences: :class:`OutOfOrderSequenceError` (one sent before it is
  missing; the producer resends it after that one);
* an older epoch than one stored: :class:`ProducerFencedError`; a newer epoch
  starts again at sequence 0.

A producer's first run on a queue the table does not know starts at sequence 0,
as each epoch's does: a run that overtook it on the way (a retry, a fallback from
one path to another) is refused as out of order until it has arrived, never taken
as the start, which would make the first run look stored before. A producer
forgotten after ``expire_ms`` of silence is refused the same way and begins a new
epoch (``actors.client.idempotence``).

What survives a crash: the first record of every run carries ``PRODUCER_SEQ =
"id,epoch,first sequence,count"`` in its properties, so the table is rebuilt
from the CommitLog itself: from a snapshot (:meth:`snapshot`, written with the
store's checkpoints, naming the CommitLog offset it covers) plus the records
after it (:func:`replay`). Slaves and Raft followers apply the same records as
they dispatch what they copied (``storage.replica``), so a promoted slave
recognises a retry of what its old master stored.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import codec
from .commitlog import CommitLog
from .errors import DuplicateSequenceError, OutOfOrderSequenceError, ProducerFencedError

log = logging.getLogger("raymq.storage.producer_state")

KEEP_RUNS = 5
"""Runs remembered per producer and queue (Kafka keeps 5 batches)."""

_PSEQ = (codec.PROP_PRODUCER_SEQ + codec.NAME_VALUE_SEP).encode("ascii")
# size, magic, queue id, queue offset, physical offset, store timestamp, body length
_HEAD = struct.Struct(">iI4xi4xqq20xq20xi")
_SIZE_MAGIC = struct.Struct(">iI")
_BODY_LEN = struct.Struct(">i")  # the header's last field

STORED_LONG_AGO = (-1, -1)
"""What :meth:`ProducerStateTable.check` says of a run of a merged call that was stored
too long ago to know where: answered with offsets -1, as a ``DuplicateSequenceError``
is for a call of one run."""

Run = tuple[int, int, int, int]
"""A stored run: (first sequence, record count, first queue offset, first CommitLog offset)."""


@dataclass
class _QueueState:
    epoch: int
    next_seq: int
    last_ms: int
    runs: deque[Run] = field(default_factory=deque)


def _queues_of(
    batch: codec.EncodedBatch, runs: list[tuple[int, int, int]]
) -> tuple[list[str], list[int]]:
    """Each run's topic and queue id (gathered at once: a merged call has many runs)."""
    names = batch.topics
    if len(runs) == 1:  # the usual batch: two scalar reads, not two gathers (~8 us)
        first = runs[0][0]
        return [names[int(batch.topic_idx[first])]], [int(batch.queue_ids[first])]
    firsts = [first for first, _, _ in runs]
    return [names[i] for i in batch.topic_idx[firsts].tolist()], batch.queue_ids[firsts].tolist()


class ProducerStateTable:
    """Per (producer id, topic, queue id): epoch, next sequence and the last runs."""

    def __init__(self, keep_runs: int = KEEP_RUNS, expire_ms: int = 7 * 86_400_000) -> None:
        self.keep_runs = keep_runs
        self.expire_ms = expire_ms
        self._queues: dict[tuple[str, str, int], _QueueState] = {}
        self.changed = False  # since the last snapshot

    def __len__(self) -> int:
        return len(self._queues)

    def check(
        self, batch: codec.EncodedBatch, runs: list[tuple[int, int, int]]
    ) -> list[tuple[int, int] | None]:
        """For each of ``batch``'s ``runs``: ``None`` when it is to be written, or the
        (first queue offset, first CommitLog offset) it was stored at
        (:data:`STORED_LONG_AGO` when no longer known). Raises a
        ``ProducerSequenceError`` when a run may not be written; nothing changes."""
        pid, epoch = batch.producer_id, batch.producer_epoch
        assert pid is not None
        if len(runs) == 1:  # the usual batch: one run, the next of its queue's
            first, _, seq = runs[0]
            topic = batch.topics[int(batch.topic_idx[first])]
            st = self._queues.get((pid, topic, int(batch.queue_ids[first])))
            if st is not None and st.epoch == epoch and st.next_seq == seq:
                return [None]
        out: list[tuple[int, int] | None] = []
        ahead: dict[tuple[str, str, int], tuple[int, int]] = {}  # earlier runs of this batch
        for (_, count, seq), topic, queue_id in zip(runs, *_queues_of(batch, runs)):
            key = (pid, topic, queue_id)
            st = self._queues.get(key)
            known = ahead.get(key) or ((st.epoch, st.next_seq) if st is not None else None)
            if known is None and seq != 0:
                raise OutOfOrderSequenceError(
                    f"producer {pid} epoch {epoch} on {topic}:{key[2]}: its first run here "
                    f"starts at sequence 0, not {seq}"
                )
            if known is not None and known != (epoch, seq):  # not simply the next run
                where = f"producer {pid} epoch {epoch} on {topic}:{key[2]}"
                known_epoch, next_seq = known
                if epoch < known_epoch:
                    raise ProducerFencedError(f"{where}: fenced by epoch {known_epoch}")
                if epoch > known_epoch:
                    if seq != 0:
                        raise OutOfOrderSequenceError(
                            f"{where}: a new epoch starts at sequence 0, not {seq}"
                        )
                elif seq < next_seq:
                    hit = self._stored(st, epoch, seq, count) if key not in ahead else None
                    if hit is None and len(runs) > 1 and key not in ahead:
                        # one run of a merged call: the others are still to be written
                        # (the call's error would reach every run, as if all were stored)
                        hit = STORED_LONG_AGO
                    if hit is None:
                        raise DuplicateSequenceError(
                            f"{where}: sequences {seq}..{seq + count - 1} were stored before "
                            f"(next is {next_seq}); not written again"
                        )
                    out.append(hit)
                    continue
                elif seq > next_seq:
                    raise OutOfOrderSequenceError(
                        f"{where}: sequence {seq} skips {next_seq}..{seq - 1}, not stored yet"
                    )
            ahead[key] = (epoch, seq + count)
            out.append(None)
        return out

    def is_next(self, pid: str, epoch: int, topic: str, queue_id: int, seq: int) -> bool:
        """Whether a run starting at ``seq`` is simply the next of its queue in ``epoch``
        (:meth:`check`'s usual case, asked with plain values by a single send)."""
        st = self._queues.get((pid, topic, queue_id))
        return st is not None and st.epoch == epoch and st.next_seq == seq

    @staticmethod
    def _stored(st: _QueueState | None, epoch: int, seq: int, count: int) -> tuple[int, int] | None:
        if st is None or st.epoch != epoch:
            return None
        for first, n, qoff, phys in st.runs:
            if first == seq and n == count:
                return qoff, phys
        return None

    def record(
        self,
        pid: str,
        epoch: int,
        topic: str,
        queue_id: int,
        seq: int,
        count: int,
        queue_offset: int,
        commitlog_offset: int,
        now_ms: int,
    ) -> None:
        """A run was stored (by a put, or found in the CommitLog by a replay)."""
        key = (pid, topic, queue_id)
        st = self._queues.get(key)
        if st is None or epoch > st.epoch:
            st = self._queues[key] = _QueueState(epoch, 0, now_ms)
        elif epoch < st.epoch:
            return  # a fenced epoch's record (replayed): nothing to remember
        st.next_seq = max(st.next_seq, seq + count)
        st.last_ms = max(st.last_ms, now_ms)
        st.runs.append((seq, count, queue_offset, commitlog_offset))
        while len(st.runs) > self.keep_runs:
            st.runs.popleft()
        self.changed = True

    def record_batch(
        self,
        batch: codec.EncodedBatch,
        runs: list[tuple[int, int, int]],
        decided: list[tuple[int, int] | None],
        queue_offsets: Any,
        commitlog_offsets: Any,
        now_ms: int,
    ) -> None:
        """The runs :meth:`check` let through were stored at these offsets."""
        assert batch.producer_id is not None
        if len(runs) == 1:  # the usual batch: scalar reads, not gathers
            first = runs[0][0]
            qoffs, phys = [int(queue_offsets[first])], [int(commitlog_offsets[first])]
        else:
            firsts = [first for first, _, _ in runs]
            qoffs = np.asarray(queue_offsets)[firsts].tolist()
            phys = np.asarray(commitlog_offsets)[firsts].tolist()
        topics, queue_ids = _queues_of(batch, runs)
        for i, ((_, count, seq), hit) in enumerate(zip(runs, decided)):
            if hit is None:
                self.record(
                    batch.producer_id,
                    batch.producer_epoch,
                    topics[i],
                    queue_ids[i],
                    seq,
                    count,
                    qoffs[i],
                    phys[i],
                    now_ms,
                )

    def apply_property(
        self, value: bytes, topic: str, queue_id: int, qoff: int, phys: int, store_ms: int
    ) -> None:
        """A record's ``PRODUCER_SEQ`` value, found by a replay or a slave's dispatch
        (a run of count 0 is an encoder's slot never bound: ``codec.seq_slot``)."""
        try:
            pid, epoch, seq, count = codec.parse_seq_value(value)  # as the broker checked it
            if count == 0:
                return
            self.record(pid, epoch, topic, queue_id, seq, count, qoff, phys, store_ms)
        except ValueError:
            log.error("record at %d: PRODUCER_SEQ=%r is not 'id,epoch,seq,count'", phys, value)

    def truncate(self, offset: int) -> None:
        """The CommitLog was cut back to ``offset``: forget runs stored past it."""
        for key, st in list(self._queues.items()):
            kept = [r for r in st.runs if r[3] < offset]
            if len(kept) == len(st.runs):
                continue
            self.changed = True
            if not kept:  # nothing known of this queue any more: it may start anywhere
                del self._queues[key]
                continue
            st.runs = deque(kept)
            st.next_seq = kept[-1][0] + kept[-1][1]

    def expire(self, now_ms: int) -> int:
        """Forget producers silent on a queue for over ``expire_ms``; how many went."""
        old = [k for k, st in self._queues.items() if now_ms - st.last_ms > self.expire_ms]
        for key in old:
            del self._queues[key]
        if old:
            self.changed = True
        return len(old)

    # ------------------------------------------------------------ persistence
    def snapshot(self, offset: int) -> dict[str, Any]:
        """The table as JSON-able data, covering the CommitLog up to ``offset``."""
        return {
            "offset": offset,
            "queues": [
                [pid, topic, qid, st.epoch, st.next_seq, st.last_ms, [list(r) for r in st.runs]]
                for (pid, topic, qid), st in self._queues.items()
            ],
        }

    def load(self, data: dict[str, Any]) -> int:
        """Take a :meth:`snapshot`'s content; return the offset it covers (0: none)."""
        self._queues.clear()
        for pid, topic, qid, epoch, next_seq, last_ms, runs in data.get("queues", []):
            self._queues[(pid, topic, int(qid))] = _QueueState(
                int(epoch), int(next_seq), int(last_ms), deque(tuple(r) for r in runs)
            )
        self.changed = False
        return int(data.get("offset", 0))


def pseq_value(props: bytes) -> bytes | None:
    """The ``PRODUCER_SEQ`` value in a record's raw properties, or None (the first pair
    of that name: a name that only ends with it, before it, is another property's)."""
    if _PSEQ not in props:  # most records
        return None
    pairs = codec.seq_pairs(props)
    return props[pairs[0][0] : pairs[0][1]] if pairs else None


def replay(table: ProducerStateTable, cl: CommitLog, start: int, end: int) -> int:
    """Apply the runs recorded in the CommitLog's records in ``[start, end)``; return how
    many were found. Reads only headers and properties (a few seconds of records)."""
    found = 0
    for topic, qid, qoff, phys, store_ms, value in _records_with_pseq(cl, start, end):
        table.apply_property(value, topic, qid, qoff, phys, store_ms)
        found += 1
    return found


def _records_with_pseq(
    cl: CommitLog, start: int, end: int
) -> Iterable[tuple[str, int, int, int, int, bytes]]:
    for buf, _, rel, _, t, props in records_with_properties(cl, max(start, cl.min_offset), end):
        value = pseq_value(props)
        if value is not None:
            _, _, qid, qoff, phys, store_ms, _ = _HEAD.unpack_from(buf, rel)
            topic = bytes(buf[t + 1 : t + 1 + buf[t]]).decode("utf-8", "replace")
            yield topic, qid, qoff, phys, store_ms, value


def records_with_properties(
    cl: CommitLog, start: int, end: int
) -> Iterable[tuple[Any, int, int, int, int, bytes]]:
    """``(buffer, file base, offset in the buffer, size, topic offset, properties)`` of
    each record in ``[start, end)`` that has properties, read from the mapped files
    (headers and properties only); a blank marker ends a file."""
    pos = start
    while pos < end:
        mf = cl.files.find(pos)
        if mf is None:
            return
        buf, base = mf.buffer, mf.from_offset
        rel = pos - base
        stop = min(end - base, mf.file_size)
        while rel + 8 <= stop:
            size, magic = _SIZE_MAGIC.unpack_from(buf, rel)
            if magic != codec.MAGIC or size < codec.FIXED_LEN or rel + size > stop:
                rel = mf.file_size  # a blank marker (or the end): the next file
                break
            body_len = _BODY_LEN.unpack_from(buf, rel + codec.HEADER.size - _BODY_LEN.size)[0]
            t = rel + codec.HEADER.size + body_len
            p = t + 1 + buf[t]
            plen = (buf[p] << 8) | buf[p + 1]
            if plen:
                yield buf, base, rel, size, t, bytes(buf[p + 2 : p + 2 + plen])
            rel += size
        pos = base + max(rel, stop) if rel < mf.file_size else base + mf.file_size
