"""What a fault run's history says: Jepsen's counts for a queue of unique messages.

A history is the workload's operations (each a send of some unique bodies, with when it
was invoked, when it completed and how: ``SEND_OK``, another send status, or an
exception's name) and what was read back from every queue after the faults healed.
An acknowledged body must be read exactly once; a body whose send failed or timed out
is indeterminate, so reading it zero times or once is fine, twice is a duplicate too.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

ACK = "SEND_OK"
ABORTED = "ABORTED"
OUTAGE_GAP_S = 1.0
"""Two acknowledgements further apart than this (the workload paces its sends a few
tens of milliseconds apart) count the time between them as unavailable."""


@dataclass(frozen=True)
class Op:
    """One send: its bodies, its invoke and complete times (monotonic s) and outcome."""

    bodies: tuple[str, ...]
    invoked: float
    completed: float
    outcome: str

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Op:
        return cls(tuple(raw["bodies"]), raw["invoked"], raw["completed"], raw["outcome"])

    def to_json(self) -> dict[str, Any]:
        return {
            "bodies": list(self.bodies),
            "invoked": self.invoked,
            "completed": self.completed,
            "outcome": self.outcome,
        }


@dataclass
class Verdict:
    """The counts of one run, and the bodies behind the bad ones."""

    ops: int
    messages: int
    acknowledged: int
    read: int
    lost: list[str]
    duplicated: list[str]  # read more than once (acknowledged or not)
    unexpected: list[str]  # read, never sent
    failures: dict[str, int]  # outcome -> ops, every outcome but SEND_OK
    unavailable_s: float
    longest_outage_s: float
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected)

    HEADER = (
        f"{'schedule':<28} {'ops':>6} {'acked':>7} {'lost':>5} {'dup':>5} "
        f"{'unavail s':>9} {'longest s':>9}  failures"
    )

    def row(self, schedule: str) -> str:
        failures = ", ".join(f"{k}={v}" for k, v in sorted(self.failures.items())) or "-"
        return (
            f"{schedule:<28} {self.ops:>6} {self.acknowledged:>7} {len(self.lost):>5} "
            f"{len(self.duplicated):>5} {self.unavailable_s:>9.1f} "
            f"{self.longest_outage_s:>9.1f}  {failures}"
        )


def check(ops: Sequence[Op], read: Iterable[str]) -> Verdict:
    """Jepsen's verdict on a queue of unique messages."""
    copies = Counter(read)
    sent = {b for op in ops for b in op.bodies}
    acked = [b for op in ops if op.outcome == ACK for b in op.bodies]
    acks = sorted(op.completed for op in ops if op.outcome == ACK)
    gaps = [later - earlier for earlier, later in zip(acks, acks[1:])]
    if ops and acks:  # before the first and after the last acknowledgement too
        gaps += [acks[0] - min(op.invoked for op in ops), max(o.completed for o in ops) - acks[-1]]
    elif ops:  # nothing acknowledged: the whole run was an outage
        gaps = [max(op.completed for op in ops) - min(op.invoked for op in ops)]
    outages = [g for g in gaps if g > OUTAGE_GAP_S]
    return Verdict(
        ops=len(ops),
        messages=len(sent),
        acknowledged=len(acked),
        read=sum(copies.values()),
        lost=sorted(b for b in acked if copies[b] == 0),
        duplicated=sorted(b for b, n in copies.items() if n > 1),
        unexpected=sorted(b for b in copies if b not in sent),
        failures=dict(Counter(op.outcome for op in ops if op.outcome != ACK)),
        unavailable_s=sum(outages),
        longest_outage_s=max(outages, default=0.0),
    )


def torn_transactions(txns: Sequence[Op], read: Iterable[str]) -> list[str]:
    """Transactions read back in part: each of ``txns`` is one transaction (its bodies,
    its outcome: ``SEND_OK`` for a commit that was answered, ``ABORTED`` for one the
    producer aborted, an exception's name for one whose end is unknown). A commit must
    be read whole, an abort not at all, an unknown end whole or not at all."""
    copies = Counter(read)
    torn = []
    for txn in txns:
        seen = sum(1 for b in txn.bodies if copies[b])
        whole = seen == len(txn.bodies)
        if txn.outcome == ACK:
            ok = whole
        elif txn.outcome == ABORTED:
            ok = seen == 0
        else:
            ok = whole or seen == 0
        if not ok:
            torn.append(f"{txn.bodies[0]}..: {txn.outcome}, {seen} of {len(txn.bodies)} read")
    return torn


