"""A steady produce -> consume load to hold a profiler against: one broker (ASYNC_FLUSH),
single ``send_async`` messages of 100 B from this process at ``--rate`` to a
PushConsumer actor (``delivery``), for ``--seconds``, after a warm-up.

    python benchmarks/steady_load.py [--rate 1000] [--seconds 20] [--delivery stream]
        [--pids FILE] [--broker-option KEY=VALUE ...]

When the load starts it prints (and writes to ``--pids``) the pids of the broker,
this producer and the consumer, so a profiler can be attached for the run::

    perf record -g -p $(jq .broker pids.json) -- sleep 10
    strace -c -f -p <pid>

At the end it prints the latency (p50/p99/p99.9) and each process's CPU per message
(``/proc``). ``--broker-option cluster_lease_s=0`` sets a broker option (a number or
a word) for an A/B run of one setting. Not a test: it prints figures.

``--segments`` also splits each message's latency where it passes, for all messages
and for those at or over the run's p99, and lists the first slow messages with the
four after each (a stall shows as a run of messages each ~1 ms less late):

* ``send -> stored``: the broker's store timestamp less the send time (the store's
  clock counts whole milliseconds, so this is -1 to 0 ms for a message stored within
  the millisecond it was sent);
* ``send -> consumer I/O``: until the consumer's I/O thread began handling the stream
  answer that held it (``StreamService._on_answer``, timed inside the consumer's
  process by wrapping it there; the library is unchanged);
* ``consumer I/O -> listener``: from there to the listener.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
from _local import actor_pids, cpu_s, start_local_ray  # noqa: E402
from latency_split import _Consumer  # noqa: E402

import actors  # noqa: E402
from storage import Message  # noqa: E402


def _watch_stream_answers() -> dict[bytes, int]:
    """Time, in this process, when the PushConsumer's I/O thread begins handling each
    stream answer, and note it for every message the answer buffers: the table of send
    stamp -> that time (ns). Kept on the class it wraps (this function may be pickled by
    value into the consumer's process: module globals would not be shared there)."""
    from actors.client.push import process_queue, stream_service

    service, queue = stream_service.StreamService, process_queue.ProcessQueue
    handled: dict[bytes, int] | None = getattr(service, "_steady_handled", None)
    if handled is not None:
        return handled
    handled = {}
    answer_at = [0]
    on_answer, take_result = service._on_answer, queue.take_result

    def timed_answer(self: Any, stream: Any, header: Any, body: Any) -> None:
        answer_at[0] = time.time_ns()
        on_answer(self, stream, header, body)

    def noted_take(self: Any, result: Any, messages: Any) -> int:
        messages = list(messages)
        for m in messages:
            handled[bytes(m.body[:8])] = answer_at[0]
        return take_result(self, result, messages)

    service._on_answer = timed_answer  # type: ignore[method-assign]
    queue.take_result = noted_take  # type: ignore[method-assign]
    service._steady_handled = handled  # type: ignore[attr-defined]
    return handled


class _SegmentedConsumer(_Consumer):
    """The PushConsumer actor, each message's latency split (``--segments``): rows of
    (send -> listener, send -> stored, send -> consumer I/O), ms."""

    def __init__(self, namespace: str, topic: str, delivery: str) -> None:
        self.handled = _watch_stream_answers()
        super().__init__(namespace, topic, delivery)

    def _on(self, msgs: list[Any]) -> Any:
        now = time.time_ns()
        rows = []
        for m in msgs:
            stamp = bytes(m.body[:8])
            sent = int.from_bytes(stamp, "big")
            handled = self.handled.pop(stamp, now)
            rows.append(
                ((now - sent) / 1e6, m.store_timestamp - sent / 1e6, (handled - sent) / 1e6)
            )
        with self.arrived:
            self.samples.extend(rows)  # type: ignore[arg-type]  # rows, not ages
            self.arrived.notify_all()
        return self.success


def _print_segments(rows: list[tuple[float, float, float]]) -> None:
    ages = sorted(r[0] for r in rows)
    p99 = ages[min(len(ages) - 1, int(len(ages) * 0.99))]
    slow = [i for i, r in enumerate(rows) if r[0] >= p99]
    for name, picked in (("all", range(len(rows))), (f"at or over p99 ({p99:.2f} ms)", slow)):
        parts = [
            ("send -> stored", [rows[i][1] for i in picked]),
            ("send -> consumer I/O", [rows[i][2] for i in picked]),
            ("consumer I/O -> listener", [rows[i][0] - rows[i][2] for i in picked]),
        ]
        print(
            f"  {name}, {len(picked)} messages, median ms: "
            + ", ".join(f"{what} {statistics.median(v):.2f}" for what, v in parts)
        )
    firsts = [i for i in slow if i - 1 not in slow]
    print(f"  {len(firsts)} runs of slow messages; the first ones (ms: latency / to consumer I/O):")
    for i in firsts[:8]:
        print(
            f"    #{i}: "
            + "  ".join(
                f"{rows[j][0]:.2f}/{rows[j][2]:.2f}" for j in range(i, min(len(rows), i + 5))
            )
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--delivery", choices=("stream", "pull"), default="stream")
    parser.add_argument("--pids", metavar="FILE", help="write the pids here as JSON")
    parser.add_argument(
        "--segments", action="store_true", help="split each message's latency where it passes"
    )
    parser.add_argument(
        "--broker-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a BrokerConfig option for this run (repeatable)",
    )
    args = parser.parse_args()
    options: dict[str, Any] = {"store": {"flush_disk_type": "ASYNC_FLUSH"}}
    for item in args.broker_option:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--broker-option takes KEY=VALUE, got {item!r}")
        try:  # a number, true/false, a JSON object; anything else is a word
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    start_local_ray()
    root = tempfile.mkdtemp(prefix="raymq-steady-")
    namespace, topic = "raymq-steady", "Steady"
    cluster = actors.start_cluster(
        namespace=namespace,
        nameservers=1,
        brokers=1,
        store_root=root,
        topics=[actors.TopicConfig(topic, 4, 4)],
        broker_options=options,
    )
    consumer: Any = None
    try:
        producer = cluster.producer("steady")
        body = b"x" * 100
        kind = _SegmentedConsumer if args.segments else _Consumer
        consumer = ray.remote(num_cpus=0)(kind).remote(namespace, topic, args.delivery)
        peers.warm_up(producer, consumer, topic, body)
        # a fresh CommitLog is faulted in over the first seconds: let that pass
        sends = peers.Settled()
        peers.paced(
            args.rate, 3.0, lambda i: sends.track(producer.send_async(Message(topic, body)))
        )
        sends.wait()
        ray.get(consumer.take_when.remote(sends.sent, 30.0))
        pids = {
            "broker": actor_pids("Broker")[0],
            "producer": os.getpid(),
            "consumer": ray.get(consumer.pid.remote()),
        }
        if args.pids:
            with open(args.pids, "w") as f:
                json.dump(pids, f)
        print(f"load: {json.dumps(pids)}", flush=True)
        before = {k: cpu_s(p) for k, p in pids.items()}
        sends = peers.Settled()
        peers.paced(
            args.rate,
            args.seconds,
            lambda i: sends.track(producer.send_async(Message(topic, peers.stamp(body)))),
        )
        sends.wait()
        got: list[Any] = ray.get(consumer.take_when.remote(sends.sent, 30.0))
        lat: list[float] = [r[0] for r in got] if args.segments else got
        after = {k: cpu_s(p) for k, p in pids.items()}
        n = sends.sent
        print(
            f"latency p50 {peers.percentile(lat, 0.5):.2f} ms p99 {peers.percentile(lat, 0.99):.2f}"
            f" ms p99.9 {peers.percentile(lat, 0.999):.2f} ms; CPU us/msg user+sys: "
            + ", ".join(
                f"{k} {1e6 * (after[k][0] - before[k][0]) / n:.0f}"
                f"+{1e6 * (after[k][1] - before[k][1]) / n:.0f}"
                for k in pids
            ),
            flush=True,
        )
        if args.segments and got:
            _print_segments(got)
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
    raise SystemExit(main())
