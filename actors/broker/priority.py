"""Run the broker's process at a server's priority, not at the one Ray gives its workers.

Ray's raylet starts every worker process at nice 15 (its ``worker_niceness``), so that
tasks yield the CPU to its own daemons. Under the kernel's fair scheduler a thread at
nice 15 weighs 36 against 1,024 at nice 0: while anything at nice 0 runs on a busy node
(a producer, a driver, Ray's daemons, another service), a broker woken by a request
waits for it to finish its slice. Measured with ``benchmarks/steady_load.py`` at 1,000
msg/s on two cores, the broker and its consumer at nice 15 gave p99 2.2–2.6 ms and
p99.9 6.7–9.3 ms; at nice 0, 1.6 ms and 3.5–3.7 ms, in alternated runs.

:func:`take_priority` sets the niceness of every thread of the process (Linux keeps a
niceness per thread, and the actor's threads exist before its ``__init__`` runs; the
threads made afterwards take their creator's). Lowering a niceness needs
``CAP_SYS_NICE`` (root has it) or an ``RLIMIT_NICE`` that allows it: without either the
process keeps Ray's, and the refusal is logged once with what would lift it.
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
    """Set every thread of this process to ``nice`` (None: change nothing); the
    niceness the calling thread has afterwards. A refusal (no privilege to lower it)
    leaves the process as it was and is logged as a warning naming ``what``."""
    now = os.getpriority(os.PRIO_PROCESS, 0)
    if nice is None or nice == now:
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
    me = os.getpid()
    for tid in thread_ids():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except (ProcessLookupError, PermissionError):  # the thread ended meanwhile
            continue
    log.debug("%s: nice %d -> %d (%d threads of %d)", what, now, nice, len(thread_ids()), me)
    return os.getpriority(os.PRIO_PROCESS, 0)
