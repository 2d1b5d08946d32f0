"""Names what stalls the processes on a message's path during a latency run.

    python benchmarks/stall_tracer.py [--peers raymq-async,py-relay] [--rate 1000]
                                      [--seconds 3] [--rounds 2] [--threshold-ms 1]

It runs the latency phase of ``peers.py`` (single 100 B messages paced at ``--rate``,
RayMQ's ``send_async`` to a PushConsumer actor through one broker actor; the
``py-relay`` floor through a relay actor to a reading actor) in rounds that
alternate the peers, with a tracer in every process of the run: this one (the
producer) directly, the Ray workers (broker, consumer, relay, reader) through Ray's
``worker_process_setup_hook``, so nothing in the library changes.

In each traced process the tracer keeps:

* a **canary** thread sleeping ``--tick-ms`` and recording each oversleep over
  ``--threshold-ms``, with its wall-clock start and end, the process's CPU time over
  it and, when it wakes, the frames of the process's other threads
  (``sys._current_frames()``): a thread still running Python code then is the one that
  held the GIL (the switch interval hands the GIL over mid-computation);
* the **event loop's lag**, for every asyncio loop started after the tracer (a
  callback due every tick; a lag over the threshold is recorded like an oversleep)
  and the callbacks that held it; a uvloop loop (Ray's async actors use uvloop when
  it is installed, the broker's among them) runs its callbacks from C and is seen
  only through the canary, as native code under ``threading.py:run``;
* the **collections**: ``gc.callbacks`` start and stop, generation, duration.

A stall is classified, in this order, as ``gc genN`` (a collection of that process
overlapped it), ``loop callback: <name>`` (one callback of an event loop of that
process ran for over half the threshold within it: the task's coroutine and where it
was), ``off-CPU`` (the process ran for less than a third of the stall: the machine's
other processes had the cores, or a thread blocked without holding the GIL), or the ``file:function`` of the innermost
frame of the threads that were running Python when the canary woke (a RayMQ frame,
``actors/`` or ``storage/``, is preferred to the library frames under it).

Each message over the run's p90 is lined up against the stalls of the three
processes that overlap its path (its send to its arrival) and charged to the
longest of them; a slow message with no stall over the threshold on its path is
``no stall``: it waited for the work of other messages (queueing), not a pause.

The report prints, per peer: the latency, the stalls by process and cause (count,
total and longest ms), and the slow messages by the cause charged. The tracer costs
each process ~2% of a core (the canary's wake-ups), the same for every peer.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import gc
import json
import linecache
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_DIR = "RAYMQ_STALL_DIR"
ENV_THRESHOLD = "RAYMQ_STALL_THRESHOLD_MS"
ENV_TICK = "RAYMQ_STALL_TICK_MS"

_WAITING = re.compile(
    r"\b(acquire|wait|wait_for|sleep|select|poll|recv\w*|accept|read\w*|get|join|"
    r"run_task_loop|run_forever|_run_once|serve_forever|control|main_loop|readline|"
    r"epoll|result)\("
)
"""A source line calling one of these is a thread waiting, not holding the GIL."""
_OURS = (f"{os.sep}actors{os.sep}", f"{os.sep}storage{os.sep}")


# ------------------------------------------------------------------ in each process


class Tracer:
    """The canary, the loop probes and the collection callbacks of one process; each
    event is one JSON line appended to ``<dir>/<pid>.jsonl`` when it ends."""

    def __init__(self, out_dir: str, threshold_ms: float = 1.0, tick_ms: float = 1.0) -> None:
        self.threshold_ns = int(threshold_ms * 1e6)
        self.tick_s = tick_ms / 1e3
        self.fd = os.open(
            os.path.join(out_dir, f"{os.getpid()}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND
        )
        self.dir = out_dir
        self._role_at = -1.0
        self._role_cached = "?"
        self._settings_mtime = 0.0
        self.gc_started = 0
        self.slow_callbacks: collections.deque[tuple[int, int, str]] = collections.deque(maxlen=64)
        self.gc_recent: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=64)
        self.canary = threading.Thread(target=self._canary, name="raymq-stall-canary", daemon=True)
        gc.callbacks.append(self._gc)
        self._patch_loops()
        self.canary.start()

    # events ---------------------------------------------------------------

    def _role(self) -> str:
        """The process's title (``ray::Broker``...), read again at most twice a second."""
        now = time.monotonic()
        if now - self._role_at > 0.5:
            self._role_cached, self._role_at = self._read_role(), now
        return self._role_cached

    def _read_role(self) -> str:
        try:
            with open("/proc/self/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            return "?"
        if cmd.startswith("ray::"):
            return cmd.split(".")[0].split(" ")[0]
        return "driver (producer)"

    def _write(self, kind: str, start_ns: int, end_ns: int, **detail: Any) -> None:
        event = {"kind": kind, "start": start_ns, "end": end_ns, "role": self._role(), **detail}
        os.write(self.fd, (json.dumps(event) + "\n").encode())

    def _apply_settings(self) -> None:
        """The run's settings file (``settings.json`` in the events' directory), applied
        when it changes: ``switch_interval_s`` (``sys.setswitchinterval``), so rounds with
        and without a setting alternate in one run."""
        path = os.path.join(self.dir, "settings.json")
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            return
        if mtime == self._settings_mtime:
            return
        self._settings_mtime = mtime
        with contextlib.suppress(ValueError, OSError):
            settings = json.loads(Path(path).read_text())
            roles = settings.get("switch_in") or []
            mine = not roles or any(r in self._role() for r in roles)
            sys.setswitchinterval(
                float(settings.get("switch_interval_s", 0.005)) if mine else 0.005
            )

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        now = time.time_ns()
        if phase == "start":
            self.gc_started = now
            return
        if not self.gc_started:
            return
        start, self.gc_started = self.gc_started, 0
        self.gc_recent.append((start, now, int(info.get("generation", -1))))
        if now - start >= self.threshold_ns // 4:
            self._write("gc", start, now, generation=info.get("generation"))

    def _cause(self, start_ns: int, end_ns: int, cpu_s: float, me: int) -> tuple[str, list[str]]:
        """What held this process from ``start_ns`` to ``end_ns`` (see the module's doc)."""
        for g_start, g_end, gen in list(self.gc_recent):
            if g_start < end_ns and g_end > start_ns:
                return f"gc gen{gen}", []
        held = [
            (min(e, end_ns) - max(s, start_ns), name)
            for s, e, name in list(self.slow_callbacks)
            if s < end_ns and e > start_ns
        ]
        if held:
            return f"loop callback: {max(held)[1]}", []
        if cpu_s * 1e9 < (end_ns - start_ns) / 3:
            return "off-CPU", []
        names = {t.ident: t.name for t in threading.enumerate()}
        running: list[tuple[str, list[str]]] = []
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            line = linecache.getline(frame.f_code.co_filename, frame.f_lineno or 0)
            if _WAITING.search(line):
                continue
            stack = []
            f: Any = frame
            while f is not None and len(stack) < 12:
                stack.append(f"{_short(f.f_code.co_filename)}:{f.f_code.co_name}:{f.f_lineno}")
                f = f.f_back
            ours = next((s for s in stack if any(o in "/" + s for o in _OURS)), stack[0])
            where = ours.rsplit(":", 1)[0]
            if where == "threading.py:run":  # the thread's target is native code
                where = "native code under threading.py:run (a uvloop loop's own work)"
            running.append((f"{names.get(ident, '?')}: {where}", stack))
        if not running:
            return "no Python thread running (native code or a wait)", []
        running.sort()
        return " | ".join(r for r, _ in running), running[0][1]

    # the canary -----------------------------------------------------------

    def _canary(self) -> None:
        me = threading.get_ident()
        while self._role() in ("ray::IDLE", "?"):  # a worker that is no actor yet
            time.sleep(0.5)
        tick_ns = int(self.tick_s * 1e9)
        ticks = 0
        while True:
            ticks += 1
            if ticks % 100 == 0:
                self._apply_settings()
            start = time.time_ns()
            cpu = time.process_time()
            time.sleep(self.tick_s)
            end = time.time_ns()
            if end - start - tick_ns > self.threshold_ns:
                cause, stack = self._cause(start + tick_ns, end, time.process_time() - cpu, me)
                self._write("canary", start + tick_ns, end, cause=cause, stack=stack)

    # event loops ----------------------------------------------------------

    def _patch_loops(self) -> None:
        tracer = self
        unwrapped = asyncio.BaseEventLoop.run_forever

        @functools.wraps(unwrapped)
        def run_forever(loop: asyncio.BaseEventLoop) -> None:
            tracer._probe(loop)
            return unwrapped(loop)

        asyncio.BaseEventLoop.run_forever = run_forever  # type: ignore[method-assign]
        run = asyncio.events.Handle._run
        half = self.threshold_ns // 2

        @functools.wraps(run)
        def timed_run(handle: asyncio.events.Handle) -> None:
            started = time.perf_counter_ns()
            run(handle)
            took = time.perf_counter_ns() - started
            if took > half:  # a callback that held its loop: named for the lag it caused
                end = time.time_ns()
                tracer.slow_callbacks.append((end - took, end, _callback_name(handle)))

        asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]

    def _probe(self, loop: asyncio.BaseEventLoop) -> None:
        tick_ns = int(self.tick_s * 1e9)
        state = {"due": time.time_ns() + tick_ns, "cpu": time.process_time()}

        def tick() -> None:
            now = time.time_ns()
            lag = now - state["due"]
            if lag > self.threshold_ns:
                cpu = time.process_time() - state["cpu"]
                cause, stack = self._cause(state["due"], now, cpu, threading.get_ident())
                self._write("loop", state["due"], now, cause=cause, stack=stack)
            state["due"] = now + tick_ns
            state["cpu"] = time.process_time()
            loop.call_later(self.tick_s, tick)

        loop.call_soon(tick)


