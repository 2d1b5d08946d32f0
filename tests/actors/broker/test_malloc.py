"""actors/broker/memory.py: a process that frees large buffers keeps their pages."""

from __future__ import annotations

import subprocess
import sys

import pytest
from raymq_testkit import CHURN

from actors.broker.memory import retain_freed_memory

_IN_A_THREAD = """
import sys, threading
sys.path[:0] = {paths!r}
from actors.broker.memory import retain_freed_memory
exec({churn!r})
if {retain}:
    assert retain_freed_memory(256 << 20)
out = []
worker = threading.Thread(target=lambda: out.append(churn()))  # an actor's loop is a thread
worker.start()
worker.join()
print(*out[0])
"""


def _churn_in_a_fresh_process(retain: bool) -> list[int]:
    code = _IN_A_THREAD.format(paths=sys.path, churn=CHURN, retain=retain)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [int(f) for f in out.stdout.split()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc")
def test_freed_pages_are_kept_for_the_next_round() -> None:
    pages = 3 * (6 << 20) // 4096
    default = _churn_in_a_fresh_process(retain=False)
    assert min(default[1:]) > pages // 2, default  # glibc gives them back every round
    kept = _churn_in_a_fresh_process(retain=True)
    assert kept[0] > pages // 2 and max(kept[1:]) < 100, kept


def test_zero_leaves_the_defaults_and_bad_thresholds_are_refused() -> None:
    assert retain_freed_memory(0) is False
    with pytest.raises(ValueError, match="mmap_threshold"):
        retain_freed_memory(256 << 20, mmap_threshold=64 << 20)
