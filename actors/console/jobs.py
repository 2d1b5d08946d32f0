"""Long operations of the console (a bulk dead-letter resend, an offset reset over
many queues) run as jobs: started by a POST, run on the console's worker threads, and
followed by the browser on ``/jobs/<id>`` (a progress bar polling ``/jobs/<id>.json``).
Each job's start, end and failure are logged through ``raymq.actors.console``. The
console keeps the last ``MAX_JOBS`` jobs."""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from storage.errors import RayMQError

log = logging.getLogger("raymq.actors.console")

MAX_JOBS = 100
RUNNING, DONE, FAILED = "running", "done", "failed"

Progress = Callable[[int, int], None]
"""``progress(done, total)``: how far a job is."""


@dataclass
class Job:
    id: str
    kind: str
    what: str
    back: str
    """The page to go back to when it is done."""
    done: int = 0
    total: int = 0
    state: str = RUNNING
    message: str = ""
    started: float = field(default_factory=time.time)
    ended: float | None = None

    @property
    def percent(self) -> int:
        if self.state == DONE:
            return 100
        return int(100 * self.done / self.total) if self.total else 0

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "what": self.what,
            "back": self.back,
            "done": self.done,
            "total": self.total,
            "percent": self.percent,
            "state": self.state,
            "message": self.message,
            "started": self.started,
            "ended": self.ended,
        }


class Jobs:
    """The console's jobs, newest last (bounded)."""

    def __init__(self) -> None:
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def start(
        self,
        pool: Executor,
        kind: str,
        what: str,
        back: str,
        work: Callable[[Progress], str],
    ) -> Job:
        """Run ``work(progress)`` on ``pool``; what it returns is the job's message."""
        job = Job(secrets.token_hex(8), kind, what, back)
        with self._lock:
            self._jobs[job.id] = job
            while len(self._jobs) > MAX_JOBS:
                self._jobs.popitem(last=False)

        def progress(done: int, total: int) -> None:
            job.done, job.total = done, total

        def run() -> None:
            try:
                job.message = work(progress)
                job.state = DONE
                log.info("console: job %s (%s %s) done: %s", job.id, kind, what, job.message)
            except Exception as exc:  # noqa: BLE001 - the job's page says what failed
                job.message = f"{type(exc).__name__}: {exc}"
                job.state = FAILED
                if isinstance(exc, RayMQError):
                    log.warning("console: job %s (%s %s) failed: %s", job.id, kind, what, exc)
                else:
                    log.exception("console: job %s (%s %s) failed", job.id, kind, what)
            finally:
                job.ended = time.time()

        log.info("console: job %s started: %s %s", job.id, kind, what)
        asyncio.get_running_loop().run_in_executor(pool, run)
        return job
