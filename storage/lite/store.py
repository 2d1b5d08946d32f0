"""LiteStore: lite topics (RocketMQ 5's LiteTopic) on top of a :class:`MessageStore`.

A lite message is an ordinary record of the CommitLog: its topic is the parent topic
(of type LITE) and its ``__LITE_TOPIC`` property names the lite topic. What makes a
million lite topics cheap is what is *not* made per lite topic: no ConsumeQueue file,
no directory. Instead:

* one append-only lite index (:mod:`storage.lite.index`): a 56-byte entry per lite
  message, in CommitLog order, chained backwards per lite topic;
* an in-memory table (:mod:`storage.lite.table`) from lite topic id to its last entry,
  count and last write time, and a dict from (parent, name) to id;
* the ``names`` file (:mod:`storage.lite.names`) that binds names to ids.

Every write goes CommitLog first, then names, then index, all under one lock, so a lite
topic's index order is its CommitLog order. At open the table is rebuilt from the names
file and one vectorised pass over the index files; index entries whose records the
CommitLog lost are dropped, and lite records the index lacks (a crash between the two
writes, a power cut before the index reached the disk, records a slave received by
replication) are indexed from the CommitLog from the index's end on.

Two cursors, then. The index's end says which lite records are indexed: it is in the
index files themselves, which a killed process keeps whole (their pages are the page
cache's), flushed or not. The ``checkpoint`` file says which consumer state records
(:mod:`storage.lite.state`, a Raft group's) are applied *and saved*: every state
record below it is in ``offsets.npz`` and ``names``, which a flush writes before it.
In a Raft group every record, lite or state, is indexed or applied by
:meth:`LiteStore.catch_up` in CommitLog order (a leader's sends too: proposed, then
settled by a catch-up), so the index never passes a state record not applied; a store
outside a Raft group holds no state record (a producer's put to the state topic is
refused), so there the checkpoint follows the index. At open the state records from
the checkpoint on are applied again (the lite records among them already indexed are
skipped), then both go on together from the higher of the two.

A state record applied again must not hit a lite topic it did not mean: after the
checkpoint, ``names`` may already hold a delete and a new topic of the same name (a
send or a subscription created it again). So each lite topic keeps where it was
created: the CommitLog offset of the record that created it (its first lite message,
or the subscription), the same on every member of the group, recorded with its binding
in ``names`` (:mod:`storage.lite.names`). A ``commit`` or ``delete`` record applies to
the live topic of its name only if that topic was created before the record: one
created after it is a later incarnation, which the record never saw. A ``subscribe``
record creates a name that is not live unless ``names`` says a topic of that name was
deleted or expired after the record (it existed then and was gone since: it stays
gone); an expiry is placed at its ``expire`` record, or (a store outside a Raft group)
at the CommitLog offset its store had applied then. Names
bound by files written before positions were kept count as created before any record.

Expiry (:meth:`LiteStore.expire`): a lite topic with no write for its parent's TTL is
deleted, in slices that each hold the lock for ``expire_slice_ms`` (2 ms) at most,
so writes go on between slices. Its index entries stay where they are
and leave with the index files once the CommitLog's expiry took their records. In a
Raft group no member expires on its own clock: the leader finds what is due
(:meth:`LiteStore.due_for_expiry`) and proposes ``expire`` state records, which every
member applies at the same point of the log, deleting the named topics that had no
write at or after the point the leader looked from; a topic written in between stays.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sortedcontainers import SortedList

from .. import _fast_encode, codec, properties, transaction
from ..batch import PackedKeys, default_generator, host_to_bytes
from ..errors import InvalidConfigError, InvalidMessageError, StoreClosedError
from ..message import GetResult, GetStatus, Message, RawGetResult
from ..producer_state import records_with_properties
from ..store import MessageStore
from .errors import LiteTopicQuotaExceededError, NotALiteParentError
from .index import ENTRY, LiteIndex
from .names import BIND, DELETE, NOWHERE, PARENT, NameLog, encode, validate_lite_name
from .offsets import LiteOffsets
from .state import PROP_LITE_STATE, STATE_TOPIC, decode_state
from .table import LiteTable

log = logging.getLogger("raymq.storage.lite")

PROP_LITE_TOPIC = "__LITE_TOPIC"
"""The property that names a record's lite topic (RocketMQ's PROPERTY_LITE_TOPIC)."""

_LITE_PROP = (PROP_LITE_TOPIC + codec.NAME_VALUE_SEP).encode("ascii")
_STATE_PROP = (PROP_LITE_STATE + codec.NAME_VALUE_SEP).encode("ascii")
_HEAD = struct.Struct(">iI20xq20xq20xi")  # size, magic, phys, store time, body length
_BORN_LOCAL = host_to_bytes("127.0.0.1:0")  # the born host encode_batch gives by default
_OWN_WAY = properties.SYSTEM_PROPS | {
    properties.PROP_TRAN_MSG,
    properties.PROP_TIMER_DELIVER_MS,
    properties.PROP_TIMER_DELAY_SEC,
}
"""Properties the general loop writes its own way: a message carrying one is encoded
by it."""
_EXPIRE_PAUSE_S = 0.001  # between two slices of an expiry: a waiting writer's turn
_EXPIRE_STEP = 128  # lite topics an expiry slice deletes between two looks at the clock
_DELETE_REC = np.dtype(
    [
        ("kind", "u1"),
        ("lid", ">u4"),
        ("gen", ">u4"),
        ("pid", ">u4"),
        ("len", ">u2"),
        ("at", ">i8"),
    ]
)
"""A ``names`` file's ``d`` record (:data:`storage.lite.names.REC`, no name, where)."""


