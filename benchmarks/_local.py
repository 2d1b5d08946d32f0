"""What the benchmarks share: a Ray of the run's own, and the CPU time of its
processes, read from ``/proc`` (Linux), which a benchmark reports beside its figures
to say what bounds them."""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

from actors.config.cluster import LOCAL_RAY_WORKER_NICENESS

TICK = os.sysconf("SC_CLK_TCK")


def start_local_ray(
    num_cpus: int = 2,
    runtime_env: dict[str, Any] | None = None,
    worker_niceness: int = LOCAL_RAY_WORKER_NICENESS,
) -> None:
    """A local Ray of this run's own (never another cluster on the machine), quiet: no
    dashboard, warnings only, workers' output not copied here. ``runtime_env``: its
    workers' (a setup hook, environment variables). Its workers run at
    ``worker_niceness``: 0, as in the Ray RayMQ starts itself, where Ray's default is 15."""
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=False,
        runtime_env=runtime_env,
        _system_config={"worker_niceness": worker_niceness},
    )


def cpu_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def run_wait_s(pid: int) -> float:
    """Seconds the threads of process ``pid`` alive now spent runnable but waiting for a
    core (the second field of each thread's ``/proc/.../schedstat``): what a message
    loses to the other processes and threads of the machine, where CPU time says what
    it costs. 0.0 where the kernel keeps no schedstat."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


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
