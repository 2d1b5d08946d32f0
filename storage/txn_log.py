"""The transaction coordinator's durable log: multi-message transactions' states.

The coordinator (``actors.coordinator.txn``) decides each multi-message transaction
and must remember its decision across its own crash before any broker acts on it
(two-phase commit). This module is that memory, knowing nothing of Ray: a file of
JSON lines, ``txn.log`` in the coordinator's directory, each appended record fsynced
before :meth:`TransactionLog.append` returns (when asked to sync), replayed at start.

Records (``op``):

* ``epoch``: a ``transactional_id`` now belongs to ``(producer id, epoch)``: a new
  producer instance took it over (the fence); ``instance`` names that instance (the
  token it asks with), so that its repeated asks answer the epoch it was given;
* ``begin``: transaction ``txn`` of ``(tid, epoch)`` has half messages on ``brokers``
  (written before the producer sends there, so a transaction with half messages is
  always known; later ``begin`` records of the same ``txn`` add brokers);
* ``decide``: ``commit`` true or false, with the half messages per broker
  (``halves``: their CommitLog offsets, or the message id of one whose offset its
  sender did not learn; ``null`` for a broker that is to take every pending half of
  the transaction) and the consumer offsets to commit with it
  (``offsets``: broker -> group -> ``[[topic, queue id, offset], ...]``);
* ``done``: every participant applied the decision.

A torn last line (a crash during a write) is dropped at replay: its record was never
acknowledged. :meth:`compact` rewrites the file with only what is still needed (the
epochs and the last :data:`KEEP_INSTANCES` instances of each id, open and undecided-applied transactions, and done ones younger than
``keep_done_ms``, so a late question about them is still answered right), atomically.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .atomic_file import write_atomically
from .errors import InvalidConfigError, StoreCorruptedError

log = logging.getLogger("raymq.storage.txn_log")

KEEP_INSTANCES = 16
"""Instances of a ``transactional_id`` remembered with their epochs (the latest ones):
an older instance's repeated ask is still known as fenced, not taken for a new one."""

OPEN = "open"
COMMIT = "commit"
ABORT = "abort"

Offsets = dict[str, dict[str, list[tuple[str, int, int]]]]
"""Consumer offsets a transaction commits: broker name -> group -> [(topic, queue id, offset)]."""


@dataclass
class TxnRecord:
    txn_id: str
    tid: str
    epoch: int
    state: str = OPEN
    done: bool = False
    brokers: set[str] = field(default_factory=set)
    halves: dict[str, list[int | str] | None] = field(default_factory=dict)
    offsets: Offsets = field(default_factory=dict)
    started_ms: int = 0
    decided_ms: int = 0

    def participants(self) -> set[str]:
        return self.brokers | set(self.halves) | set(self.offsets)


@dataclass
class ProducerEpoch:
    producer_id: str
    epoch: int
    instance: str = ""  # the instance that holds ``epoch`` ("" where not named)


