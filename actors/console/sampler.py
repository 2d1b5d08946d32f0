"""The console's own metrics: it samples every live master's running totals
(``Admin.counters``, i.e. ``Broker.counters``) every ``sample_interval_ms`` and keeps the
last ``samples_kept`` samples in a ring. Rates (put/get TPS per broker, TPS per topic,
consume TPS per group) are the change of a counter between the newest sample and the
oldest one within ``rate_window_ms``; the charts draw the rate between each pair of
consecutive samples, and the lag (a level, not a counter) as sampled. No Prometheus
is needed: these are the brokers' own counters.

A broker that restarted (a new incarnation) starts its counters at 0 again: a pair of
samples across a restart counts nothing for that broker rather than going negative.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("raymq.actors.console")

Series = dict[str, list[tuple[float, float]]]
"""A chart's lines: name -> [(epoch seconds, value)], oldest first."""


@dataclass(frozen=True)
class Sample:
    """Every broker's counters at one moment (epoch seconds)."""

    time: float
    brokers: dict[str, dict[str, Any]] = field(default_factory=dict)


def _same_broker(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a.get("incarnation") == b.get("incarnation"))


def _delta(new: float, old: float) -> float:
    return max(new - old, 0.0)


def broker_deltas(old: Sample, new: Sample) -> dict[str, dict[str, float]]:
    """Per broker, how its counters grew from ``old`` to ``new``."""
    out: dict[str, dict[str, float]] = {}
    for name, b in new.brokers.items():
        a = old.brokers.get(name)
        if a is None or not _same_broker(a, b):
            continue
        timed = _delta(b["put_timed"], a["put_timed"])
        out[name] = {
            "put": _delta(b["put_msgs"], a["put_msgs"]),
            "get": _delta(b["get_msgs"], a["get_msgs"]),
            "put_ms": _delta(b["put_micros"], a["put_micros"]) / 1000 / timed if timed else 0.0,
        }
    return out


def topic_deltas(old: Sample, new: Sample) -> dict[str, float]:
    """Per topic, the messages stored from ``old`` to ``new`` (over every broker)."""
    out: dict[str, float] = {}
    for name, b in new.brokers.items():
        a = old.brokers.get(name)
        if a is None or not _same_broker(a, b):
            continue
        before = a["topics"]
        for topic, (stored, _) in b["topics"].items():
            was = before[topic][0] if topic in before else 0  # a new topic starts empty
            out[topic] = out.get(topic, 0.0) + _delta(stored, was)
    return out


def group_deltas(old: Sample, new: Sample) -> dict[str, float]:
    """Per group, the messages pulls and pops served it (every broker): RocketMQ's
    consume TPS counts the same (its GROUP_GET_NUMS)."""
    out: dict[str, float] = {}
    for name, b in new.brokers.items():
        a = old.brokers.get(name)
        if a is None or not _same_broker(a, b):
            continue
        before = a["group_gets"]
        for group, got in b["group_gets"].items():
            out[group] = out.get(group, 0.0) + _delta(got, before.get(group, 0))
    return out


def group_lags(sample: Sample) -> dict[str, int]:
    """Per group, its lag over every topic and broker in ``sample``."""
    out: dict[str, int] = {}
    for b in sample.brokers.values():
        for group, topics in b["groups"].items():
            out[group] = out.get(group, 0) + sum(lag for _, lag in topics.values())
    return out


class Sampler:
    """The ring of samples and the rates and series drawn from it."""

    def __init__(self, interval_s: float, kept: int, window_s: float) -> None:
        self.interval_s = interval_s
        self.window_s = window_s
        self.samples: deque[Sample] = deque(maxlen=kept)
        self._task: asyncio.Task[None] | None = None
        self.last_error: str | None = None
        """Why the last sample failed, while they fail (the metrics page says it)."""

    # ------------------------------------------------------------ sampling
    def add(self, brokers: dict[str, dict[str, Any]], at: float | None = None) -> Sample:
        sample = Sample(time.time() if at is None else at, brokers)
        self.samples.append(sample)
        return sample

    def start(self, take: Callable[[], Awaitable[dict[str, dict[str, Any]]]]) -> None:
        """Sample with ``take`` every ``interval_s`` on the running loop until :meth:`stop`."""
        self._task = asyncio.get_running_loop().create_task(self._loop(take))

    async def _loop(self, take: Callable[[], Awaitable[dict[str, dict[str, Any]]]]) -> None:
        while True:
            try:
                self.add(await take())
                self.last_error = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a missed sample, not a broken console
                if self.last_error is None:
                    log.warning("console: sampling the brokers' counters failed: %s", exc)
                self.last_error = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    # ------------------------------------------------------------ rates (now)
    def window(self) -> tuple[Sample, Sample] | None:
        """The oldest sample within ``window_s`` of the newest, and the newest."""
        if len(self.samples) < 2:
            return None
        new = self.samples[-1]
        old = self.samples[-2]
        for s in self.samples:
            if s is not new and new.time - s.time <= self.window_s:
                old = s
                break
        return old, new

    def broker_rates(self) -> dict[str, dict[str, float]]:
        """Per broker: put and get TPS and the mean put latency (ms) over the window."""
        pair = self.window()
        if pair is None:
            return {}
        old, new = pair
        dt = max(new.time - old.time, 1e-3)
        return {
            name: {"put_tps": d["put"] / dt, "get_tps": d["get"] / dt, "put_ms": d["put_ms"]}
            for name, d in broker_deltas(old, new).items()
        }

    def topic_rates(self) -> dict[str, float]:
        pair = self.window()
        if pair is None:
            return {}
        old, new = pair
        dt = max(new.time - old.time, 1e-3)
        return {t: d / dt for t, d in topic_deltas(old, new).items()}

    def group_rates(self) -> dict[str, float]:
        pair = self.window()
        if pair is None:
            return {}
        old, new = pair
        dt = max(new.time - old.time, 1e-3)
        return {g: d / dt for g, d in group_deltas(old, new).items()}

    # ------------------------------------------------------------ series (charts)
    def series(self) -> dict[str, Series]:
        """Chart lines over the ring: put TPS, get TPS and put latency (ms) per broker,
        lag and consume TPS per group."""
        out: dict[str, Series] = {
            "put_tps": {},
            "get_tps": {},
            "put_ms": {},
            "lag": {},
            "consume_tps": {},
        }
        samples = list(self.samples)
        for old, new in zip(samples, samples[1:], strict=False):
            dt = max(new.time - old.time, 1e-3)
            for name, d in broker_deltas(old, new).items():
                out["put_tps"].setdefault(name, []).append((new.time, d["put"] / dt))
                out["get_tps"].setdefault(name, []).append((new.time, d["get"] / dt))
                out["put_ms"].setdefault(name, []).append((new.time, d["put_ms"]))
            for group, moved in group_deltas(old, new).items():
                out["consume_tps"].setdefault(group, []).append((new.time, moved / dt))
        for s in samples:
            for group, lag in group_lags(s).items():
                out["lag"].setdefault(group, []).append((s.time, float(lag)))
        return out