def _callback_name(handle: asyncio.events.Handle) -> str:
    callback = getattr(handle, "_callback", None)
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        frame = getattr(coro, "cr_frame", None)
        where = f" at {_short(frame.f_code.co_filename)}:{frame.f_lineno}" if frame else ""
        return f"task {getattr(coro, '__qualname__', coro)}{where}"
    return getattr(callback, "__qualname__", repr(callback))[:120]


def _short(path: str) -> str:
    for marker in ("site-packages/", "python3.11/", "/work/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


_installed: Tracer | None = None


def install() -> None:
    """Start the tracer in this process if ``RAYMQ_STALL_DIR`` is set (the Ray workers'
    setup hook; idempotent)."""
    global _installed
    out = os.environ.get(ENV_DIR)
    if out and _installed is None:
        _installed = Tracer(
            out,
            float(os.environ.get(ENV_THRESHOLD, "1")),
            float(os.environ.get(ENV_TICK, "1")),
        )


# ------------------------------------------------------------------ the run


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402


class _PushConsumer(peers._RayMQPushLatency):
    """``peers.py``'s PushConsumer actor, keeping each message's send stamp and arrival."""

    def __init__(
        self, namespace: str, topic: str, data_path: str, delivery: str | None = None
    ) -> None:
        self.arrivals: list[tuple[int, int]] = []
        super().__init__(namespace, topic, data_path, delivery)

    def _on(self, msgs: list[Any]) -> Any:
        now = time.time_ns()
        self.arrivals.extend((int.from_bytes(m.body[:8], "big"), now) for m in msgs)
        return super()._on(msgs)

    def take_arrivals(self) -> list[tuple[int, int]]:
        out, self.arrivals = self.arrivals, []
        return out


class _RelayReader(peers._RelayConsumer):
    """``peers.py``'s relay reader, keeping each message's send stamp and arrival."""

    def _read(self) -> None:
        self.arrivals: list[tuple[int, int]] = []
        reader = self.sock.makefile("rb")
        while True:
            head = reader.read(4)
            if len(head) < 4:
                return
            body = reader.read(int.from_bytes(head, "big"))
            now = time.time_ns()
            with self.arrived:
                self.arrivals.append((int.from_bytes(body[:8], "big"), now))
                self.samples.append((now - int.from_bytes(body[:8], "big")) / 1e6)
                self.arrived.notify_all()

    def take_arrivals(self, n: int, timeout_s: float) -> list[tuple[int, int]]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.arrivals) >= n, timeout_s)
            out, self.arrivals = self.arrivals, []
            self.samples = []
        return out


