"""What a fault run's history says: Jepsen's counts for a queue of unique messages.

A history is the workload's operations (each a send of some unique bodies, with when it
was invoked, when it completed and how: ``SEND_OK``, another send status, or an
exception's name) and what was read back from every queue after the faults healed.
An acknowledged body must be read exactly once; a body whose send failed or timed out
is indeterminate, so reading it zero times or once is fine, twice is a duplicate too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

ACK = "SEND_OK"
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