@dataclass(frozen=True)
class LiteConfig:
    """How the lite store keeps its files and defaults for parents.

    ``index_file_entries``: entries per lite index file (56 bytes each; the default,
    1 Mi entries, makes 56 MiB files). ``default_quota`` and ``default_ttl_ms``: a
    parent's quota of lite topics and time to live after the last write, unless
    :meth:`LiteStore.declare_parent` says otherwise. ``expire_slice_ms`` and
    ``expire_slice``: an expiry holds the lock for about that long, and deletes at
    most that many lite topics per hold. ``flush_interval_ms`` and ``expire_interval_ms``:
    how often the upkeep thread (:meth:`LiteStore.start`) flushes and expires.
    """

    index_file_entries: int = 1 << 20
    default_quota: int = 1_000_000
    default_ttl_ms: int = 24 * 3600 * 1000
    expire_slice: int = 65536
    expire_slice_ms: float = 2.0
    flush_interval_ms: int = 500
    expire_interval_ms: int = 10_000

    def __post_init__(self) -> None:
        for name in (
            "index_file_entries",
            "default_quota",
            "default_ttl_ms",
            "expire_slice",
            "flush_interval_ms",
            "expire_interval_ms",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise InvalidConfigError(f"{name}={value!r}: must be an int > 0")
        ms = self.expire_slice_ms
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 < ms <= 1000:
            raise InvalidConfigError(f"expire_slice_ms={ms!r}: a number of ms in (0, 1000]")


@dataclass
class _Parent:
    pid: int
    name: str
    quota: int
    ttl_ms: int
    count: int = 0  # live lite topics
    reserved: int = 0  # new lite topics named by proposals not yet indexed
    # The live names kept sorted once a page of them was asked for (None before: a
    # parent never listed pays nothing on its writes).
    sorted_names: SortedList | None = None


@dataclass(slots=True)
class LitePutResult:
    """Where a batch's messages went: per message its lite offset and CommitLog offset,
    and the message ids (arrays in the batch's order)."""

    lite_offsets: np.ndarray
    commitlog_offsets: np.ndarray
    msg_ids: list[str]
    flushed: bool = True  # False: SYNC_FLUSH timed out (stored, not yet durable)


@dataclass
class LiteProposal:
    """A lite batch checked and encoded for a group's log (:meth:`LiteStore.prepare`):
    written to the CommitLog by the group's leader and indexed once committed. It holds
    a place in its parent's quota for each new lite topic it names until
    :meth:`LiteStore.settle` or :meth:`LiteStore.release`."""

    parent: str
    batch: codec.EncodedBatch
    lites: list[str]
    reserved: list[str]  # keys of the new lite topics it counts in the quota
    released: bool = False


class LiteStore:
    """The lite topics of one :class:`MessageStore` (``<store>/lite``).

    The caller closes the LiteStore before the MessageStore. All lite writes go through
    it (or arrive by replication, then :meth:`catch_up` indexes them).
    """

    def __init__(
        self,
        store: MessageStore,
        config: LiteConfig | None = None,
        committed: Callable[[], int] | None = None,
    ) -> None:
        """``committed``: in a replicated group whose log may cut off an uncommitted
        tail (Raft), the CommitLog offset below which every record is committed; only
        records below it are indexed (:meth:`catch_up`), so a lite read sees only
        committed messages. None: every record dispatched is indexed."""
        self.store = store
        self.config = config or LiteConfig()
        self._committed_end = committed
        self.state_listener: Callable[[dict[str, Any]], None] | None = None
        """Called (the store's lock held, in CommitLog order) with each consumer state
        change :meth:`catch_up` applies (:mod:`storage.lite.state`)."""
        self.state_at = 0
        """Where the state record whose change the listener is given ends (its CommitLog
        offset plus size): a listener that saved its state tells a change it holds."""
        self.expired_listener: Callable[[str, list[str]], None] | None = None
        """Called (the store's lock held) with a parent and the names of its lite topics
        each slice of :meth:`expire` deleted (a Raft group's expiry is a state change
        instead, given to :attr:`state_listener`)."""
        self._reserved: dict[str, int] = {}  # key -> proposals naming it, not yet bound
        self.root = Path(store.root) / "lite"
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one flush at a time: its files written in order
        self._closed = False
        self._upkeep: threading.Thread | None = None
        self._following: Callable[[], bool] | None = None
        self.last_expiry: dict[str, float] = {}
        """The last :meth:`expire`'s figures: topics expired, slices, the longest hold of
        the lock (wall clock, and this thread's CPU time)."""
        self._flushed_state: tuple[int, int, int] | None = None
        self._deletes_written = 0  # ``d`` writes to ``names``, and those fsynced since
        self._deletes_synced = 0
        self._stop = threading.Event()
        self._parents: dict[str, _Parent] = {}
        self._parents_by_id: list[_Parent | None] = []
        self._ids: dict[str, int] = {}  # f"{pid}\x01{name}" -> lite id
        self._names: list[str | None] = []  # lite id -> name
        self._free: list[int] = []
        self.table = LiteTable()
        self._names_log = NameLog(self.root / "names")
        self.index = LiteIndex(self.root / "index", self.config.index_file_entries)
        self.offsets = LiteOffsets(self.root / "offsets.npz")
        started = time.monotonic()
        covered, saved = self._read_checkpoint()
        self._deaths: dict[str, int] | None = {}
        """While ``names`` may be ahead of the records applied (at open): per name, where
        its last topic was deleted or expired, if after the checkpoint; then None."""
        self._names_at = NOWHERE  # the last position ``names`` records
        self._load_names(NOWHERE if saved is None else saved)
        cut = self._cut_lost_tail()
        rebound = self._bind_lost()
        self._rebuild_from_index()
        indexed = self._index_covered()
        if saved is None:  # none, or written before the state cursor was kept: as then
            saved = max(covered, indexed) if covered else 0
        # records the CommitLog lost past it (a power cut) are applied when they come again
        saved = min(saved, max(indexed, self.store.commitlog.max_offset))
        self._covered = saved
        """Where the records applied end: every lite record below it indexed and every
        state record applied (in memory; saved up to the checkpoint)."""
        self._indexed_below = indexed
        """The lite records below it are indexed (the index's end at open)."""
        with self._lock:
            replayed = self._catch_up(max(self._catch_up_end(), indexed))
        self.recovered = {
            "dropped": cut,
            "rebound": rebound,
            "indexed_from_commitlog": replayed,
        }
        """What the open repaired: index entries past the CommitLog's end dropped, lite
        topics bound again from their index entries (``names`` lost their binding), lite
        records indexed from the CommitLog."""
        self._compact_names()
        log.info(
            "lite store %s opened in %.2fs: %d lite topics, %d index entries (%d dropped "
            "past the commitlog's end, %d indexed from it)",
            self.root,
            time.monotonic() - started,
            len(self._ids),
            self.index.end - self.index.min_entry,
            cut,
            replayed,
        )

    # ------------------------------------------------------------ open
    def _load_names(self, saved: int) -> None:
        """The table and names from ``names``; the deaths after ``saved`` (the
        checkpoint) kept for the replay (:attr:`_deaths`)."""
        t = self.table
        deaths = self._deaths
        assert deaths is not None
        names_at = NOWHERE
        for kind, lid, gen, pid, name, at in self._names_log.read():
            if kind == PARENT:
                self._set_parent(pid, name, self.config.default_quota, self.config.default_ttl_ms)
                continue
            names_at = max(names_at, at)
            if kind == BIND:
                if lid >= t.size:
                    t.ensure(lid + 1)
                    self._names.extend([None] * (t.size - len(self._names)))
                if t.parent[lid] >= 0:  # bound again without a delete: drop the old
                    self._unbind(lid)
                t.gen[lid] = gen
                t.parent[lid] = pid
                t.last[lid] = -1
                t.next_off[lid] = 0
                t.born[lid] = at
                self._ids[f"{pid}\x01{name}"] = lid
                self._names[lid] = name
                parent = self._parents_by_id[pid]
                assert parent is not None
                parent.count += 1
            elif kind == DELETE:
                if lid >= t.size:
                    t.ensure(lid + 1)
                    self._names.extend([None] * (t.size - len(self._names)))
                if t.parent[lid] >= 0 and t.gen[lid] == gen:
                    if at > saved:
                        key = f"{int(t.parent[lid])}\x01{self._names[lid]}"
                        deaths[key] = max(deaths.get(key, NOWHERE), at)
                    self._unbind(lid)
                t.gen[lid] = max(int(t.gen[lid]), gen)
        self._free = np.flatnonzero(t.parent[: t.size] < 0).tolist()[::-1]
        self._names_at = names_at

    def _set_parent(self, pid: int, name: str, quota: int, ttl_ms: int) -> _Parent:
        parent = _Parent(pid, name, quota, ttl_ms)
        while len(self._parents_by_id) <= pid:
            self._parents_by_id.append(None)
        self._parents_by_id[pid] = parent
        self._parents[name] = parent
        return parent

    def _cut_lost_tail(self) -> int:
        """Drop index entries whose records are past the CommitLog's end."""
        end = self.store.commitlog.max_offset
        cut_at = self.index.end
        for start, rows in reversed(self.index.written()):
            over = np.flatnonzero(rows["phys"] + rows["size"] > end)
            if not len(over):
                break
            cut_at = start + int(over[0])
            if over[0] > 0:
                break
        dropped = self.index.end - cut_at
        if dropped:
            log.warning(
                "lite store %s: %d index entries point past the commitlog's end %d "
                "(lost in a crash): dropped",
                self.root,
                dropped,
                end,
            )
            self.index.truncate(cut_at)
        return dropped

    def _bind_lost(self) -> int:
        """Bind again the lite topics whose index entries outlived their ``b`` record;
        return how many (at open). A power loss cuts ``names`` back to its last fsync,
        while index pages the kernel wrote back on its own keep the entries of topics
        bound after it: an id the file does not know, or a generation past the one it
        knows. Left so, their acknowledged messages read under no name, and the id would
        be given again with that generation to a new topic, the old entries taken for
        its at the next open. Each such (id, generation) is bound again, in index order,
        to the parent and name its CommitLog record carries, so its entries, offsets and
        chains stand as written; a topic the file shows live at that id, or under that
        name, was deleted before it (its ``d`` lost too): deleted again. The records go
        to ``names``, so the next open reads them."""
        t = self.table
        found: dict[tuple[int, int], list[int]] = {}  # (id, gen) -> [first, last entry]
        for start, rows in self.index.written():
            lids = rows["lid"].astype(np.int64)
            gens = rows["gen"].astype(np.int64)
            lost = lids >= t.size
            known = np.flatnonzero(~lost)
            lost[known] = gens[known] > t.gen[lids[known]]
            for i in np.flatnonzero(lost).tolist():
                seen = found.setdefault((int(lids[i]), int(gens[i])), [start + i, 0])
                seen[1] = start + i
        for (lid, gen), (first, last) in sorted(found.items(), key=lambda kv: kv[1][0]):
            f, g = self.index.file_of(first), self.index.file_of(last)
            assert f is not None and g is not None
            born = int(f.phys[first - f.start])  # its first message's record
            phys, size = int(g.phys[last - g.start]), int(g.size[last - g.start])
            record = next(iter(_lite_records(self.store, phys, phys + size)), None)
            if lid >= t.size:
                t.ensure(lid + 1)
                self._names.extend([None] * (t.size - len(self._names)))
            if t.parent[lid] >= 0:  # an earlier topic at this id: deleted before
                earlier = self._parents_by_id[int(t.parent[lid])]
                assert earlier is not None
                self._delete(earlier, str(self._names[lid]), born)
            self._names_at = max(self._names_at, born)
            if record is None or not record[1]:  # its record unreadable: the id stays
                t.gen[lid] = gen  # free, its next topic a generation past these entries
                self._names_log.write(encode(DELETE, lid, gen, 0, "", born))
                self._names_log.count(1)
                continue
            p = self._parent_of_record(record[0])
            name = record[1]
            if f"{p.pid}\x01{name}" in self._ids:  # its earlier incarnation: deleted before
                self._delete(p, name, born)
            t.gen[lid] = gen
            t.parent[lid] = p.pid
            t.last[lid] = -1
            t.next_off[lid] = 0
            t.born[lid] = born
            self._ids[f"{p.pid}\x01{name}"] = lid
            self._names[lid] = name
            p.count += 1
            self._names_log.write(encode(BIND, lid, gen, p.pid, name, born))
            self._names_log.count(1)
        if found:
            self._free = np.flatnonzero(t.parent[: t.size] < 0).tolist()[::-1]
            log.warning(
                "lite store %s: %d lite topics had index entries but no binding in names "
                "(its tail lost in a power cut): bound again from their records",
                self.root,
                len(found),
            )
        return len(found)

    def _rebuild_from_index(self) -> None:
        """Each live lite topic's last entry, count and last write time, from one pass
        over the index files (numpy, a file at a time)."""
        t = self.table
        for start, rows in self.index.written():
            lid = rows["lid"].astype(np.int64)
            ok = lid < t.size
            ok[ok] &= (t.parent[lid[ok]] >= 0) & (t.gen[lid[ok]] == rows["gen"][ok])
            picked = np.flatnonzero(ok)
            if not len(picked):
                continue
            # the last entry of each id in this file: first of the reversed order
            rev = picked[::-1]
            ids, first = np.unique(lid[rev], return_index=True)
            at = rev[first]
            t.last[ids] = start + at
            t.next_off[ids] = rows["loff"][at] + 1
            t.last_ms[ids] = rows["ts"][at]
        # a topic with no entry left (created by a subscription, or its entries expired
        # with the commitlog) keeps its creation time: the file's time is a fair floor
        now = self.store.now_ms()
        live = np.flatnonzero((t.parent[: t.size] >= 0) & (t.last_ms[: t.size] == 0))
        t.last_ms[live] = now

    def _index_covered(self) -> int:
        if self.index.end == 0 or self.index.end == self.index.min_entry:
            return 0
        f = self.index.file_of(self.index.end - 1)
        assert f is not None
        slot = self.index.end - 1 - f.start
        return int(f.phys[slot]) + int(f.size[slot])

    def _read_checkpoint(self) -> tuple[int, int | None]:
        """``(covered, state)``: the checkpoint's offset, and the state cursor (None: no
        checkpoint, or one written before it was kept, whose ``covered`` was the
        index's end too)."""
        path = self.root / "checkpoint"
        try:
            doc = json.loads(path.read_text())
            covered = int(doc["covered"])
            state = doc.get("state")
            return covered, None if state is None else int(state)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return 0, None

    def _write_checkpoint(self, covered: int) -> None:
        """``covered``: every consumer state record below it is applied and saved (and
        every lite record below it indexed)."""
        path = self.root / "checkpoint"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps({"covered": covered, "state": covered}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _compact_names(self) -> None:
        """Rewrite ``names`` when most of its records are history: parents, live
        bindings and, for each free id, its generation (so the id's next topic is told
        apart from the entries of the ones before)."""
        live = len(self._ids)
        if self._names_log.records <= 2 * (live + len(self._free)) + 10_000:
            return
        if self._deaths is not None:
            return  # a replay still needs the deaths it keeps: at a later open
        # the deaths dropped are all below the checkpoint once this flush wrote it: no
        # replay will ask for them
        self.flush()
        parts = [encode(PARENT, p.pid, 0, p.pid, p.name) for p in self._parents.values()]
        t = self.table
        for lid in range(t.size):
            name = self._names[lid]
            if name is None:
                parts.append(encode(DELETE, lid, int(t.gen[lid]), 0))
            else:
                gen, pid, born = int(t.gen[lid]), int(t.parent[lid]), int(t.born[lid])
                parts.append(encode(BIND, lid, gen, pid, name, born))
        self._names_log.replace(b"".join(parts), len(parts))

    # ------------------------------------------------------------ parents
    def declare_parent(
        self, parent: str, *, quota: int | None = None, ttl_ms: int | None = None
    ) -> None:
        """Make ``parent`` a topic of type LITE (again, after a restart: its quota and
        TTL are the caller's to keep, with its topic config)."""
        codec.validate_topic(parent)
        quota = self.config.default_quota if quota is None else quota
        ttl_ms = self.config.default_ttl_ms if ttl_ms is None else ttl_ms
        for name, value in (("quota", quota), ("ttl_ms", ttl_ms)):
            if not isinstance(value, int) or value <= 0:
                raise InvalidConfigError(f"{name}={value!r}: must be an int > 0")
        with self._lock:
            self._check_open()
            known = self._parents.get(parent)
            if known is not None:
                known.quota, known.ttl_ms = quota, ttl_ms
                return
            pid = len(self._parents_by_id)
            self._names_log.write(encode(PARENT, pid, 0, pid, parent))
            self._names_log.count(1)
            self._set_parent(pid, parent, quota, ttl_ms)

    def parents(self) -> list[str]:
        return sorted(self._parents)

    def parent_settings(self, parent: str) -> dict[str, int]:
        """A declared parent's quota, TTL and live lite topics
        (:class:`NotALiteParentError` for another topic)."""
        p = self._parent(parent)
        return {"quota": p.quota, "ttl_ms": p.ttl_ms, "lite_topics": p.count}

    def _parent(self, parent: str) -> _Parent:
        found = self._parents.get(parent)
        if found is None:
            raise NotALiteParentError(f"topic {parent!r} is not a parent of lite topics (LITE)")
        return found

    # ------------------------------------------------------------ write
    def put(self, parent: str, lite_topic: str, message: Message) -> LitePutResult:
        """:meth:`put_batch` of one message: the same checks and bytes, on a path of
        its own (no per-batch lists, no numpy scalars), so a send to one lite topic
        among a million costs what a send to a normal topic's queue costs."""
        p = self._parent(parent)
        name = validate_lite_name(lite_topic)
        items = ((name, message),)
        lites = [name]
        batch = self._encode_plain(parent, items, lites)
        if batch is None:
            batch = self._encode_general(parent, items, lites)
        if (
            batch.delay_levels is not None
            or batch.timer
            or transaction.may_hold_transactional(batch)
        ):
            self._check_kind(batch, lites)  # raises unless plain after all (no delay level)
        return self._put_one(p, batch, f"{p.pid}\x01{name}")

    def put_batch(self, parent: str, items: Sequence[tuple[str, Message]]) -> LitePutResult:
        """Store messages to lite topics of ``parent`` as one CommitLog append; a lite
        topic a message names is created if new. Checked before anything is written:
        names (:class:`IllegalLiteTopicError`), the parent's quota
        (:class:`LiteTopicQuotaExceededError`), the messages."""
        p = self._parent(parent)
        batch, lites = self._encode(parent, items)
        return self._put(p, batch, lites)

    def _encode(
        self, parent: str, items: Sequence[tuple[str, Message]]
    ) -> tuple[codec.EncodedBatch, list[str]]:
        """The batch of records that ``items`` make (each naming its lite topic in its
        ``__LITE_TOPIC`` property), and the lite topics' names."""
        if not items:
            raise InvalidMessageError("a put of no message")
        lites = [validate_lite_name(lite) for lite, _ in items]
        fast = self._encode_plain(parent, items, lites)
        if fast is not None:
            return fast, lites
        return self._encode_general(parent, items, lites), lites

    def _encode_general(
        self, parent: str, items: Sequence[tuple[str, Message]], lites: list[str]
    ) -> codec.EncodedBatch:
        """:meth:`_encode`'s batch through the general loop (any message)."""
        messages = []
        for (lite, m), name in zip(items, lites):
            if m.topic != parent:
                raise InvalidMessageError(
                    f"a message to lite topic {name!r} of {parent!r} has topic={m.topic!r}"
                )
            props = dict(m.properties) if m.properties else {}
            props[PROP_LITE_TOPIC] = lite
            messages.append(
                Message(parent, m.body, m.tags, m.keys, props, m.queue_id, m.flag, m.delay_level)
            )
        return codec.encode_batch(messages, max_message_size=self.store.config.max_message_size)

    def _encode_plain(
        self, parent: str, items: Sequence[tuple[str, Message]], lites: list[str]
    ) -> codec.EncodedBatch | None:
        """The batch through the C encoder, the same bytes as the general loop writes:
        when no message has properties of its own and all name one lite topic (a
        stream's batch), its ``__LITE_TOPIC`` written as a property all records share;
        else as each record's own (a single message's too: the same bytes, and the
        encoder's constants then those of its parent, not one set per lite topic),
        after the message's own properties when these are plain (none the loop treats
        its own way: tags, keys, unique key, delay, transaction or timer marks). None
        otherwise (or without ``storage._native``)."""
        name = lites[0]
        size = self.store.config.max_message_size
        if len(items) == 1:  # a single put: its name as the record's own property
            m = items[0][1]
            if m.topic != parent:
                return None
            if not m.properties:
                return _fast_encode.encode_plain(
                    (m,),
                    size,
                    int(time.time() * 1000),
                    _BORN_LOCAL,
                    default_generator,
                    extras=(_LITE_PROP + name.encode() + b"\x02",),
                )
        one = True
        own = False
        for (_, m), lite in zip(items, lites):
            if m.topic != parent:
                return None
            if m.properties:
                own = True
            if lite != name:
                one = False
        messages = [m for _, m in items]
        stamp = int(time.time() * 1000)
        if one and not own:
            return _fast_encode.encode_plain(
                messages,
                size,
                stamp,
                _BORN_LOCAL,
                default_generator,
                shared={PROP_LITE_TOPIC: name},
            )
        texts: dict[str, bytes] = {}
        extras = []
        for m, lite in zip(messages, lites):
            props = m.properties
            if props:
                if any(k in _OWN_WAY for k in props):
                    return None
                mine = dict(props)
                mine[PROP_LITE_TOPIC] = lite
                extras.append(properties.encode_properties(mine))
                continue
            text = texts.get(lite)
            if text is None:
                text = texts[lite] = _LITE_PROP + lite.encode() + b"\x02"
            extras.append(text)
        return _fast_encode.encode_plain(
            messages, size, stamp, _BORN_LOCAL, default_generator, extras=extras
        )

    # ------------------------------------------------------------ write through a log
    def prepare(self, parent: str, items: Sequence[tuple[str, Message]]) -> LiteProposal:
        """Check and encode a lite batch that a group's log will write (a Raft
        leader's send): the checks of :meth:`put_batch`, the quota counting the new
        lite topics of the proposals still in flight. Nothing is written; the caller
        writes ``batch`` through its log, then calls :meth:`settle` once it is
        committed, or :meth:`release` if it is not."""
        p = self._parent(parent)
        batch, lites = self._encode(parent, items)
        self._check_kind(batch, lites)
        keys = [f"{p.pid}\x01{name}" for name in lites]
        with self._lock:
            self._check_open()
            new = [k for k in dict.fromkeys(keys) if k not in self._ids]
            fresh = sum(1 for k in new if k not in self._reserved)
            if new and p.count + p.reserved + fresh > p.quota:
                raise LiteTopicQuotaExceededError(
                    f"parent {p.name!r} holds {p.count} lite topics ({p.reserved} more on "
                    f"their way); {fresh} more would pass its quota of {p.quota}"
                )
            for k in new:
                self._reserved[k] = self._reserved.get(k, 0) + 1
            p.reserved += fresh
        return LiteProposal(parent, batch, lites, new)

    def release(self, proposal: LiteProposal) -> None:
        """Give back the places a proposal held in its parent's quota."""
        with self._lock:
            self._release(proposal)

    def _release(self, proposal: LiteProposal) -> None:
        if proposal.released:
            return
        proposal.released = True
        p = self._parents.get(proposal.parent)
        for k in proposal.reserved:
            left = self._reserved.get(k, 1) - 1
            if left > 0:
                self._reserved[k] = left
            else:
                self._reserved.pop(k, None)
                if p is not None:
                    p.reserved -= 1

    def settle(self, proposal: LiteProposal, commitlog_offsets: np.ndarray) -> LitePutResult:
        """A committed proposal, written at ``commitlog_offsets``: indexed (with every
        committed record before it) and its places in the quota given back; per message
        its lite offset (-1 if its record is not committed yet)."""
        self.catch_up()
        phys = np.asarray(commitlog_offsets, dtype=np.int64)
        with self._lock:
            self._release(proposal)
            loffs = self._loffs_at(phys)
        return LitePutResult(loffs, phys, list(proposal.batch.uniq_keys))

    def _loffs_at(self, phys: np.ndarray) -> np.ndarray:
        """The lite offsets of the indexed records at these CommitLog offsets (lock held;
        -1: none indexed there). The index is in CommitLog order: a binary search per
        file, from the newest."""
        out = np.full(len(phys), -1, dtype=np.int64)
        if not len(phys):
            return out
        lowest = int(phys.min())
        for _, rows in reversed(self.index.written()):
            column = rows["phys"]
            if not len(column):
                continue
            at = np.searchsorted(column, phys)
            inside = at < len(column)
            hit = inside.copy()
            hit[inside] = column[at[inside]] == phys[inside]
            out[hit] = rows["loff"][at[hit]]
            if int(column[0]) <= lowest:
                break
        return out

    def behind(self) -> bool:
        """Whether committed records lie past what is indexed (:meth:`catch_up` would
        index them): a new Raft leader's store, before its first lite put or read."""
        return self._covered < self._catch_up_end()

    def _catch_up_end(self) -> int:
        end = self.store.dispatched_offset
        if self._committed_end is not None:
            end = min(end, self._committed_end())
        return end

    def put_encoded(self, parent: str, batch: codec.EncodedBatch) -> LitePutResult:
        """Store a batch a producer encoded (the broker's path), each record naming its
        lite topic in its ``__LITE_TOPIC`` property; checked as :meth:`put_batch`."""
        p = self._parent(parent)
        batch.check_structure()
        if batch.topics != (parent,):
            raise InvalidMessageError(
                f"a lite batch for {parent!r} holds records of topics {batch.topics!r}"
            )
        lites = [validate_lite_name(name) for name in lite_names(batch.data)]
        return self._put(p, batch, lites)

    def _check_kind(self, batch: codec.EncodedBatch, lites: list[str]) -> None:
        if len(lites) != len(batch):
            raise InvalidMessageError(
                f"{len(batch) - len(lites)} of {len(batch)} records name no lite topic"
            )
        delayed = batch.delay_levels is not None and bool(batch.delay_levels.any())
        if delayed or batch.timer or transaction.may_hold_transactional(batch):
            raise InvalidMessageError(
                "a lite topic takes plain messages: no delay, timer or transaction"
            )

    def _put(self, p: _Parent, batch: codec.EncodedBatch, lites: list[str]) -> LitePutResult:
        self._check_kind(batch, lites)
        keys = [f"{p.pid}\x01{name}" for name in lites]
        if len(keys) == 1:
            return self._put_one(p, batch, keys[0])
        with self._lock:
            self._check_open()
            ids = self._ids
            new = [k for k in dict.fromkeys(keys) if k not in ids]
            self._check_quota(p, len(new))
            phys, ts, end = self._append(batch)
            self._bind_many(p, new, ts, int(phys[0]))
            lids = np.fromiter((ids[k] for k in keys), dtype=np.int64, count=len(keys))
            loffs = self._index(lids, phys, batch.sizes, ts)
        return self._answer(batch, loffs, phys, end)

    def _put_one(self, p: _Parent, batch: codec.EncodedBatch, key: str) -> LitePutResult:
        """:meth:`_put` of one message: plain ints, no per-batch arrays."""
        store = self.store
        with self._lock:
            if self._closed:
                self._check_open()
            lid = self._ids.get(key)
            if lid is None:
                self._check_quota(p, 1)
            # the record's store time is its index entry's too
            at, ts, end = store.put_one_written(batch)
            if lid is None:
                self._bind_many(p, [key], ts, at)
                lid = self._ids[key]
            o = self._index_one(lid, at, batch.sizes.item(0), ts)
        flushed = store.wait_durable(end) if end else True
        loffs = _ONE.copy()  # a copy and a store: a third of np.array((o,))'s cost
        loffs[0] = o
        phys = _ONE.copy()
        phys[0] = at
        keys = batch.uniq_keys
        if keys.__class__ is PackedKeys:  # as it splits them, without its calls
            raw = keys.raw  # type: ignore[attr-defined]
            ids = raw.decode("ascii").split("\x00") if raw else []
        else:
            ids = list(keys)
        return LitePutResult(loffs, phys, ids, flushed)

    def _check_quota(self, p: _Parent, more: int) -> None:
        """Refuse ``more`` new lite topics that would pass ``p``'s quota (lock held)."""
        if more and p.count + more > p.quota:
            raise LiteTopicQuotaExceededError(
                f"parent {p.name!r} holds {p.count} lite topics; {more} more would "
                f"pass its quota of {p.quota}"
            )

    def _append(self, batch: codec.EncodedBatch) -> tuple[np.ndarray, int, int]:
        """Append ``batch`` to the CommitLog (lock held): its records' offsets, the
        store's time, and the end a sync flush must reach (0: none to wait for)."""
        result, end = self.store.put_encoded_written(batch)
        return np.asarray(result.commitlog_offsets, dtype=np.int64), self.store.now_ms(), end

    def _answer(
        self, batch: codec.EncodedBatch, loffs: np.ndarray, phys: np.ndarray, end: int
    ) -> LitePutResult:
        """The put's result, once durable where the flush mode asks it (lock released)."""
        flushed = self.store.wait_durable(end) if end else True
        return LitePutResult(loffs, phys, list(batch.uniq_keys), flushed)

    def create(self, parent: str, lite_topic: str) -> bool:
        """Create ``lite_topic`` (a subscription naming it); False if it exists."""
        p = self._parent(parent)
        name = validate_lite_name(lite_topic)
        key = f"{p.pid}\x01{name}"
        with self._lock:
            self._check_open()
            if key in self._ids:
                return False
            if p.count + 1 > p.quota:
                raise LiteTopicQuotaExceededError(
                    f"parent {parent!r} holds {p.count} lite topics, its quota"
                )
            self._bind_many(p, [key], self.store.now_ms(), self._here())
            return True

    def check_room(self, parent: str, lite_topics: Sequence[str]) -> None:
        """:class:`LiteTopicQuotaExceededError` if creating those of ``lite_topics`` that
        do not exist would pass ``parent``'s quota (a subscription a group's log will
        carry; proposals in flight counted). Nothing is created."""
        p = self._parent(parent)
        names = [validate_lite_name(n) for n in lite_topics]
        with self._lock:
            self._check_open()
            new = {n for n in names if f"{p.pid}\x01{n}" not in self._ids}
            if new and p.count + p.reserved + len(new) > p.quota:
                raise LiteTopicQuotaExceededError(
                    f"parent {parent!r} holds {p.count} lite topics; {len(new)} more would "
                    f"pass its quota of {p.quota}"
                )

    def _bind_many(self, p: _Parent, keys: list[str], ts: int, at: int) -> None:
        """Give each new key an id (lock held) and record it in ``names``, created by
        the record at CommitLog offset ``at``."""
        if not keys:
            return
        if self._deletes_written != self._deletes_synced:
            # A delete (or expiry) not yet on disk: fsynced before a topic created after
            # it can be acknowledged. Else a power loss could keep the new topic's
            # records and lose the delete, and a topic of the same name created again
            # would take them after the old one's messages, at other offsets than
            # acknowledged. One fsync per batch of deletes, paid by the next creation.
            self._names_log.flush()
            self._deletes_synced = self._deletes_written
        t = self.table
        n = len(keys)
        reuse = min(n, len(self._free))
        lids = [self._free.pop() for _ in range(reuse)]
        if reuse < n:
            base = t.size
            t.ensure(base + n - reuse)
            lids.extend(range(base, base + n - reuse))
            self._names.extend([None] * (t.size - len(self._names)))
        arr = np.asarray(lids, dtype=np.int64)
        if reuse:
            t.gen[arr[:reuse]] += 1
        t.parent[arr] = p.pid
        t.last[arr] = -1
        t.next_off[arr] = 0
        t.last_ms[arr] = ts
        t.born[arr] = at
        gens = t.gen[arr].tolist()
        prefix = len(str(p.pid)) + 1
        parts = []
        for key, lid, gen in zip(keys, lids, gens):
            name = key[prefix:]
            self._ids[key] = lid
            self._names[lid] = name
            parts.append(encode(BIND, lid, gen, p.pid, name, at))
        self._names_log.write(b"".join(parts))
        self._names_log.count(n)
        p.count += n
        if p.sorted_names is not None:
            p.sorted_names.update(key[prefix:] for key in keys)

    def _index(self, lids: np.ndarray, phys: np.ndarray, sizes: np.ndarray, ts: int) -> np.ndarray:
        """Index entries for records just written (lock held); their lite offsets."""
        t = self.table
        n = len(lids)
        if n == 1:
            o = self._index_one(int(lids[0]), int(phys[0]), int(sizes[0]), ts)
            return np.array((o,), dtype=np.int64)
        first = self.index.end
        rows = np.zeros(n, dtype=ENTRY)
        rows["lid"] = lids
        rows["gen"] = t.gen[lids]
        rows["phys"] = phys
        rows["size"] = sizes
        rows["ts"] = ts
        entries = first + np.arange(n, dtype=np.int64)
        if n == 1 or len(np.unique(lids)) == n:  # one message per lite topic: vectorised
            loff = t.next_off[lids]
            prev = t.last[lids]
            rows["loff"] = loff
            rows["prev"] = prev
            skip = np.where(loff & 1, prev, -1)
            for i in np.flatnonzero((loff > 0) & ((loff & 1) == 0)).tolist():
                skip[i] = self._skip_target(int(prev[i]), int(loff[i]), rows, first)
            rows["skip"] = skip
            t.next_off[lids] = loff + 1
            t.last[lids] = entries
        else:  # several messages per lite topic: in order, each after the one before
            for i, lid in enumerate(lids.tolist()):
                o = int(t.next_off[lid])
                prev_e = int(t.last[lid])
                rows["loff"][i] = o
                rows["prev"][i] = prev_e
                if o == 0:
                    rows["skip"][i] = -1
                elif o & 1:
                    rows["skip"][i] = prev_e
                else:
                    rows["skip"][i] = self._skip_target(prev_e, o, rows, first)
                t.next_off[lid] = o + 1
                t.last[lid] = first + i
        t.last_ms[lids] = ts
        self.index.append(rows)
        return rows["loff"].copy()

    def _index_one(self, lid: int, phys: int, size: int, ts: int) -> int:
        """:meth:`_index` of one record (lock held), through the table's memoryviews
        (Python ints, no numpy scalar); its lite offset."""
        t = self.table
        next_off, last = t.next_off_v, t.last_v
        o = next_off[lid]
        prev = last[lid]
        if o == 0:
            skip = -1
        elif o & 1:
            skip = prev
        else:
            skip = self._skip_target(prev, o, None, 0)
        e = self.index.append_one(lid, t.gen_v[lid], o, phys, size, ts, prev, skip)
        next_off[lid] = o + 1
        last[lid] = e
        t.last_ms_v[lid] = ts
        return o

    def _skip_target(self, prev_e: int, o: int, rows: np.ndarray | None, first: int) -> int:
        """The entry of offset ``o & (o - 1)``, from the entry of ``o - 1``: its skips
        clear the low bits of ``o - 1`` one by one (about one step on average).
        ``rows``: entries from ``first`` on not written yet."""
        target = o & (o - 1)
        cur, cur_off = prev_e, o - 1
        index = self.index
        while cur_off > target:
            if rows is not None and cur >= first:
                cur = int(rows["skip"][cur - first])
            else:
                f = index.file_of(cur)
                if f is None:
                    return -1
                cur = f.q[(cur - f.start) * 7 + 6]
            cur_off &= cur_off - 1
            if cur < 0:
                return -1
        return cur

    # ------------------------------------------------------------ read
    def busy(self) -> bool:
        """Whether a write, an expiry slice or a catch-up holds the lock now: a reader
        on an event loop then reads on a thread instead (a catch-up after a failover
        may hold it long)."""
        return self._lock.locked()

    def put_waits(self) -> bool:
        """Whether a put now could wait: the lock is held (a write, an expiry slice, a
        catch-up), or a delete not yet on disk would be fsynced before the next lite
        topic created. A writer on an event loop then puts on a thread instead."""
        return self._lock.locked() or self._deletes_written != self._deletes_synced

    def get_raw(
        self, parent: str, lite_topic: str, offset: int, max_count: int = 32
    ) -> RawGetResult:
        """Up to ``max_count`` records of the lite topic from ``offset`` as one blob (the
        statuses of :meth:`MessageStore.get_raw`)."""
        self._check_open()
        p = self._parent(parent)
        name = validate_lite_name(lite_topic)
        if not isinstance(offset, int) or offset < 0:
            raise InvalidMessageError(f"offset={offset!r}: must be an int >= 0")
        if max_count <= 0:
            raise InvalidMessageError(f"max_count={max_count}: must be > 0")
        with self._lock:
            lid = self._ids.get(f"{p.pid}\x01{name}")
            if lid is None:
                return RawGetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, b"", 0, 0, 0, 0)
            max_off = int(self.table.next_off[lid])
            last = int(self.table.last[lid])
        if max_off == 0:
            return RawGetResult(GetStatus.NO_MESSAGE_IN_QUEUE, b"", 0, 0, 0, 0)
        if offset == max_off:
            return RawGetResult(GetStatus.OFFSET_OVERFLOW_ONE, b"", 0, offset, 0, max_off)
        if offset > max_off:
            return RawGetResult(GetStatus.OFFSET_OVERFLOW_BADLY, b"", 0, max_off, 0, max_off)
        stop = min(offset + max_count, max_off)  # read [offset, stop)
        phys, sizes, lowest = self._collect(last, max_off - 1, offset, stop)
        if lowest > offset:  # entries before the lowest held left with the CommitLog
            lowest = self._lowest_held(last, max_off - 1, lowest)
            return RawGetResult(GetStatus.OFFSET_TOO_SMALL, b"", 0, lowest, lowest, max_off)
        data = self.store.commitlog.read_runs(phys, sizes)
        return RawGetResult(GetStatus.FOUND, data, len(phys), stop, 0, max_off, sizes)

    def _collect(
        self, e: int, e_off: int, offset: int, stop: int
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """The CommitLog offsets and sizes of lite offsets [offset, stop), from entry
        ``e`` (of offset ``e_off``): skips, then prev steps. Also the lowest offset
        reached, above ``offset`` when the chain ends early (expired entries)."""
        files = self.index.files
        if not files:
            return _EMPTY, _EMPTY32, stop
        base, per, end = files[0].start, self.index.per_file, self.index.end
        floor = self.store.commitlog.min_offset
        target = stop - 1
        if e_off > target and base <= e - (e_off - target) and e < end:  # one run: jump
            f = files[(e - base) // per]
            to = e - (e_off - target)
            if to >= f.start:
                q = f.q
                if (
                    q[(to - f.start) * 7 + 1] == target
                    and q[(to - f.start) * 7] == q[(e - f.start) * 7]
                ):
                    e, e_off = to, target
        while e_off > target:  # seek
            if e < base or e >= end:
                return _EMPTY, _EMPTY32, stop
            f = files[(e - base) // per]
            s_off = e_off & (e_off - 1)
            if s_off >= target:
                e, e_off = f.q[(e - f.start) * 7 + 6], s_off
            else:
                e, e_off = f.q[(e - f.start) * 7 + 5], e_off - 1
        n = stop - offset
        if e >= base and e < end:  # the range one run of entries (a lone writer's): sliced
            f = files[(e - base) // per]
            last_slot = e - f.start
            first_slot = last_slot - (n - 1)
            q = f.q
            if (
                first_slot >= 0
                and q[first_slot * 7 + 1] == offset
                and q[first_slot * 7] == q[last_slot * 7]  # the same lid and generation
                and q[first_slot * 7 + 2] >= floor
            ):
                run = slice(first_slot, last_slot + 1)
                return f.phys[run].copy(), f.size[run].copy(), offset
        phys = [0] * n
        sizes = [0] * n
        i = n - 1
        while i >= 0:
            if e < base or e >= end:
                break
            f = files[(e - base) // per]
            w = (e - f.start) * 7
            q = f.q
            ph = q[w + 2]
            if ph < floor:
                break
            phys[i] = ph
            sizes[i] = q[w + 3]
            e = q[w + 5]
            i -= 1
        lowest = offset + i + 1
        return (
            np.array(phys[i + 1 :], dtype=np.int64),
            np.array(sizes[i + 1 :], dtype=np.int32),
            lowest,
        )

    def _lowest_held(self, e: int, e_off: int, above: int) -> int:
        """The lowest offset still readable: a binary search in [``above``, ``e_off``]
        (those held are a suffix of the topic; none below ``above`` is held)."""
        lo, hi = above, e_off
        while lo < hi:
            mid = (lo + hi) // 2
            phys, _, lowest = self._collect(e, e_off, mid, mid + 1)
            if lowest <= mid and len(phys):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def get(self, parent: str, lite_topic: str, offset: int, max_count: int = 32) -> GetResult:
        """Like :meth:`get_raw`, decoded."""
        raw = self.get_raw(parent, lite_topic, offset, max_count)
        messages = (
            codec.decode_records(raw.data, check_crc=False, sizes=raw.sizes) if raw.count else []
        )
        return GetResult(raw.status, messages, raw.next_offset, raw.min_offset, raw.max_offset)

    def max_offset(self, parent: str, lite_topic: str) -> int:
        """The lite topic's message count (0: none, or no such lite topic)."""
        lid = self._ids.get(f"{self._parent(parent).pid}\x01{validate_lite_name(lite_topic)}")
        return 0 if lid is None else int(self.table.next_off[lid])

    def exists(self, parent: str, lite_topic: str) -> bool:
        return f"{self._parent(parent).pid}\x01{validate_lite_name(lite_topic)}" in self._ids

    def count(self, parent: str | None = None) -> int:
        """Live lite topics of ``parent`` (of every parent when None)."""
        if parent is None:
            return len(self._ids)
        return self._parent(parent).count

    # ------------------------------------------------------------ consumer offsets
    def commit_offset(self, group: str, parent: str, lite_topic: str, offset: int) -> None:
        """Record that ``group`` consumed the lite topic up to ``offset`` (the next one to
        read). A lite topic that does not exist (expired) takes no commit."""
        with self._lock:
            self._check_open()
            lid = self._check_commit(group, parent, lite_topic, offset)
            if lid is not None:
                self.offsets.commit(group, lid, int(self.table.gen[lid]), offset)

    def check_commit(self, group: str, parent: str, lite_topic: str, offset: int) -> bool:
        """Whether :meth:`commit_offset` would record this commit (False: no such lite
        topic), its errors raised; nothing is written (a commit a group's log carries)."""
        with self._lock:
            self._check_open()
            return self._check_commit(group, parent, lite_topic, offset) is not None

    def _check_commit(self, group: str, parent: str, lite_topic: str, offset: int) -> int | None:
        p = self._parent(parent)
        name = validate_lite_name(lite_topic)
        if not isinstance(offset, int) or offset < 0:
            raise InvalidMessageError(f"offset={offset!r}: must be an int >= 0")
        codec.validate_topic(group)  # a group's name follows the topic rule
        lid = self._ids.get(f"{p.pid}\x01{name}")
        if lid is None:
            return None
        top = int(self.table.next_off[lid])
        if offset > top:
            raise InvalidMessageError(f"offset={offset} is past lite topic {name!r}'s end {top}")
        return lid

    def committed_offset(self, group: str, parent: str, lite_topic: str) -> int:
        """The offset ``group`` committed in the lite topic, or -1 (none: a new group,
        or a lite topic created again after it expired)."""
        p = self._parent(parent)
        name = validate_lite_name(lite_topic)
        with self._lock:
            lid = self._ids.get(f"{p.pid}\x01{name}")
            if lid is None:
                return -1
            return self.offsets.get(group, lid, int(self.table.gen[lid]))

    def lite_topics(self, parent: str) -> list[str]:
        """The live lite topics of ``parent``, sorted (a walk of the table)."""
        pid = self._parent(parent).pid
        t = self.table
        lids = np.flatnonzero(t.parent[: t.size] == pid).tolist()
        return sorted(n for n in (self._names[i] for i in lids) if n is not None)

    def lite_topics_page(self, parent: str, after: str, limit: int) -> tuple[list[str], int, int]:
        """The first ``limit`` live lite topics of ``parent`` whose names sort after
        ``after`` (``""``: from the first), with the parent's live count and how many
        names sort after ``after``. The names are kept sorted from the first call on,
        so a page costs O(limit + log n)."""
        p = self._parent(parent)
        with self._lock:
            names = p.sorted_names
            if names is None:
                t = self.table
                lids = np.flatnonzero(t.parent[: t.size] == p.pid).tolist()
                names = SortedList(n for n in (self._names[i] for i in lids) if n is not None)
                p.sorted_names = names
            start = names.bisect_right(after) if after else 0
            page = list(names.islice(start, start + limit))
            return page, len(names), len(names) - start

    def describe(self, parent: str, lite_topic: str) -> dict[str, Any] | None:
        """A live lite topic's message count (its max offset), the store time of its
        last write and each group's committed offset in it; None if it does not exist."""
        p = self._parent(parent)
        name = validate_lite_name(lite_topic)
        with self._lock:
            lid = self._ids.get(f"{p.pid}\x01{name}")
            if lid is None:
                return None
            t, gen = self.table, int(self.table.gen[lid])
            committed = {g: self.offsets.get(g, lid, gen) for g in self.offsets.groups()}
            return {
                "max_offset": int(t.next_off[lid]),
                "last_write_ms": int(t.last_ms[lid]),
                "committed": {g: off for g, off in committed.items() if off >= 0},
            }

    def delete(self, parent: str, lite_topic: str) -> bool:
        """Delete ``lite_topic`` now, as its TTL would: its groups' offsets go with it
        and a later send creates it anew from offset 0. False if it does not exist."""
        p = self._parent(parent)
        name = validate_lite_name(lite_topic)
        with self._lock:
            self._check_open()
            if not self._delete(p, name, self._here()):
                return False
        log.info("lite store %s: lite topic %r of %r deleted", self.root, name, parent)
        return True

    def _delete(self, p: _Parent, name: str, at: int) -> bool:
        """Delete the live lite topic ``name`` (lock held), by the record at CommitLog
        offset ``at``."""
        key = f"{p.pid}\x01{name}"
        lid = self._ids.get(key)
        if lid is None:
            return False
        self._died(key, at)
        self._names_log.write(encode(DELETE, lid, int(self.table.gen[lid]), 0, "", at))
        self._names_log.count(1)
        self._deletes_written += 1
        self._unbind(lid)
        self._free.append(lid)
        return True

    # ------------------------------------------------------------ expiry
    def expire(self, now_ms: int | None = None) -> int:
        """Delete the lite topics with no write for their parent's TTL; return how many.

        Runs in slices, the lock taken for each slice only: a slice ends after
        ``expire_slice_ms`` of work or ``expire_slice`` topics, whichever comes first,
        and the next one starts after a pause, so a writer waits one short slice at
        most. What needs no lock (which topics are due, their ``names`` records) is
        done outside it, with numpy; inside, only the dictionaries' entries go one by
        one."""
        now = self.store.now_ms() if now_ms is None else now_ms
        t = self.table
        due, cutoff = self._due(now)
        done = slices = 0
        held = held_cpu = 0.0
        budget = self.config.expire_slice_ms / 1000
        most = self.config.expire_slice
        a = 0
        while a < len(due):
            with self._lock:
                if self._closed:
                    break
                held_at, cpu_at = time.perf_counter(), time.thread_time()
                end = min(len(due), a + most)
                records = []
                while a < end:
                    # a step's worth at a time, the clock read between steps
                    chunk = due[a : min(end, a + _EXPIRE_STEP)]
                    a += len(chunk)
                    # written to since the look above: not due any more
                    still = chunk[(t.parent[chunk] >= 0) & (t.last_ms[chunk] < cutoff[chunk])]
                    if len(still):
                        data, gone = self._unbind_many(still)
                        records.append(data)
                        done += len(still)
                        self._tell_expired(gone)
                    if time.perf_counter() - held_at >= budget:
                        break
                if records:
                    data = b"".join(records)
                    self._names_log.write(data)
                    self._names_log.count(len(data) // _DELETE_REC.itemsize)
                    self._deletes_written += 1
                held = max(held, time.perf_counter() - held_at)
                held_cpu = max(held_cpu, time.thread_time() - cpu_at)
                slices += 1
            # threading.Lock is not fair: without a pause, this loop takes it back before
            # a waiting writer wakes, and writes starve until the expiry ends
            time.sleep(_EXPIRE_PAUSE_S)
        self.last_expiry = {
            "expired": done,
            "slices": slices,
            "max_hold_ms": round(held * 1000, 3),
            "max_hold_cpu_ms": round(held_cpu * 1000, 3),
        }
        if done:
            log.info(
                "lite store %s: %d lite topics expired in %d slices (the lock held %.1f ms "
                "at most)",
                self.root,
                done,
                slices,
                held * 1000,
            )
        return done

    def _unbind_many(
        self, lids: np.ndarray, at: int | None = None
    ) -> tuple[bytes, dict[int, list[str]]]:
        """Free these live lite topics' ids (lock held); their ``d`` records, and their
        names per parent id. ``at``: the record that deletes them (an ``expire`` state
        record); None: this store's own expiry."""
        t = self.table
        recs = np.zeros(len(lids), dtype=_DELETE_REC)
        recs["kind"] = DELETE
        recs["lid"] = lids
        recs["gen"] = t.gen[lids]
        if at is None:
            # expired once the records below the cursor applied, after the one that
            # created it
            recs["at"] = np.maximum(self._here(), t.born[lids] + 1)
        else:
            recs["at"] = at
        pids = t.parent[lids].tolist()
        names = self._names
        gone: dict[int, list[str]] = {}
        if self._deaths is not None:
            for lid, pid, where in zip(lids.tolist(), pids, recs["at"].tolist()):
                self._died(f"{pid}\x01{names[lid]}", where)
        for lid, pid in zip(lids.tolist(), pids):
            gone.setdefault(pid, []).append(names[lid])  # type: ignore[arg-type]
            self._forget_name(lid, pid)
        t.parent[lids] = -1
        t.last[lids] = -1
        t.next_off[lids] = 0
        self._free.extend(lids.tolist())
        return recs.tobytes(), gone

    def _tell_expired(self, gone: dict[int, list[str]]) -> None:
        """Hand the lite topics an expiry deleted to :attr:`expired_listener` (lock
        held)."""
        listener = self.expired_listener
        if listener is None:
            return
        for pid, names in gone.items():
            parent = self._parents_by_id[pid]
            assert parent is not None
            listener(parent.name, names)

    def due_for_expiry(
        self, now_ms: int | None = None, most: int = 2048
    ) -> list[tuple[str, int, list[str]]]:
        """What a Raft leader proposes to expire (an ``expire`` state record each,
        :mod:`storage.lite.state`): ``(parent, seen, names)`` with at most ``most`` names,
        ``seen`` where this store stood in the log when it looked (every write below it
        counted in the topics' last write times). Nothing changes here: every member
        deletes them when it applies the record."""
        now = self.store.now_ms() if now_ms is None else now_ms
        with self._lock:
            self._check_open()
            seen = self._here()
        due, _ = self._due(now)  # read outside the lock: the record's apply checks again
        t, names = self.table, self._names
        per: dict[int, list[str]] = {}
        for lid, pid in zip(due.tolist(), t.parent[due].tolist()):
            name = names[lid]
            if name is not None and pid >= 0:
                per.setdefault(pid, []).append(name)
        out: list[tuple[str, int, list[str]]] = []
        for pid, found in per.items():
            parent = self._parents_by_id[pid]
            if parent is None:
                continue
            out.extend((parent.name, seen, found[i : i + most]) for i in range(0, len(found), most))
        return out

    def _due(self, now: int) -> tuple[np.ndarray, np.ndarray]:
        """The ids of the live lite topics with no write for their parent's TTL at
        ``now`` (ms), and per id the last write time below which it is due."""
        t = self.table
        ttl = np.array(
            [p.ttl_ms if p is not None else 1 << 62 for p in self._parents_by_id] or [0],
            dtype=np.int64,
        )
        size = t.size
        parent = t.parent[:size]
        live = parent >= 0
        cutoff = np.full(size, -(1 << 62), dtype=np.int64)
        cutoff[live] = now - ttl[parent[live]]
        return np.flatnonzero(live & (t.last_ms[:size] < cutoff)), cutoff

    def _last_pos(self, lid: int) -> int:
        """The CommitLog offset of live lite topic ``lid``'s last write, or of the record
        that created it when it has no entry left (lock held)."""
        e = int(self.table.last[lid])
        f = self.index.file_of(e) if e >= 0 else None
        if f is None:
            return int(self.table.born[lid])
        return int(f.phys[e - f.start])

    def _apply_expire(self, op: dict[str, Any], at: int) -> dict[str, Any]:
        """An ``expire`` record at ``at`` (lock held): the lite topics it names that were
        neither written nor created at or after its ``seen`` are deleted; the change
        as the listener sees it (only the names deleted)."""
        p = self._parents.get(op["parent"])
        seen = int(op["seen"])
        lids = []
        if p is not None:
            born = self.table.born
            for name in op["names"]:
                lid = self._ids.get(f"{p.pid}\x01{name}")
                if lid is not None and int(born[lid]) < seen and self._last_pos(lid) < seen:
                    lids.append(lid)
        if not lids:
            return dict(op, names=[])
        assert p is not None
        data, gone = self._unbind_many(np.asarray(lids, dtype=np.int64), at)
        self._names_log.write(data)
        self._names_log.count(len(lids))
        return dict(op, names=gone.get(p.pid, []))

    def _died(self, key: str, at: int) -> None:
        """The live lite topic ``key`` is deleted at ``at`` (lock held): kept while a
        replay may ask."""
        deaths = self._deaths
        if deaths is not None:
            deaths[key] = max(deaths.get(key, NOWHERE), at)

    def _here(self) -> int:
        """Where this store stands in the CommitLog (lock held): in a Raft group, the end
        of the records applied; elsewhere (no state record to order against) the
        index's end too."""
        if self._committed_end is not None:
            return self._covered
        return max(self._covered, self._index_covered())

    def _forget_name(self, lid: int, pid: int) -> None:
        """Take live lite topic ``lid`` (of parent ``pid``) out of the names and its
        parent's count (lock held); its table row is the caller's to clear."""
        parent = self._parents_by_id[pid]
        assert parent is not None
        name = self._names[lid]
        self._names[lid] = None
        del self._ids[f"{pid}\x01{name}"]
        parent.count -= 1
        if parent.sorted_names is not None:
            parent.sorted_names.remove(name)

    def _unbind(self, lid: int) -> None:
        t = self.table
        self._forget_name(lid, int(t.parent[lid]))
        t.parent[lid] = -1
        t.last[lid] = -1
        t.next_off[lid] = 0

    def clean_expired_files(self) -> int:
        """Delete the index files the CommitLog's expiry emptied; return how many."""
        with self._lock:
            return self.index.delete_below(self.store.commitlog.min_offset)

    # ------------------------------------------------------------ recovery
    def catch_up(self) -> int:
        """Index the lite records of the CommitLog from ``covered`` to its dispatched end
        (after a crash; on a slave, after replicated bytes), in a Raft group no further
        than its committed end, and apply the consumer state records among them
        (:mod:`storage.lite.state`); return how many lite records it indexed."""
        with self._lock:
            return self._catch_up(self._catch_up_end())

    def _catch_up(self, end: int) -> int:
        """:meth:`catch_up` to ``end`` (lock held); lite records the index holds (below
        its end at open) are skipped, the state records among them applied. Outside a
        Raft group (no state record) it starts at the index's end at least: a master's
        own puts indexed past the records caught up are not indexed twice."""
        start = max(self._here(), self.store.commitlog.min_offset)
        indexed = self._indexed_below
        found = 0
        batch: list[tuple[str, str, int, int, int]] = []
        for topic, name, phys, size, ts, op in _lite_records(self.store, start, end):
            if op is not None:  # in CommitLog order: the records before it first
                found += self._index_found(batch)
                batch = []
                self._apply_state(op, phys, phys + size, ts)
                continue
            if phys < indexed:
                continue
            batch.append((topic, name, phys, size, ts))
            if len(batch) >= 4096:
                found += self._index_found(batch)
                batch = []
        if batch:
            found += self._index_found(batch)
        self._covered = max(self._covered, end)
        if self._deaths is not None and self._covered > self._names_at:
            self._deaths = None  # past every record ``names`` knew of: nothing to replay
        return found

    def state_changes(self, start: int) -> list[tuple[int, dict[str, Any]]]:
        """The consumer state changes this store applied from CommitLog offset ``start``
        on (those the CommitLog still holds): ``(where its record ends, change)`` each,
        in order; a listener that saved its state at ``start`` replays them."""
        with self._lock:
            start = max(start, self.store.commitlog.min_offset)
            return [
                (phys + size, op)
                for _, _, phys, size, _, op in _lite_records(self.store, start, self._covered)
                if op is not None
            ]

    def _apply_state(self, op: dict[str, Any], at: int, end: int, ts: int) -> None:
        """A committed consumer state change, its record at ``at`` stored at ``ts`` (ms;
        lock held): offsets, deletes, expiries and the lite topics a subscription
        creates here, then the listener. Applied again after a crash, it changes only
        the lite topics it meant (the module's docstring says how they are told)."""
        kind = op["op"]
        if kind == "expire":
            op = self._apply_expire(op, at)
        elif kind == "subscribe":
            if op["action"] != "remove":
                p = self._parent_of_record(op["parent"])
                keys = [f"{p.pid}\x01{n}" for n in dict.fromkeys(op["names"])]
                deaths = self._deaths or {}
                # accepted by the leader within the quota: created past any quota here;
                # not again if it was gone since (a replay)
                new = [k for k in keys if k not in self._ids and deaths.get(k, NOWHERE) <= at]
                # the record's time, not this member's clock: every member expires them
                # alike
                self._bind_many(p, new, ts, at)
        elif kind in ("commit", "delete"):
            known = self._parents.get(op["parent"])
            lid = None if known is None else self._ids.get(f"{known.pid}\x01{op['lite']}")
            if known is None or lid is None:
                pass  # deleted or expired since: nothing to change
            elif int(self.table.born[lid]) >= at:
                pass  # created again after this record (a replay): not the topic it meant
            elif kind == "delete":
                self._delete(known, op["lite"], at)
            else:
                offset = min(int(op["offset"]), int(self.table.next_off[lid]))
                self.offsets.commit(op["group"], lid, int(self.table.gen[lid]), offset)
        listener = self.state_listener
        if listener is not None:
            self.state_at = end
            listener(op)

    def _parent_of_record(self, topic: str) -> _Parent:
        """The parent a replicated record names, declared (default quota and TTL) if this
        store never was told of it."""
        p = self._parents.get(topic)
        if p is None:
            pid = len(self._parents_by_id)
            self._names_log.write(encode(PARENT, pid, 0, pid, topic))
            p = self._set_parent(pid, topic, self.config.default_quota, self.config.default_ttl_ms)
        return p

    def _index_found(self, found: list[tuple[str, str, int, int, int]]) -> int:
        n = 0
        for topic, name, phys, size, ts in found:
            p = self._parent_of_record(topic)
            key = f"{p.pid}\x01{name}"
            if key not in self._ids:
                deaths = self._deaths
                if deaths and deaths.get(key, NOWHERE) > phys:
                    # at open, a record of a topic ``names`` says was deleted after it (a
                    # power loss took the index entries, not the delete): it stays deleted,
                    # not created again from its own late records
                    continue
                self._bind_many(p, [key], ts, phys)  # stored and acknowledged: past any quota
            lid = self._ids[key]
            self._index(
                np.array([lid], dtype=np.int64),
                np.array([phys], dtype=np.int64),
                np.array([size], dtype=np.int32),
                ts,
            )
            n += 1
        return n

    # ------------------------------------------------------------ upkeep thread
    def start(self, following: Callable[[], bool] | None = None) -> None:
        """Start the upkeep thread: a flush every ``flush_interval_ms``, an expiry pass
        and the index files' clean-up every ``expire_interval_ms``; and, while
        ``following()`` is true (a slave's store, fed the master's CommitLog bytes),
        :meth:`catch_up` before each flush."""
        if self._upkeep is not None:
            return
        self._following = following
        self._stop.clear()
        self._upkeep = threading.Thread(target=self._run, name="lite-upkeep", daemon=True)
        self._upkeep.start()

    def _run(self) -> None:
        flush_s = self.config.flush_interval_ms / 1000
        expire_s = self.config.expire_interval_ms / 1000
        next_expire = time.monotonic() + expire_s
        while not self._stop.wait(flush_s):
            try:
                if self._following is not None and self._following():
                    self.catch_up()
                self.flush()
                if time.monotonic() >= next_expire:
                    next_expire = time.monotonic() + expire_s
                    if self._committed_end is None:  # a Raft group's leader proposes it
                        self.expire()
                    self.clean_expired_files()
            except StoreClosedError:
                return
            except Exception:
                log.exception("lite store %s: upkeep failed; retried at the next turn", self.root)

    def _stop_upkeep(self) -> None:
        thread, self._upkeep = self._upkeep, None
        if thread is not None:
            self._stop.set()
            thread.join()

    # ------------------------------------------------------------ durability
    def flush(self) -> None:
        """Names, then index entries, then the consumer offsets committed since the last
        flush, then the checkpoint of what they cover: on disk when it returns. The
        upkeep thread calls it every ``flush_interval_ms``, the broker at each persist
        and at a clean stop; one runs at a time, so offsets are written in the order
        they were taken."""
        with self._flushing:
            with self._lock:
                if self._closed:
                    return
                covered = self._here()  # every state record below it applied
                deletes = self._deletes_written  # on disk once names is fsynced below
                state = (covered, self.index.end, self._names_log.records)
                offsets = self.offsets.snapshot()  # None: no commit since the last one
                if state == self._flushed_state and offsets is None:
                    return  # nothing new since the last flush
            try:
                self._names_log.flush()
                with self._lock:
                    self._deletes_synced = max(self._deletes_synced, deletes)
                self.index.flush()
                if offsets is not None:  # before the checkpoint: the state records it covers
                    self.offsets.write(offsets)
                self._write_checkpoint(covered)
            except BaseException:
                if offsets is not None:
                    self.offsets.changed = True  # written again at the next flush
                raise
            self._flushed_state = state

    def close(self) -> None:
        if self._closed:
            return
        self._stop_upkeep()
        self.flush()
        with self._lock:
            self._closed = True
            self._names_log.close()
            self.index.close()

    def __enter__(self) -> LiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"lite store {self.root} is closed")

    def stats(self) -> dict[str, int]:
        return {
            "lite_topics": len(self._ids),
            "lite_parents": len(self._parents),
            "lite_index_entries": self.index.end - self.index.min_entry,
            "lite_index_files": len(self.index.files),
            "lite_table_bytes": self.table.memory_bytes(),
        }


_EMPTY = np.empty(0, dtype=np.int64)
_ONE = np.zeros(1, dtype=np.int64)
_EMPTY32 = np.empty(0, dtype=np.int32)


def _prop(props: bytes, prefix: bytes) -> str | None:
    """The value of the property ``prefix`` names in a record's raw properties, or None."""
    at = props.find(prefix)
    while at > 0 and props[at - 1] != 2:  # the end of another property's name
        at = props.find(prefix, at + 1)
    if at < 0:
        return None
    value_at = at + len(prefix)
    value_end = props.find(b"\x02", value_at)
    return props[value_at : value_end if value_end >= 0 else len(props)].decode("utf-8", "replace")


def _lite_name(props: bytes) -> str | None:
    """The ``__LITE_TOPIC`` value in a record's raw properties, or None."""
    return _prop(props, _LITE_PROP)


def lite_names(data: bytes | memoryview) -> list[str]:
    """The lite topic each record of ``data`` (records back to back) names; a record
    naming none is left out (the caller compares the counts)."""
    out = []
    pos, n = 0, len(data)
    unpack = _HEAD.unpack_from
    while pos + codec.FIXED_LEN <= n:
        size, _, _, _, body_len = unpack(data, pos)
        if size < codec.FIXED_LEN:
            break
        t = pos + codec.HEADER.size + body_len
        p = t + 1 + data[t]
        plen = (data[p] << 8) | data[p + 1]
        if plen:
            name = _lite_name(bytes(data[p + 2 : p + 2 + plen]))
            if name is not None:
                out.append(name)
        pos += size
    return out


def _lite_records(
    store: MessageStore, start: int, end: int
) -> Iterable[tuple[str, str, int, int, int, dict[str, Any] | None]]:
    """(topic, lite topic, CommitLog offset, size, store time, None) of each record in
    ``[start, end)`` with a ``__LITE_TOPIC`` property (headers and properties only), and
    (topic, "", offset, size, store time, change) of each consumer state record."""
    for buf, base, rel, size, t, props in records_with_properties(store.commitlog, start, end):
        name = _lite_name(props)
        if name is not None:
            store_ms = _HEAD.unpack_from(buf, rel)[3]
            topic = bytes(buf[t + 1 : t + 1 + buf[t]]).decode("utf-8", "replace")
            yield topic, name, base + rel, size, store_ms, None
        elif _prop(props, _STATE_PROP) is not None:
            _, _, _, store_ms, body_len = _HEAD.unpack_from(buf, rel)
            topic = bytes(buf[t + 1 : t + 1 + buf[t]]).decode("utf-8", "replace")
            op = decode_state(bytes(buf[t - body_len : t])) if topic == STATE_TOPIC else None
            if op is not None:
                yield topic, "", base + rel, size, store_ms, op