@dataclass
class Message:
    sent: int  # ns, wall clock
    acked: int  # the producer's answer (0: none)
    arrived: int

    @property
    def ms(self) -> float:
        return (self.arrived - self.sent) / 1e6


def _run_raymq(peer: Any, rate: int, seconds: float) -> list[Message]:
    import ray

    from storage import Message as RMessage

    peer.reset()
    consumer = ray.remote(num_cpus=0)(_PushConsumer).remote(
        peer.namespace, peer.topic, "socket", peer.delivery
    )
    producer = peer.cluster.producer("stall-tracer", data_path="socket")
    body = b"x" * 100
    peers.warm_up(producer, consumer, peer.topic, body)
    ray.get(consumer.take_arrivals.remote())
    acked: dict[int, int] = {}
    settled = threading.Semaphore(0)

    def done(stamp: int, _: Any) -> None:
        acked[stamp] = time.time_ns()
        settled.release()

    def send(i: int) -> None:
        stamped = peers.stamp(body)
        fut = producer.send_async(RMessage(peer.topic, stamped))
        fut.add_done_callback(functools.partial(done, int.from_bytes(stamped[:8], "big")))

    n = int(rate * seconds)
    peers.paced(rate, seconds, send)
    for _ in range(n):
        settled.acquire(timeout=60)
    ray.get(consumer.take_when.remote(n, 30.0))
    arrivals = ray.get(consumer.take_arrivals.remote())
    producer.close()
    ray.get(consumer.close.remote())
    ray.kill(consumer)
    return [Message(s, acked.get(s, 0), a) for s, a in arrivals]


