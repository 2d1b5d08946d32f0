"""What each layer of a single ``send_async`` costs the producer's process.

    python benchmarks/producer_layers.py [--rate 1000] [--seconds 2] [--rounds 3]

One broker (ASYNC_FLUSH) on this machine's local Ray. Single 100 B messages are
sent at ``--rate`` through ever more of the producer's layers, from the bare
connection to ``Producer.send_async``, rounds alternating the layers; for each it
prints the CPU this process spent per message (all its threads: the caller's, the
client I/O loop's) and the acknowledgement's latency (p50/p99). ``pace`` is the
pacing alone (no send), what every row includes:

* ``conn``: the broker's connection, a SEND frame of one encoded, bound record;
* ``stub``: the broker's data-path stub (``stub.send.remote``: a PendingCall);
* ``transport``: the producer's transport (its call of one bound batch);
* ``sender``: the sender's async send of one encoded chunk (queue selection,
  binding, the send lanes, retries on failure);
* ``send_async``: ``Producer.send_async(message)``, what a user calls (its
  encoding, the async budget, the coalescer).

A row's CPU less the row above it is what that layer adds per message.

``--breakdown`` also times, in each layer, the producer's functions on a message's way
(:data:`BREAKDOWN`), each call's CPU on its own thread (``time.thread_time_ns``, kernel
time of its system calls included), and prints them per layer: CPU per call, calls per
message. Times are inclusive (``lanes._answered`` contains ``lanes._finish``). They are
what the steps cost in the live run, where every step runs cold, not in a warm loop;
the timers add ~1-2 us a call, so the rows' CPU is then a little higher.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _local import actor_pids, start_local_ray, total_cpu_s  # noqa: E402
from peers import paced, percentile  # noqa: E402

import actors  # noqa: E402
from actors.protocol.frames import Code  # noqa: E402
from storage import Message  # noqa: E402

TOPIC = "Layers"

BREAKDOWN = (
    # (module, class, method, label): on the caller's thread
    ("actors.client.encoder", "MessageEncoder", "encode", "encode"),
    ("actors.client.send_async", "AsyncSending", "send_chunks_async", "send_chunks_async"),
    ("actors.client.queue_selector", "QueueSelector", "select", "  select"),
    ("actors.client.send_lanes", "SendLanes", "send", "  lanes.send"),
    ("actors.client.idempotence", "Sequencer", "bind", "    bind"),
    ("actors.client.transport", "BrokerTransport", "call", "    transport.call"),
    ("actors.protocol.connection", "BrokerConnection", "_send_direct", "      socket write"),
    # on the client I/O thread, the answer
    ("actors.protocol.connection", "BrokerConnection", "_on_frame", "io: connection._on_frame"),
    ("actors.client.send_lanes", "SendLanes", "_answered", "io:   lanes._answered"),
    ("actors.protocol.wire", "SendAck", "from_wire", "io:     SendAck.from_wire"),
    ("actors.client.send_lanes", "SendLanes", "_finish", "io:     lanes._finish"),
    ("actors.client.send_outcome", "Outcome", "settle", "io:       Outcome.settle"),
    ("actors.client.fault", "LatencyFaultTolerance", "update", "io:       fault.update"),
    ("actors.client.send_result", "BatchSendResult", "__getitem__", "io:       BatchSendResult[i]"),
)
"""The functions ``--breakdown`` times, indented as they nest."""


class _Breakdown:
    """Thread CPU per call of :data:`BREAKDOWN`'s functions, wrapped in place for the
    run (a benchmark's instrument: the library is not changed on disk)."""

    def __init__(self) -> None:
        self.cpu_ns: dict[str, int] = dict.fromkeys((b[3] for b in BREAKDOWN), 0)
        self.calls: dict[str, int] = dict.fromkeys(self.cpu_ns, 0)

    def install(self) -> None:
        import functools
        import importlib

        for module, cls_name, name, label in BREAKDOWN:
            cls = getattr(importlib.import_module(module), cls_name)
            raw = cls.__dict__[name]
            is_cm = isinstance(raw, classmethod)
            fn = raw.__func__ if is_cm else raw

            def timed(*a: Any, _fn: Any = fn, _label: str = label, **k: Any) -> Any:
                t0 = time.thread_time_ns()
                try:
                    return _fn(*a, **k)
                finally:
                    self.cpu_ns[_label] += time.thread_time_ns() - t0
                    self.calls[_label] += 1

            functools.update_wrapper(timed, fn)
            setattr(cls, name, classmethod(timed) if is_cm else timed)

    def take(self) -> dict[str, tuple[int, int]]:
        out = {k: (self.cpu_ns[k], self.calls[k]) for k in self.cpu_ns}
        for k in self.cpu_ns:
            self.cpu_ns[k] = self.calls[k] = 0
        return out


class _Acks:
    """Acknowledgement latencies, counted as they come (nothing kept but the figure)."""

    def __init__(self) -> None:
        self.lat: list[float] = []
        self.sent = 0
        self.errors: list[BaseException] = []
        self._done = threading.Semaphore(0)

    def start(self) -> Callable[..., None]:
        self.sent += 1
        t0 = time.perf_counter()

        def answered(fut: Any = None) -> None:
            exc = fut.exception() if fut is not None else None
            if exc is not None:
                self.errors.append(exc)
            self.lat.append((time.perf_counter() - t0) * 1e3)
            self._done.release()

        return answered

    def wait(self) -> None:
        for _ in range(self.sent):
            if not self._done.acquire(timeout=30):
                raise TimeoutError("acknowledgements did not come")
        if self.errors:
            raise self.errors[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+", help="these layers only (and pace)")
    parser.add_argument(
        "--no-idempotence", action="store_true", help="a producer without idempotent numbering"
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="time the producer's steps in each layer"
    )
    args = parser.parse_args()
    breakdown = _Breakdown() if args.breakdown else None
    if breakdown is not None:
        breakdown.install()
    start_local_ray()
    root = tempfile.mkdtemp(prefix="raymq-layers-")
    cluster = actors.start_cluster(
        namespace="raymq-layers",
        nameservers=1,
        brokers=1,
        store_root=root,
        topics=[actors.TopicConfig(TOPIC, 4, 4)],
        broker_options={"store": {"flush_disk_type": "ASYNC_FLUSH"}},
    )
    try:
        producer = cluster.producer("layers", enable_idempotence=not args.no_idempotence)
        body = b"x" * 100
        for _ in range(200):  # routes, the connection, the producer id
            producer.send(Message(TOPIC, body))
        route, _ = producer._selector.route(TOPIC)
        broker_name = route.broker_datas[0].broker_name
        stub = producer.ns.broker(route, broker_name)
        assert stub.on_socket(), "the broker's socket is not open"
        conn = producer._data_path._conns[stub.actor_name]
        chunk = producer._encoder.encode([Message(TOPIC, body)], numbered=False)[0]
        bound = chunk.batch.with_queue(0)
        blob = b"".join(type(bound).wire_parts([bound]))
        sender = producer._sender
        transport = producer._transport

        def run_conn(acks: _Acks) -> None:
            conn.request({"c": int(Code.SEND), "n": 0}, [blob]).add_done_callback(acks.start())

        def run_stub(acks: _Acks) -> None:
            stub.send.remote(blob, 0).future().add_done_callback(acks.start())

        def run_transport(acks: _Acks) -> None:
            transport.call(route, broker_name, [bound], 0).future().add_done_callback(acks.start())

        def run_sender(acks: _Acks) -> None:
            chunks = producer._encoder.encode([Message(TOPIC, body)])
            sender.send_chunks_async(chunks, 1, True).add_done_callback(acks.start())

        def run_send_async(acks: _Acks) -> None:
            producer.send_async(Message(TOPIC, body)).add_done_callback(acks.start())

        def run_pace(acks: _Acks) -> None:
            acks.start()()

        layers: dict[str, Callable[[_Acks], None]] = {
            "pace": run_pace,
            "conn": run_conn,
            "stub": run_stub,
            "transport": run_transport,
            "sender": run_sender,
            "send_async": run_send_async,
        }
        if args.only:
            layers = {k: v for k, v in layers.items() if k == "pace" or k in args.only}
        cpu: dict[str, list[float]] = {k: [] for k in layers}
        bcpu: dict[str, list[float]] = {k: [] for k in layers}
        broker_pid = actor_pids("Broker")[0]
        p50: dict[str, list[float]] = {k: [] for k in layers}
        p99: dict[str, list[float]] = {k: [] for k in layers}
        steps: dict[str, dict[str, list[tuple[int, int, int]]]] = {k: {} for k in layers}
        me = os.getpid()
        for rnd in range(args.rounds + 1):
            for name, fn in layers.items():
                acks = _Acks()
                if breakdown is not None:
                    breakdown.take()
                before, bbefore = total_cpu_s(me), total_cpu_s(broker_pid)
                paced(args.rate, args.seconds, lambda i, fn=fn, acks=acks: fn(acks))
                acks.wait()
                used = total_cpu_s(me) - before
                bused = total_cpu_s(broker_pid) - bbefore
                if rnd == 0:
                    continue  # warm-up
                if breakdown is not None:
                    for label, (ns, calls) in breakdown.take().items():
                        steps[name].setdefault(label, []).append((ns, calls, acks.sent))
                cpu[name].append(1e6 * used / acks.sent)
                bcpu[name].append(1e6 * bused / acks.sent)
                p50[name].append(percentile(acks.lat, 0.5))
                p99[name].append(percentile(acks.lat, 0.99))
            if rnd:
                print(f"round {rnd} done", flush=True)
        producer.close()
    finally:
        cluster.shutdown()
        import ray

        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nmedians of {args.rounds} rounds at {args.rate} msg/s, 100 B, this process only")
    print(
        f"  {'layer':<12}{'CPU us/msg':>12}{'added':>10}{'ack p50 ms':>12}{'ack p99 ms':>12}"
        f"{'broker us/msg':>15}"
    )
    prev = None
    for name in cpu:
        c = statistics.median(cpu[name])
        added = "" if prev is None else f"{c - prev:+.0f}"
        prev = c
        print(
            f"  {name:<12}{c:>12.0f}{added:>10}"
            f"{statistics.median(p50[name]):>12.3f}{statistics.median(p99[name]):>12.3f}"
            f"{statistics.median(bcpu[name]):>15.0f}"
        )
    if breakdown is not None:
        print("\nsteps (--breakdown): CPU us a call (calls a message), medians of the rounds")
        for name, per_step in steps.items():
            rows = [
                (
                    label,
                    [ns / 1e3 / calls for ns, calls, _ in runs if calls],
                    [calls / sent for _, calls, sent in runs],
                )
                for label, runs in per_step.items()
            ]
            rows = [(label, us, per) for label, us, per in rows if us]
            if not rows:
                continue
            print(f"  {name}")
            for label, us, per in rows:
                print(
                    f"    {label:<34}{statistics.median(us):>8.1f}  (x{statistics.median(per):.2f})"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
