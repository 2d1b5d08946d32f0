"""A child Python process the storage tests SIGKILL at a chosen moment: a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

STORAGE_TESTS = str(Path(__file__).resolve().parent)
"""tests/storage, for a child to put on its path (its ``store_sizes``)."""


def run_until_killed(code: str, *args: str, ready: str) -> None:
    """Run ``python -c code args...``, wait until it prints the line ``ready``, then
    SIGKILL it. The child blocks on its stdin after that line (``sys.stdin.read()``):
    nothing ends it but the kill, or this process's end closing the pipe."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == ready
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