def _run_relay(peer: Any, rate: int, seconds: float) -> list[Message]:
    import socket

    import ray

    reader = ray.remote(num_cpus=0)(_RelayReader).remote(peer.port)
    ray.get(reader.pid.remote())
    sock = socket.create_connection(("127.0.0.1", peer.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"P")
    body = b"x" * 100
    acked: dict[int, int] = {}

    def send(i: int) -> None:
        stamped = peers.stamp(body)
        sock.sendall(len(stamped).to_bytes(4, "big") + stamped)
        left = 4
        while left:
            left -= len(sock.recv(left))
        acked[int.from_bytes(stamped[:8], "big")] = time.time_ns()

    try:
        peers.paced(rate, seconds, send)
        arrivals = ray.get(reader.take_arrivals.remote(len(acked), 30.0))
    finally:
        sock.close()
        ray.kill(reader)
    return [Message(s, acked.get(s, 0), a) for s, a in arrivals]


def _events(out_dir: Path, since: int, until: int) -> list[dict[str, Any]]:
    events = []
    for path in out_dir.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            with_pid = json.loads(line)
            if with_pid["end"] >= since and with_pid["start"] <= until:
                with_pid["pid"] = int(path.stem)
                events.append(with_pid)
    return events


@dataclass
class Round:
    peer: str
    messages: list[Message]
    events: list[dict[str, Any]]


def report(rounds: list[Round], threshold_ms: float) -> None:
    for name in dict.fromkeys(r.peer for r in rounds):
        mine = [r for r in rounds if r.peer == name]
        lat = sorted(m.ms for r in mine for m in r.messages)
        if not lat:
            print(f"\n== {name}: no messages")
            continue
        p = peers.percentile
        print(
            f"\n== {name}: {len(lat)} messages in {len(mine)} rounds, ms p50 {p(lat, 0.5):.2f}"
            f"  p90 {p(lat, 0.9):.2f}  p99 {p(lat, 0.99):.2f}  p99.9 {p(lat, 0.999):.2f}"
        )
        stalls: dict[tuple[str, str, str], list[float]] = collections.defaultdict(list)
        for r in mine:
            for e in r.events:
                cause = e.get("cause") or f"gc gen{e.get('generation')}"
                stalls[(e["role"], e["kind"], cause)].append((e["end"] - e["start"]) / 1e6)
        print(f"  stalls over {threshold_ms:g} ms (canary: a thread's wait for the GIL or a core;")
        print("  loop: the event loop's lag; gc: a collection of any length over a quarter of it)")
        print(f"  {'count':>6}{'total ms':>10}{'max ms':>9}  process / kind / cause")
        for (role, kind, cause), d in sorted(stalls.items(), key=lambda kv: -sum(kv[1]))[:25]:
            print(f"  {len(d):>6}{sum(d):>10.1f}{max(d):>9.2f}  {role} / {kind} / {cause[:150]}")
        charged: dict[str, list[float]] = collections.defaultdict(list)
        slow = 0
        for r in mine:
            cut = p([m.ms for m in r.messages], 0.9)
            spans = [e for e in r.events if e["kind"] in ("canary", "loop", "gc")]
            for m in r.messages:
                if m.ms <= cut:
                    continue
                slow += 1
                on_path = [e for e in spans if e["start"] < m.arrived and e["end"] > m.sent]
                if not on_path:
                    charged["no stall (queueing behind other work)"].append(m.ms)
                    continue
                worst = max(
                    on_path,
                    key=lambda e: min(e["end"], m.arrived) - max(e["start"], m.sent),
                )
                cause = worst.get("cause") or f"gc gen{worst.get('generation')}"
                charged[f"{worst['role']} / {worst['kind']} / {cause}"].append(m.ms)
        acks = sorted((m.acked - m.sent) / 1e6 for r in mine for m in r.messages if m.acked)
        if acks:
            print(
                f"  send -> ack ms p50 {p(acks, 0.5):.2f}  p99 {p(acks, 0.99):.2f}"
                f"  (send -> arrival above)"
            )
        print(f"  messages over their round's p90 ({slow}), by the longest stall on their path:")
        print(f"  {'count':>6}{'median ms':>11}  cause")
        for cause, ms in sorted(charged.items(), key=lambda kv: -len(kv[1]))[:15]:
            print(f"  {len(ms):>6}{p(ms, 0.5):>11.2f}  {cause[:160]}")
        worst_stacks = sorted(
            (e for r in mine for e in r.events if e.get("stack")),
            key=lambda e: e["start"] - e["end"],
        )[:3]
        for e in worst_stacks:
            print(
                f"  longest with a stack: {(e['end'] - e['start']) / 1e6:.2f} ms in {e['role']}"
                f" ({e['kind']}):\n      " + "\n      ".join(e["stack"][:8])
            )


def _settings(out_dir: Path, switch_interval_s: float | None, switch_in: list[str]) -> None:
    """Tell every traced process the next round's settings (applied within ~0.1 s)."""
    settings = {"switch_interval_s": switch_interval_s or 0.005, "switch_in": switch_in}
    (out_dir / "settings.json").write_text(json.dumps(settings))
    time.sleep(0.3)  # every canary reads the file every 100 ticks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", default="raymq-async,py-relay")
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--worker-nice",
        type=int,
        default=peers.WORKER_NICENESS[0],
        help="the niceness of Ray's workers (Ray's own default: 15)",
    )
    parser.add_argument("--threshold-ms", type=float, default=1.0)
    parser.add_argument("--tick-ms", type=float, default=1.0)
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="also run each RayMQ round with this sys.setswitchinterval in every process"
        " (alternated with the default 5 ms in the same run)",
    )
    parser.add_argument(
        "--switch-in",
        default="",
        help="with --switch-interval-ms: only in the processes whose role contains one of"
        " these comma-separated names (Broker, _PushConsumer, driver); default every one",
    )
    parser.add_argument("--json", default=None, help="write every round's messages and events")
    args = parser.parse_args()
    names = args.peers.split(",")
    switch_in = [r for r in args.switch_in.split(",") if r]
    for name in names:
        if name not in ("raymq-async", "raymq-sync", "raymq-stream", "raymq-pull", "py-relay"):
            parser.error(
                f"unknown peer {name!r}: raymq-async, raymq-sync, raymq-stream, raymq-pull "
                "or py-relay"
            )
    import ray

    out_dir = Path(tempfile.mkdtemp(prefix="raymq-stalls-"))
    here = os.path.dirname(os.path.abspath(__file__))
    env = {
        ENV_DIR: str(out_dir),
        ENV_THRESHOLD: str(args.threshold_ms),
        ENV_TICK: str(args.tick_ms),
        "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]),
    }
    os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=False,
        namespace="raymq-stalls",
        runtime_env={"env_vars": env, "worker_process_setup_hook": "stall_tracer.install"},
        # workers at nice 0, as in the Ray RayMQ starts and in peers.py (Ray's default: 15)
        _system_config={"worker_niceness": args.worker_nice},
    )
    install()
    started = {name: peers.PEERS[name]() for name in names}
    rounds: list[Round] = []
    try:
        for peer in started.values():
            peer.start()
        plan = [(name, None) for name in names]
        if args.switch_interval_ms is not None:
            plan += [(n, args.switch_interval_ms / 1e3) for n in names if n != "py-relay"]
        for i in range(args.rounds):
            for name, switch in plan:
                _settings(out_dir, switch, switch_in)
                peer = started[name]
                label = name if switch is None else f"{name} switch {switch * 1e3:g} ms"
                since = time.time_ns()
                if name == "py-relay":
                    msgs = _run_relay(peer, args.rate, args.seconds)
                else:
                    msgs = _run_raymq(peer, args.rate, args.seconds)
                first = min((m.sent for m in msgs), default=since)
                rounds.append(Round(label, msgs, _events(out_dir, first, time.time_ns())))
                name = label
                lat = sorted(m.ms for m in msgs)
                print(
                    f"round {i + 1} {name}: p50 {peers.percentile(lat, 0.5):.2f}"
                    f"  p99 {peers.percentile(lat, 0.99):.2f} ms",
                    flush=True,
                )
        report(rounds, args.threshold_ms)
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    [
                        {
                            "peer": r.peer,
                            "messages": [vars(m) for m in r.messages],
                            "events": r.events,
                        }
                        for r in rounds
                    ]
                )
            )
    finally:
        for peer in started.values():
            peer.stop()
        ray.shutdown()
        shutil.rmtree(out_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
