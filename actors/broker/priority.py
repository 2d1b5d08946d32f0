"""Run the broker's process at a server's priority, not at the one Ray gives its workers.

Ray's raylet starts every worker process at nice 15 (its ``worker_niceness``), so that
tasks yield the CPU to its own daemons. Under the kernel's fair scheduler a thread at
nice 15 weighs 36 against 1,024 at nice 0: while anything at nice 0 runs on a busy node
(a producer, a driver, Ray's daemons, another service), a broker woken by a request
waits for it. Measured with ``benchmarks/steady_load.py`` at 1,000 msg/s on two cores,
Ray's workers at nice 15 gave p99 2.2–2.9 ms and p99.9 5.9–9.3 ms; at nice 0, 1.4–2.0
and 3.1–4.5, in alternated runs (``docs/latency.md``). A Ray that RayMQ starts runs its
workers at 0; in another, the broker lowers its own process with :func:`take_priority`.

It sets the threads of the process that run at the process's niceness (Linux keeps one
per thread; the actor's threads exist before its ``__init__`` runs, and the threads made
afterwards take their creator's), and leaves alone those set apart (a thread Ray or
RayMQ put lower on purpose). It only lowers: a process already at or below the niceness
asked keeps its own. Lowering needs ``CAP_SYS_NICE`` (root has it) or an
``RLIMIT_NICE`` that allows it: without either the process keeps Ray's, and the refusal
is logged with what would lift it.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("raymq.actors.priority")


def thread_ids() -> list[int]:
    """The ids of this process's threads (the process id alone where ``/proc`` is not)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{os.getpid()}/task")]
    except OSError:
        return [os.getpid()]


def take_priority(nice: int | None, what: str) -> int:
    """Lower this process to ``nice`` where it runs above it (None: change nothing); the
    niceness the calling thread has afterwards. A refusal (no privilege to lower it)
    leaves the process as it was and is logged as a warning naming ``what``."""
    now = os.getpriority(os.PRIO_PROCESS, 0)
    if nice is None or now <= nice:
        return now
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)  # this thread first: refused here, none
    except PermissionError:
        log.warning(
            "%s runs at nice %d (Ray's worker_niceness), not %d: lowering it needs "
            "CAP_SYS_NICE or an RLIMIT_NICE that allows it. Its messages then wait while "
            "processes at a lower niceness run; start Ray with RAY_worker_niceness=%d to "
            "lift that for every worker",
            what,
            now,
            nice,
            nice,
        )
        return now
    moved = 1
    for tid in thread_ids():
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) == now:  # not one set apart
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                moved += 1
        except (ProcessLookupError, PermissionError):  # the thread ended meanwhile
            continue
    log.debug("%s: nice %d -> %d (%d threads)", what, now, nice, moved)
    return os.getpriority(os.PRIO_PROCESS, 0)