@dataclass(frozen=True)
class Look:
    """What one broker member said of itself at ``t`` (monotonic s): its host (the IP its
    store writes into message ids), whether it took writes (master or Raft leader, not
    fenced) and its epoch (the Raft term, or the master epoch of a master/slave group)."""

    t: float
    member: str
    host: str
    leads: bool
    epoch: int


@dataclass(frozen=True)
class Write:
    """An acknowledged write: the queue (``broker:queue_id``), the host that wrote it and
    when its send was invoked and answered."""

    queue: str
    host: str
    invoked: float
    completed: float


def split_brains(writes: Sequence[Write], history: Sequence[Look]) -> list[str]:
    """Two brokers acknowledging writes for one queue in overlapping time.

    Each write is given the epoch its host led in at the time: the role history is a
    list of changes, so each of a host's looks in which it led opens a stretch of
    leading, (epoch, from, until its next look), and a write belongs to the stretch it
    was answered in, else to the nearest one (the history is sampled, so
    a stretch is seen to start a little late); no stretch: epoch -1. The writes of one
    queue are grouped into tenures, (host, epoch) -> [first, last] answer. A tenure of one
    host overlapping a tenure of another on the same queue is a split brain: both took
    that queue's writes at once. A host that leads again later, in a newer epoch, starts
    a new tenure, so a failover and a failback are not one."""
    by_host: dict[str, list[Look]] = {}
    for look in sorted(history, key=lambda x: x.t):
        by_host.setdefault(look.host, []).append(look)
    stretches: dict[str, list[tuple[float, float, int]]] = {}
    for host, looks in by_host.items():
        for i, look in enumerate(looks):
            if look.leads:
                until = looks[i + 1].t if i + 1 < len(looks) else math.inf
                stretches.setdefault(host, []).append((look.t, until, look.epoch))

    def epoch_of(w: Write) -> int:
        def distance(stretch: tuple[float, float, int]) -> float:
            start, until, _ = stretch
            return max(start - w.completed, w.completed - until, 0.0)

        found = stretches.get(w.host)
        return min(found, key=distance)[2] if found else -1

    tenures: dict[tuple[str, str, int], list[float]] = {}
    for w in writes:
        span = tenures.setdefault((w.queue, w.host, epoch_of(w)), [w.invoked, w.completed])
        span[0], span[1] = min(span[0], w.invoked), max(span[1], w.completed)
    found = []
    keys = sorted(tenures)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            if a[0] != b[0] or a[1] == b[1]:
                continue
            (a0, a1), (b0, b1) = tenures[a], tenures[b]
            if a0 < b1 and b0 < a1:
                found.append(
                    f"{a[0]}: {a[1]} (epoch {a[2]}) {a0:.2f}-{a1:.2f} and "
                    f"{b[1]} (epoch {b[2]}) {b0:.2f}-{b1:.2f}"
                )
    return found


def offsets_moved_back(
    looks: Sequence[tuple[str, int, float]], excused: Callable[[str, float, float], bool]
) -> tuple[list[str], list[str]]:
    """A consumer group's committed offsets read back, ``(queue, offset, when)``, that are
    lower than one read before on the same queue: (violations, excused). ``excused(queue,
    high_at, low_at)`` says whether a fault between the two looks allows it (a failover to
    a member that had not copied the latest commits; a power loss of a broker that does
    not fsync them)."""
    seen: dict[str, list[tuple[float, int]]] = {}
    for queue, offset, t in looks:
        seen.setdefault(queue, []).append((t, offset))
    bad, allowed = [], []
    for queue, series in sorted(seen.items()):
        high, high_at = -1, 0.0
        for t, offset in sorted(series):
            if offset < high:
                what = f"{queue}: {high} at {high_at:.1f} -> {offset} at {t:.1f}"
                (allowed if excused(queue, high_at, t) else bad).append(what)
            if offset > high:
                high, high_at = offset, t
    return bad, allowed
