"""The README's main command with ``--console``, as a new user runs it: the quickstart's
job, then the console's URL printed, and on its pages a message found by key, the audit
group's page, and its dead letter (issue #26's "done when"). Its own process and its own
local Ray, as on a fresh machine; Ctrl-C (SIGINT) ends it cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - a test's own console
        return str(response.read().decode("utf-8"))


def test_the_quickstart_prints_a_console_url_showing_its_orders_group_and_dead_letter() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "examples" / "quickstart.py"),
            "--messages",
            "2000",
            "--console",
            "--console-port",
            "0",
        ],
        cwd=str(ROOT),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break  # the process ended before it printed the URL
            lines.append(line)
            if line.startswith("console: "):
                url = line.split()[1]
        assert url is not None, "no console URL printed:\n" + "".join(lines)
        assert any("every message arrived exactly once" in x for x in lines), lines
        found = _get(f"{url}messages?topic=QuickStart&key=order-7")
        assert "&quot;order&quot;: 7" in found or '"order": 7' in found, found[-2000:]
        group = _get(f"{url}groups/quickstart-audit")
        assert "quickstart-audit" in group
        letters = _get(f"{url}dlq?group=quickstart-audit")
        assert "order-13" in letters, letters[-2000:]
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the cluster shuts down, exit 0
        assert proc.wait(timeout=120) == 0, "".join(lines) + proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
