"""Where one message's latency goes, phase by phase, from ``send_async`` to the listener.

    python benchmarks/send_phases.py [--rates 50 1000] [--seconds 3] [--stages]

One broker (ASYNC_FLUSH), single 100 B ``send_async`` messages from this process at
each rate, a long-polling PushConsumer in its own process (an actor). The times are
taken where the message passes (``time.perf_counter`` in this process, the stamped
wall clock across processes), by wrapping two functions of the library in place in
this benchmark's own processes (the library itself is unchanged):

* ``call -> written``: ``send_async`` until its frame is written to the broker's socket
  (the producer's own path: budget, coalescer, encoder, sender, lanes, transport);
* ``written -> ack``: until the broker's answer settles the request's future on the
  client I/O thread (the broker's work and two wake-ups);
* ``ack -> callback``: until the caller's future runs its callback (the producer's
  acknowledgement chain);
* ``send -> consumer has it``: until the consumer's I/O thread decoded the pull answer
  holding it (wall clocks of two processes on one machine);
* ``send -> listener``: until the listener got it (what ``peers.py`` reports).

``--stages`` splits ``call -> written`` further at each layer's entry. Sends the
coalescer merged and sent from the I/O thread are counted in the totals only.

Read it beside a hot loop of the same code (``encode([m])`` alone takes ~17 us in a
loop here): the same code runs several times slower when a process wakes for each
message, so what a message costs is the amount of code on its way, not any one step.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
from _local import start_local_ray  # noqa: E402

import actors  # noqa: E402
from storage import Message  # noqa: E402

TOPIC = "Phases"
_STAGES = (  # (class path, method, stage name): each layer's entry on the way out
    ("actors.client.backpressure.AsyncSendBudget", "acquire", "budget"),
    ("actors.client.coalescer.SendCoalescer", "submit", "coalescer"),
    ("actors.client.encoder.MessageEncoder", "encode", "encoder"),
    ("actors.client.sender.Sender", "send_chunks_async", "sender"),
    ("actors.client.queue_selector.QueueSelector", "select", "queue selection"),
    ("actors.client.idempotence.Sequencer", "bind", "sequence binding"),
    ("actors.client.send_lanes.SendLanes", "send", "send lanes"),
    ("actors.client.transport.BrokerTransport", "call", "transport"),
    ("actors.protocol.data_path._Method", "remote", "broker stub"),
)


class _Consumer(peers._RayMQPushLatency):
    """The PushConsumer actor of ``peers.py``, also telling each message's age when the
    I/O thread decoded the pull answer that holds it."""

    def __init__(self, namespace: str, topic: str, data_path: str) -> None:
        from actors.client.push import pull_service
        from storage import codec

        self.decoded: list[float] = []
        unwrapped = pull_service.pulls_from_wire

        def timed(wire: Any, **kw: Any) -> Any:
            out = unwrapped(wire, **kw)
            now = time.time_ns()
            for raw in out:
                if raw.count:
                    for m in codec.decode_records(raw.data, check_crc=False):
                        self.decoded.append((now - int.from_bytes(m.body[:8], "big")) / 1e6)
            return out

        pull_service.pulls_from_wire = timed
        super().__init__(namespace, topic, data_path)

    def take_decoded(self) -> list[float]:
        out, self.decoded = self.decoded, []
        return out


class _Marks:
    """Per-send times, taken on the caller's thread as the send passes each layer."""

    def __init__(self, stages: bool) -> None:
        self.local = threading.local()
        from actors.protocol import connection

        unwrapped = connection.BrokerConnection.request
        marks = self

        def request(conn: Any, header: Any, body: Any = (), **kw: Any) -> Any:
            rec = getattr(marks.local, "rec", None)
            fut = unwrapped(conn, header, body, **kw)
            if rec is not None and "written" not in rec:
                rec["written"] = time.perf_counter()
                fut.add_done_callback(lambda _, r=rec: r.setdefault("ack", time.perf_counter()))
            return fut

        connection.BrokerConnection.request = request  # type: ignore[method-assign]
        if stages:
            for path, method, name in _STAGES:
                self._mark(path, method, name)

    def _mark(self, path: str, method: str, name: str) -> None:
        import importlib

        module, _, cls_name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), cls_name)
        unwrapped = getattr(cls, method)
        marks = self

        def entered(*args: Any, **kw: Any) -> Any:
            rec = getattr(marks.local, "rec", None)
            if rec is not None and name not in rec:
                rec[name] = time.perf_counter()
            return unwrapped(*args, **kw)

        setattr(cls, method, entered)


