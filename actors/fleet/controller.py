"""The control loop of a consumer fleet: the ``fleet-<group>`` actor and its policy.

The controller holds the desired size and reconciles the members toward it
(Ray Serve's controller pattern): every ``interval_s`` it reaps members that
ended, polls the live ones (queues, consumed counters), reads the group's lag
from the brokers (``consumer_lag(group, topic)``), asks :class:`ScalePolicy`
for a size and starts or stops members. It runs as a detached Ray actor rather
than a thread of the driver: the fleet keeps consuming and scaling when the
program that started it exits, any program can attach to it by name, and its
members (owned by it) die with it rather than linger unmanaged.

A member is PENDING until Ray has placed its actor on a node (it asks for
``num_cpus`` and ``resources``): the controller does not wait for it, reports it
in :meth:`FleetController.status` with what it waits for (a node that has the
resources at all, which on an autoscaling cluster Ray adds, or room on one), and
counts it toward the size, so it starts once a node with room comes. Then it is
STARTING until its consumer joined the group, RUNNING, and STOPPING on its way out.

Invariants: the size it aims at is within ``[min_consumers, min(max_consumers,
readable queues)]`` while autoscaling, and exactly the size asked by
:meth:`FleetController.scale` while paused; a member leaves only through a
graceful ``shutdown`` (its queues are committed and handed over) before its actor
is killed, unless it died on its own.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from actors.client.admin import Admin
from actors.fleet.config import FleetConfig

if TYPE_CHECKING:
    from actors.fleet.member import MemberSpec
from actors.protocol.topic import is_readable

log = logging.getLogger("raymq.actors.fleet")

STATUS_TIMEOUT_S = 5.0
MAX_EVENTS = 100

PENDING, STARTING, RUNNING, STOPPING = "PENDING", "STARTING", "RUNNING", "STOPPING"


class ScalePolicy:
    """Lag-driven sizing. The wanted size is ``ceil(lag / target_lag_per_consumer)``
    clamped to ``[min, cap]``; the fleet grows when the wanted size stayed above the
    current one for ``scale_up_window_s`` (to the smallest size wanted meanwhile),
    shrinks when it stayed below for ``scale_down_window_s`` (to the largest)."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self._above: tuple[float, int] | None = None  # (since, smallest wanted meanwhile)
        self._below: tuple[float, int] | None = None  # (since, largest wanted meanwhile)

    def wanted(self, lag: int, cap: int) -> int:
        cfg = self.config
        raw = math.ceil(max(lag, 0) / cfg.target_lag_per_consumer)
        return max(cfg.min_consumers, min(raw, cap, cfg.max_consumers))

    def observe(self, now: float, lag: int, cap: int, current: int) -> int | None:
        """Feed one lag reading; the size to go to now, or None to stay."""
        cfg = self.config
        cap = min(cap, cfg.max_consumers)
        want = self.wanted(lag, cap)
        if current < cfg.min_consumers or current > cap:  # out of bounds: fix at once
            self.reset()
            return max(cfg.min_consumers, min(current, cap))
        if want > current:
            since, low = self._above or (now, want)
            self._above, self._below = (since, min(low, want)), None
            if now - since >= cfg.scale_up_window_s:
                self.reset()
                return min(low, want)
        elif want < current:
            since, high = self._below or (now, want)
            self._below, self._above = (since, max(high, want)), None
            if now - since >= cfg.scale_down_window_s:
                self.reset()
                return max(high, want)
        else:
            self.reset()
        return None

    def reset(self) -> None:
        self._above = self._below = None


@dataclass
class _Member:
    name: str
    handle: Any
    state: str
    placed: Any  # the ObjectRef of node_id(): its node once Ray placed the actor
    started: Any  # the ObjectRef of start(): its client id once the member joined
    closed: Any  # the ObjectRef of wait_closed(), pending while the member lives
    since: float = field(default_factory=time.monotonic)
    node: str | None = None
    client_id: str | None = None
    queues: list[str] = field(default_factory=list)
    consumed: int = 0
    rate: float = 0.0
    sampled: tuple[float, int] | None = None

    def row(self, waiting_for: str | None) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "node": self.node,
            "client_id": self.client_id,
            "queues": list(self.queues),
            "consumed": self.consumed,
            "consume_rate": round(self.rate, 1),
            "age_s": round(time.monotonic() - self.since, 3),
            **({"waiting_for": waiting_for} if self.state == PENDING else {}),
        }