class TransactionLog:
    """The coordinator's state (:attr:`producers`, :attr:`txns`) and the file it lives in."""

    FILE = "txn.log"

    def __init__(self, directory: str | Path, clock: Any = time.time) -> None:
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidConfigError(f"transaction log directory {self.dir}: {exc}") from exc
        self.path = self.dir / self.FILE
        self._clock = clock
        self.producers: dict[str, ProducerEpoch] = {}
        # transactional id -> instance token -> the epoch that instance was given (the
        # last KEEP_INSTANCES of each id, oldest first)
        self.instances: dict[str, dict[str, int]] = {}
        self.txns: dict[str, TxnRecord] = {}
        # decided and not done yet, in the order they were decided: what the coordinator
        # still has to apply (kept here so its rounds need not walk every transaction)
        self.undone: dict[str, None] = {}
        self.records = 0  # lines in the file
        self.compacted = 0  # lines the last compaction wrote: what was still needed then
        self._replay()
        self._file = open(self.path, "ab")  # noqa: SIM115 - kept open for appends

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # ------------------------------------------------------------ replay
    def _replay(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        good = 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # torn: never acknowledged
            try:
                record = json.loads(line)
                self._apply(record)
            except (ValueError, KeyError, TypeError) as exc:
                raise StoreCorruptedError(
                    f"{self.path}: record {self.records + 1} is damaged: {exc}"
                ) from exc
            good += len(line)
            self.records += 1
        if good < len(data):
            log.warning("%s: a torn last record (%d bytes) dropped", self.path, len(data) - good)
            with open(self.path, "r+b") as f:
                f.truncate(good)
        log.info(
            "transaction log %s: %d records, %d producers, %d transactions not done",
            self.path,
            self.records,
            len(self.producers),
            sum(not t.done for t in self.txns.values()),
        )

    def _apply(self, r: dict[str, Any]) -> None:
        op = r["op"]
        if op == "epoch":
            tid, epoch, instance = r["tid"], int(r["epoch"]), str(r.get("instance", ""))
            self.producers[tid] = ProducerEpoch(str(r["pid"]), epoch, instance)
            if instance:
                known = self.instances.setdefault(tid, {})
                known[instance] = epoch
                while len(known) > KEEP_INSTANCES:
                    del known[next(iter(known))]
        elif op == "begin":
            txn = self.txns.get(r["txn"])
            if txn is None:
                txn = self.txns[r["txn"]] = TxnRecord(
                    r["txn"], r["tid"], int(r["epoch"]), started_ms=int(r["at"])
                )
            txn.brokers.update(r["brokers"])
        elif op == "decide":
            txn = self.txns.get(r["txn"])
            if txn is None:
                txn = self.txns[r["txn"]] = TxnRecord(
                    r["txn"], r["tid"], int(r["epoch"]), started_ms=int(r["at"])
                )
            txn.state = COMMIT if r["commit"] else ABORT
            txn.halves = {b: (None if h is None else list(h)) for b, h in r["halves"].items()}
            txn.offsets = {
                b: {g: [(str(t), int(q), int(o)) for t, q, o in qs] for g, qs in groups.items()}
                for b, groups in r["offsets"].items()
            }
            txn.brokers.update(r.get("brokers", ()))
            txn.decided_ms = int(r["at"])
            if not txn.done:
                self.undone[txn.txn_id] = None
        elif op == "done":
            txn = self.txns.get(r["txn"])
            if txn is not None:
                txn.done = True
                self.undone.pop(txn.txn_id, None)
        else:
            raise ValueError(f"unknown op {op!r}")

    # ------------------------------------------------------------ appends
    def append(self, record: dict[str, Any], sync: bool = True) -> None:
        """Apply ``record`` and write it; durable on return when ``sync``."""
        record.setdefault("at", self.now_ms())
        line = json.dumps(record, separators=(",", ":")).encode("utf-8") + b"\n"
        self._apply(record)
        self._file.write(line)
        self._file.flush()
        if sync:
            os.fsync(self._file.fileno())
        self.records += 1

    def set_epoch(self, tid: str, producer_id: str, epoch: int, instance: str = "") -> None:
        """``tid`` now belongs to ``epoch`` (of ``instance``, when named)."""
        record: dict[str, Any] = {"op": "epoch", "tid": tid, "pid": producer_id, "epoch": epoch}
        if instance:
            record["instance"] = instance
        self.append(record)

    def epoch_of_instance(self, tid: str, instance: str) -> int | None:
        """The epoch ``instance`` of ``tid`` was given; None when it was given none (or
        is older than the last :data:`KEEP_INSTANCES`)."""
        return self.instances.get(tid, {}).get(instance)

    def begin(self, txn: TxnRecord | tuple[str, str, int], brokers: set[str]) -> TxnRecord:
        if isinstance(txn, TxnRecord):
            txn_id, tid, epoch = txn.txn_id, txn.tid, txn.epoch
        else:
            txn_id, tid, epoch = txn
        self.append(
            {"op": "begin", "txn": txn_id, "tid": tid, "epoch": epoch, "brokers": sorted(brokers)}
        )
        return self.txns[txn_id]

    def decide(
        self,
        txn: TxnRecord,
        commit: bool,
        halves: dict[str, list[int | str] | None] | None = None,
        offsets: Offsets | None = None,
    ) -> None:
        self.append(
            {
                "op": "decide",
                "txn": txn.txn_id,
                "tid": txn.tid,
                "epoch": txn.epoch,
                "commit": commit,
                "brokers": sorted(txn.brokers),
                "halves": halves or {},
                "offsets": {
                    b: {g: [list(q) for q in qs] for g, qs in groups.items()}
                    for b, groups in (offsets or {}).items()
                },
            }
        )

    def done(self, txn: TxnRecord) -> None:
        """Not fsynced: a lost ``done`` only makes a restart apply the decision again."""
        self.append({"op": "done", "txn": txn.txn_id}, sync=False)

    # ------------------------------------------------------------ compaction
    def compaction_due(self, every: int) -> bool:
        """Whether the file grew enough to be rewritten: by ``every`` records since the
        last compaction, and by at least as many as that compaction wrote. A compaction
        that keeps much (every transaction done within ``keep_done_ms``: three lines
        each) is then not redone at once, round after round, and rewriting costs a
        bounded amount per record appended, whatever the rate."""
        return self.records - self.compacted >= max(every, self.compacted)

    def compact(self, keep_done_ms: int) -> int:
        """Rewrite the file with what is still needed; returns how many transactions
        were forgotten."""
        now = self.now_ms()
        forget = [
            t.txn_id
            for t in self.txns.values()
            if t.done and now - max(t.decided_ms, t.started_ms) > keep_done_ms
        ]
        for txn_id in forget:
            del self.txns[txn_id]
        lines: list[dict[str, Any]] = []
        for tid, p in self.producers.items():
            # the earlier instances first, the current one last: what replay rebuilds
            earlier = self.instances.get(tid, {})
            for instance, epoch in earlier.items():
                if instance != p.instance:
                    lines.append(
                        {"op": "epoch", "tid": tid, "pid": p.producer_id, "epoch": epoch}
                        | {"instance": instance, "at": now}
                    )
            current = {"op": "epoch", "tid": tid, "pid": p.producer_id, "epoch": p.epoch}
            lines.append(current | ({"instance": p.instance} if p.instance else {}) | {"at": now})
        for t in self.txns.values():
            lines.append(
                {
                    "op": "begin",
                    "txn": t.txn_id,
                    "tid": t.tid,
                    "epoch": t.epoch,
                    "brokers": sorted(t.brokers),
                    "at": t.started_ms,
                }
            )
            if t.state != OPEN:
                lines.append(
                    {
                        "op": "decide",
                        "txn": t.txn_id,
                        "tid": t.tid,
                        "epoch": t.epoch,
                        "commit": t.state == COMMIT,
                        "brokers": sorted(t.brokers),
                        "halves": t.halves,
                        "offsets": {
                            b: {g: [list(q) for q in qs] for g, qs in groups.items()}
                            for b, groups in t.offsets.items()
                        },
                        "at": t.decided_ms,
                    }
                )
            if t.done:
                lines.append({"op": "done", "txn": t.txn_id, "at": t.decided_ms})
        data = b"".join(json.dumps(r, separators=(",", ":")).encode("utf-8") + b"\n" for r in lines)
        write_atomically(self.path, data, tmp=self.path.with_suffix(".log.tmp"))
        self._file.close()  # the replaced file's: appends go to the new one
        self._file = open(self.path, "ab")  # noqa: SIM115
        self.records = self.compacted = len(lines)
        return len(forget)

    def close(self) -> None:
        self._file.close()
