"""Keep the memory a broker frees for its next call instead of handing it to the kernel.

A broker answers a pull of 4 queues x 4096 records with ~4 MB of buffers (the records
read out of the CommitLog, the joined answer) and frees them when Ray has copied the
answer out. glibc serves such sizes from ``mmap`` (the first times) or from the arena of
the actor's event-loop thread, and trims that arena's top as soon as more than a few MB
of it are free: ``madvise(MADV_DONTNEED)`` gives the pages back, and the next pull faults
every one of them in again, zeroed and charged to the cgroup. Measured with
``perf``, those faults were a quarter of the broker's CPU when consumers pulled
4 x 4096: ~1 000 minor faults a pull, 0.44 us a message, against 0.29 with them gone.

:func:`retain_freed_memory` fixes glibc's thresholds for the process: allocations up to
``mmap_threshold`` come from the arenas, and an arena gives memory back only when more than
``trim_threshold`` of it is free at the top. A broker's heap so stays at its working set
instead of shrinking and faulting back after every large call. Elsewhere than glibc
(musl, macOS) there is no ``mallopt`` and nothing is changed.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("raymq.actors.malloc")

# mallopt(3) parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit


def retain_freed_memory(trim_threshold: int, mmap_threshold: int = _MMAP_THRESHOLD_MAX) -> bool:
    """Set glibc's trim and mmap thresholds for this process; False (and nothing changed)
    where the C library has no ``mallopt`` or refuses the values. ``trim_threshold=0``
    leaves glibc's defaults alone."""
    if trim_threshold <= 0:
        return False
    if not 0 < mmap_threshold <= _MMAP_THRESHOLD_MAX:
        raise ValueError(f"mmap_threshold={mmap_threshold}: must be in 1..{_MMAP_THRESHOLD_MAX}")
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        log.debug("no mallopt in this C library: freed memory is handled as it chooses")
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # the mmap threshold first: setting either one stops glibc's own adjusting of both
    if not (
        mallopt(_M_MMAP_THRESHOLD, mmap_threshold) and mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    ):
        log.warning("mallopt refused trim=%d mmap=%d", trim_threshold, mmap_threshold)
        return False
    log.debug(
        "malloc keeps up to %d freed bytes an arena (mmap above %d)", trim_threshold, mmap_threshold
    )
    return True
