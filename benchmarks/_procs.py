"""CPU time of this run's processes, read from ``/proc`` (Linux): what a benchmark
reports beside its figures to say what bounds them."""

from __future__ import annotations

import os

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def total_cpu_s(pid: int) -> float:
    user, system = cpu_s(pid)
    return user + system


def actor_pids(class_name: str) -> list[int]:
    """The pids of the live actors of ``class_name`` in this run's own Ray, from the
    GCS's actor table (the state API needs the dashboard, which the benchmarks leave
    off)."""
    from ray._private import state

    return sorted(
        int(row["Pid"])
        for row in state.actors().values()
        if row.get("ActorClassName") == class_name and row.get("State") == "ALIVE"
    )