def _answered(calls: dict[Any, _Member]) -> list[tuple[_Member, Any]]:
    """The members whose call (an ObjectRef, the key) has answered, with that ref."""
    if not calls:
        return []
    done, _ = ray.wait(list(calls), num_returns=len(calls), timeout=0)
    return [(calls[ref], ref) for ref in done]


class FleetController:
    """Ray actor class (threaded): ``fleet-<group>``, created by :class:`actors.ConsumerFleet`."""

    def __init__(self, spec: MemberSpec, config: FleetConfig) -> None:
        self.group, self.topic, self.namespace = spec.group, spec.topic, spec.namespace
        self.config = config
        self._member_spec = spec
        self.admin = Admin(spec.namespace, spec.nameservers)
        self.policy = ScalePolicy(config)
        self._lock = threading.Condition()
        self._wake = threading.Event()
        self._stopped = False
        self._members: dict[str, _Member] = {}
        self._seq = 0
        self._autoscale = True
        self._size = config.min_consumers  # the size the loop reconciles toward
        self._lag: int | None = None
        self._lag_at = 0.0
        self._cap = config.max_consumers
        self._events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self._no_node: str | None = None  # set while no node has what a member asks
        self._thread = threading.Thread(target=self._loop, name=f"fleet-{self.group}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ public (actor methods)
    def ping(self) -> bool:
        return True

    def scale(self, n: int) -> int:
        """Pin the fleet at ``n`` members and pause autoscaling; returns the size set
        (``n`` capped at the topic's readable queues)."""
        with self._lock:
            self._autoscale = False
            self._size = max(0, min(int(n), self._queue_cap()))
            self._event("scale", f"set by hand to {self._size}")
            size = self._size
        self._wake.set()
        return size

    def autoscale(self, enabled: bool = True) -> None:
        """Resume (or pause) lag-driven sizing, from the current size."""
        with self._lock:
            self._autoscale = bool(enabled)
            self.policy.reset()
            self._event("autoscale", "on" if enabled else "off")
        self._wake.set()

    def wait_stable(self, n: int | None, timeout_s: float) -> bool:
        """Wait until every member runs (none pending, starting or stopping), and there
        are ``n`` of them when given; False on timeout."""
        return self._wait(lambda: self._stable(n), timeout_s)

    def wait_settled(self, n: int, timeout_s: float) -> bool:
        """Wait until there are ``n`` members and each runs or is pending because no node
        has what it asks (it starts when one comes); False on timeout."""
        return self._wait(lambda: self._settled(n), timeout_s)

    def _wait(self, done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0 or self._stopped:
                    return done()
                self._lock.wait(min(left, 0.5))
            return True

    def status(self) -> dict[str, Any]:
        with self._lock:
            waiting_for = self._no_node or (
                f"room for {self.config.request()} on a node: some node has that much, in "
                "use for now (or Ray is placing the member there)"
            )
            members = [m.row(waiting_for) for m in self._members.values()]
            running = [m for m in self._members.values() if m.state == RUNNING]
            lag = self._lag
            return {
                "group": self.group,
                "topic": self.topic,
                "autoscale": self._autoscale,
                "target_size": self._size,
                "size": sum(1 for m in self._members.values() if m.state != STOPPING),
                "running": len(running),
                "pending": sum(1 for m in self._members.values() if m.state == PENDING),
                "min_consumers": self.config.min_consumers,
                "max_consumers": self.config.max_consumers,
                "queue_cap": self._cap,
                "members": members,
                "assignment": {m.name: list(m.queues) for m in running},
                "lag": lag,
                "lag_per_consumer": None if lag is None else lag / max(len(running), 1),
                "lag_age_s": round(time.monotonic() - self._lag_at, 3) if self._lag_at else None,
                "consume_rate": round(sum(m.rate for m in running), 1),
                "consumed": sum(m.consumed for m in self._members.values()),
                "events": list(self._events),
            }

    def shutdown(self) -> dict[str, Any]:
        """Stop the loop and every member (gracefully); the final status."""
        with self._lock:
            self._stopped = True
        self._wake.set()
        self._thread.join(timeout=self.config.interval_s + 60.0)
        with self._lock:
            leaving = list(self._members.values())
        self._stop_members(leaving)
        return self.status()

    # ------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while True:
            with self._lock:
                if self._stopped:
                    return
            try:
                self._round()
            except Exception:  # noqa: BLE001 - the loop must survive a bad round
                log.exception("fleet %s: control round failed", self.group)
            self._wake.wait(self.config.interval_s)
            self._wake.clear()

    def _round(self) -> None:
        self._reap()
        self._poll()
        self._read_lag()
        now = time.monotonic()
        with self._lock:
            if self._stopped:
                return
            current = sum(1 for m in self._members.values() if m.state != STOPPING)
            if self._autoscale and self._lag is not None:
                to = self.policy.observe(now, self._lag, self._queue_cap(), current)
                if to is not None and to != current:
                    self._event(
                        "autoscale",
                        f"{current} -> {to} (lag {self._lag}, target "
                        f"{self.config.target_lag_per_consumer}/consumer)",
                    )
                    self._size = to
            target = self._size
        self._reconcile(target)
        self._check_room()
        with self._lock:
            self._lock.notify_all()

    def _reconcile(self, target: int) -> None:
        with self._lock:
            live = [m for m in self._members.values() if m.state != STOPPING]
        if len(live) < target:
            for _ in range(target - len(live)):
                self._start_member()
        elif len(live) > target:
            # members pending or starting hold no queues: they go first, then the newest
            rank = {PENDING: 0, STARTING: 1, RUNNING: 2}
            order = sorted(live, key=lambda m: (rank[m.state], -m.since))
            self._stop_members(order[: len(live) - target])

    def _start_member(self) -> None:
        from actors.fleet.member import MEMBER_MAX_CONCURRENCY, FleetMember

        with self._lock:
            self._seq += 1
            name = f"fleet-{self.group}-m{self._seq}"
        handle: Any = (  # an ActorHandle (Ray's typing of its methods knows no ``.remote``)
            ray.remote(FleetMember)
            .options(
                name=name,
                namespace=self.namespace,
                num_cpus=self.config.num_cpus,
                resources=dict(self.config.resources or {}),
                max_concurrency=MEMBER_MAX_CONCURRENCY,
                max_restarts=0,
            )
            .remote(self._member_spec)
        )
        member = _Member(
            name,
            handle,
            PENDING,
            handle.node_id.remote(),
            handle.start.remote(),
            handle.wait_closed.remote(),
        )
        with self._lock:
            self._members[name] = member
            self._event("join", name)
        log.info("fleet %s: starting member %s", self.group, name)

    def _stop_members(self, leaving: list[_Member]) -> None:
        if not leaving:
            return
        with self._lock:
            for m in leaving:
                m.state = STOPPING
                self._event("leave", m.name)
        refs = {m.name: m.handle.shutdown.remote() for m in leaving if m.client_id is not None}
        if refs:
            ray.wait(
                list(refs.values()),
                num_returns=len(refs),
                timeout=self.config.member_shutdown_timeout_s,
            )
        for m in leaving:
            ref = refs.get(m.name)
            if ref is not None:
                try:
                    ray.get(ref, timeout=0.01)
                except Exception as exc:  # noqa: BLE001 - killed below anyway
                    log.warning("fleet %s: %s did not stop cleanly: %s", self.group, m.name, exc)
            ray.kill(m.handle, no_restart=True)
            with self._lock:
                self._members.pop(m.name, None)
            log.info("fleet %s: member %s left", self.group, m.name)

    # ------------------------------------------------------------ observing
    def _check_room(self) -> None:
        """While a member waits to be placed: whether any live node has what it asks at
        all (if none has, only a new node brings it up)."""
        with self._lock:
            if not any(m.state == PENDING for m in self._members.values()):
                self._no_node = None
                return
        ask = self.config.request()
        try:
            nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        except Exception as exc:  # noqa: BLE001 - the GCS busy: judged next round
            log.debug("fleet %s: no node list: %s", self.group, exc)
            return
        fits = any(all(res.get(k, 0.0) >= v for k, v in ask.items()) for res in nodes)
        no_node = None
        if not fits:
            no_node = (
                f"a node with {ask}: no node has that much; the member starts when the "
                "autoscaler (or anyone) adds one"
            )
        with self._lock:
            if no_node != self._no_node and no_node is not None:
                self._event("pending", no_node)
            self._no_node = no_node
            self._lock.notify_all()

    def _reap(self) -> None:
        """Members placed (node_id returned), joined (start returned) or ended
        (wait_closed returned or failed)."""
        with self._lock:
            members = [m for m in self._members.values() if m.state != STOPPING]
        for m, ref in _answered({m.closed: m for m in members}):
            try:
                ray.get(ref, timeout=0.01)
                why = "shut down"
            except Exception as exc:  # noqa: BLE001 - an actor death
                why = f"died ({type(exc).__name__})"
            with self._lock:
                self._members.pop(m.name, None)
                self._event("lost", f"{m.name} {why}")
            log.warning("fleet %s: member %s %s", self.group, m.name, why)
            ray.kill(m.handle, no_restart=True)
        with self._lock:
            pending = {
                m.placed: m for m in members if m.state == PENDING and m.name in self._members
            }
        for m, ref in _answered(pending):
            try:
                node = ray.get(ref, timeout=0.01)
            except Exception:  # noqa: BLE001 - its start fails too: handled below
                continue
            with self._lock:
                if m.state == PENDING:
                    m.state, m.node, m.since = STARTING, node, time.monotonic()
        with self._lock:
            starting = {
                m.started: m
                for m in members
                if m.state in (PENDING, STARTING) and m.name in self._members
            }
        for m, ref in _answered(starting):
            try:
                client_id = ray.get(ref, timeout=0.01)
            except Exception as exc:  # noqa: BLE001 - a member that cannot start
                log.error("fleet %s: member %s failed to start: %s", self.group, m.name, exc)
                with self._lock:
                    self._members.pop(m.name, None)
                    self._event("failed", f"{m.name}: {type(exc).__name__}: {exc}")
                ray.kill(m.handle, no_restart=True)
                continue
            with self._lock:
                m.state, m.client_id, m.since = RUNNING, client_id, time.monotonic()
                if m.node is None:  # started before its placement was read
                    with contextlib.suppress(Exception):
                        m.node = ray.get(m.placed, timeout=0.01)
                self._event("running", m.name)

    def _poll(self) -> None:
        with self._lock:
            running = [m for m in self._members.values() if m.state == RUNNING]
        if not running:
            return
        refs = [m.handle.status.remote() for m in running]
        ray.wait(refs, num_returns=len(refs), timeout=STATUS_TIMEOUT_S)
        now = time.monotonic()
        for m, ref in zip(running, refs):
            try:
                st = ray.get(ref, timeout=0.01)
            except Exception:  # noqa: BLE001 - slow or dead: reaped when it died
                continue
            with self._lock:
                m.queues = [q for q in st.get("assigned", []) if q.startswith(f"{self.topic}:")]
                consumed = int(st.get("consumed", 0))
                if m.sampled is not None and now > m.sampled[0]:
                    m.rate = (consumed - m.sampled[1]) / (now - m.sampled[0])
                m.sampled, m.consumed = (now, consumed), consumed

    def _read_lag(self) -> None:
        try:
            rows = self.admin.consumer_lag(self.group, self.topic)
            route = self.admin.topic_route(self.topic)
        except Exception as exc:  # noqa: BLE001 - no route yet, a broker down: keep the size
            log.debug("fleet %s: no lag reading: %s", self.group, exc)
            return
        live = {bd.broker_name for bd in route.broker_datas if bd.master_actor_name()}
        cap = sum(
            qd.read_queue_nums
            for qd in route.queue_datas
            if is_readable(qd.perm) and qd.broker_name in live
        )
        with self._lock:
            self._lag = sum(int(r["lag"]) for r in rows)
            self._lag_at = time.monotonic()
            self._cap = max(1, min(self.config.max_consumers, cap)) if cap else self._cap

    # ------------------------------------------------------------ helpers (lock held)
    def _queue_cap(self) -> int:
        return self._cap

    def _stable(self, n: int | None) -> bool:
        states = [m.state for m in self._members.values()]
        if any(s != RUNNING for s in states):
            return False
        return (n is None and len(states) == self._size) or len(states) == n

    def _settled(self, n: int) -> bool:
        states = [m.state for m in self._members.values()]
        waiting = PENDING if self._no_node is not None else RUNNING
        return len(states) == n and all(s in (RUNNING, waiting) for s in states)

    def _event(self, kind: str, detail: str) -> None:
        self._events.append({"time": time.time(), "kind": kind, "detail": detail})