def _p(values: list[float], q: float) -> float:
    return peers.percentile(values, q)


def _phase(
    rate: int, args: argparse.Namespace, producer: Any, consumer: Any, marks: _Marks
) -> None:
    """One rate's sends, and their phases printed."""
    body = b"x" * 100
    recs: list[dict[str, float]] = []
    settled = threading.Semaphore(0)

    def answered(rec: dict[str, float], _: Any) -> None:
        rec["callback"] = time.perf_counter()
        settled.release()

    def one(i: int) -> None:
        rec = {"call": time.perf_counter()}
        marks.local.rec = rec
        try:
            fut = producer.send_async(Message(TOPIC, peers.stamp(body)))
        finally:
            marks.local.rec = None
        fut.add_done_callback(functools.partial(answered, rec))
        recs.append(rec)

    peers.paced(rate, args.seconds, one)
    for _ in recs:
        if not settled.acquire(timeout=60):
            raise TimeoutError("sends were not answered")
    listener = ray.get(consumer.take_when.remote(len(recs), 30.0))
    decoded = ray.get(consumer.take_decoded.remote())
    own = [r for r in recs if "ack" in r]  # written from the caller's thread
    print(
        f"\n{rate} msg/s: {len(recs)} sends, {len(own)} written by the caller"
        " (the others merged, sent from the I/O thread)"
    )
    print(f"  {'phase':<34}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}")

    def row(name: str, values: list[float], indent: str = "") -> None:
        print(
            f"  {indent + name:<34}{_p(values, 0.5):>9.3f}{_p(values, 0.9):>9.3f}"
            f"{_p(values, 0.99):>9.3f}"
        )

    def span(a: str, b: str) -> list[float]:
        return [1e3 * (r[b] - r[a]) for r in own if a in r and b in r]

    row("call -> written", span("call", "written"))
    if args.stages:
        names = ["call", *(n for _, _, n in _STAGES), "written"]
        present = [n for n in names if own and n in own[0]]
        for a, b in zip(present, present[1:]):
            row(f"{a} -> {b}", span(a, b), "  ")
    row("written -> ack", span("written", "ack"))
    row("ack -> callback", span("ack", "callback"))
    row("send -> callback (all sends)", [1e3 * (r["callback"] - r["call"]) for r in recs])
    row("send -> consumer has it", decoded)
    row("send -> listener", listener)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[50, 1000])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--stages", action="store_true", help="split the producer's own path")
    args = parser.parse_args()
    start_local_ray()
    root = tempfile.mkdtemp(prefix="raymq-phases-")
    namespace = "raymq-phases"
    cluster = actors.start_cluster(
        namespace=namespace,
        nameservers=1,
        brokers=1,
        store_root=root,
        topics=[actors.TopicConfig(TOPIC, 4, 4)],
        broker_options={"store": {"flush_disk_type": "ASYNC_FLUSH"}},
    )
    consumer: Any = None
    try:
        consumer = ray.remote(num_cpus=0)(_Consumer).remote(namespace, TOPIC, "socket")
        producer = cluster.producer("phases")
        body = b"x" * 100
        peers.warm_up(producer, consumer, TOPIC, body)
        ray.get(consumer.take_decoded.remote())
        marks = _Marks(args.stages)
        for rate in args.rates:
            _phase(rate, args, producer, consumer, marks)
        producer.close()
    finally:
        if consumer is not None:
            ray.get(consumer.close.remote())
            ray.kill(consumer)
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
