"""A steady produce -> consume load to hold a profiler against: one broker (ASYNC_FLUSH),
single ``send_async`` messages of 100 B from this process at ``--rate`` to a
PushConsumer actor (``delivery``), for ``--seconds``, after a warm-up.

    python benchmarks/steady_load.py [--rate 1000] [--seconds 20] [--delivery stream]
        [--consume-on-io-thread]
        [--pids FILE] [--broker-option KEY=VALUE ...]

When the load starts it prints (and writes to ``--pids``) the pids of the broker,
this producer and the consumer, so a profiler can be attached for the run::

    perf record -g -p $(jq .broker pids.json) -- sleep 10
    strace -c -f -p <pid>

At the end it prints the latency (p50/p99/p99.9), each process's CPU per message and
the time its threads spent runnable but waiting for a core, per message (``/proc``'s
stat and schedstat). ``--broker-option cluster_lease_s=0`` sets a broker option (a number or
a word) for an A/B run of one setting. Not a test: it prints figures.

``--segments`` also splits each message's latency where it passes, for all messages
and for those at or over the run's p99, and lists the first slow messages with the
four after each (a stall shows as a run of messages each ~1 ms less late). The times
are taken by wrapping functions of the library in the run's own processes (a Ray
setup hook in the broker's; the library is unchanged), on one machine's clock:

* ``send -> broker``: until the broker's data path took the SEND (``send_now``; the
  first one after the send: at 1,000 msg/s a SEND holds one message);
* ``broker -> stream write``: until the broker wrote the next stream answer after it
  (``ServerStream.send``);
* ``stream write -> consumer I/O``: until the consumer's I/O thread began handling the
  stream answer that held it (``StreamService._on_answer``);
* ``consumer I/O -> listener``: from there to the listener.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np
import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
from _local import actor_pids, cpu_s, run_wait_s, start_local_ray  # noqa: E402
from latency_split import _Consumer  # noqa: E402

import actors  # noqa: E402
from actors.config.cluster import LOCAL_RAY_WORKER_NICENESS  # noqa: E402
from storage import Message  # noqa: E402

ENV_MARKS = "RAYMQ_STEADY_MARKS"
"""The directory a broker's process writes its marks to (``--segments``)."""


def mark_broker() -> None:
    """Ray workers' setup hook (``--segments``): in the broker's process, note when each
    SEND reaches the data path's fast path and when each stream answer with records is
    written (ns), and how long the SEND's decoding and check (``parse_send_one``), its
    put (``MessageStore.put_one_send``) and the whole of ``send_now`` took (ns), appended every 0.2 s by a thread of its own to
    ``<kind>-<pid>.bin`` (int64) in the directory ``RAYMQ_STEADY_MARKS`` names."""
    out = os.environ.get(ENV_MARKS)
    if not out:
        return
    import threading
    from array import array

    from actors.broker.processor import send as sending
    from actors.protocol import frame_server
    from storage.store import MessageStore

    kinds = ("puts", "writes", "send_now", "decode", "put")
    marks = {kind: array("q") for kind in kinds}
    puts, writes = marks["puts"], marks["writes"]
    send_now, stream_send = sending.SendMessageProcessor.send_now, frame_server.ServerStream.send
    parse_send_one, put_one_send = sending.parse_send_one, MessageStore.put_one_send

    def timed_send_now(self: Any, blob: Any) -> Any:
        started = time.time_ns()
        puts.append(started)
        try:
            return send_now(self, blob)
        finally:
            marks["send_now"].append(time.time_ns() - started)

    def timing(fn: Any, kind: str) -> Any:
        """``fn`` noting how long each call took (ns) among ``marks[kind]``."""
        took = marks[kind]

        def timed(*args: Any) -> Any:
            started = time.perf_counter_ns()
            try:
                return fn(*args)
            finally:
                took.append(time.perf_counter_ns() - started)

        return timed

    sending.parse_send_one = timing(parse_send_one, "decode")
    MessageStore.put_one_send = timing(put_one_send, "put")  # type: ignore[method-assign]

    async def timed_stream_send(self: Any, fields: dict[str, Any], parts: list[Any]) -> bool:
        if "k" in fields:
            writes.append(time.time_ns())
        return await stream_send(self, fields, parts)

    sending.SendMessageProcessor.send_now = timed_send_now  # type: ignore[method-assign]
    frame_server.ServerStream.send = timed_stream_send  # type: ignore[method-assign]

    def flush() -> None:
        done = dict.fromkeys(marks, 0)
        while True:
            time.sleep(0.2)
            for name, got in marks.items():
                n = len(got)
                if n > done[name]:
                    with open(os.path.join(out, f"{name}-{os.getpid()}.bin"), "ab") as f:
                        got[done[name] : n].tofile(f)
                    done[name] = n

    threading.Thread(target=flush, name="steady-marks", daemon=True).start()


def _marks(out: str, name: str) -> np.ndarray:
    """Every process's marks of one kind, sorted."""
    found = [
        np.fromfile(os.path.join(out, f), np.int64)
        for f in os.listdir(out)
        if f.startswith(f"{name}-")
    ]
    return np.sort(np.concatenate(found)) if found else np.zeros(0, np.int64)


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
    (send -> listener ms, send -> consumer I/O ms, the send's time ns)."""

    def __init__(self, namespace: str, topic: str, delivery: str, **options: Any) -> None:
        self.handled = _watch_stream_answers()
        super().__init__(namespace, topic, delivery, **options)
        # its rows (tuples, which the collector tracks) pile up over the run and set off
        # full collections: unfrozen, each walked the ~93,000 objects of the process in
        # 55-60 ms, the 40-75 ms p99.9 of segmented runs that plain ones did not have
        gc.collect()
        gc.freeze()

    def _on(self, msgs: list[Any]) -> Any:
        now = time.time_ns()
        rows = []
        for m in msgs:
            stamp = bytes(m.body[:8])
            sent = int.from_bytes(stamp, "big")
            handled = self.handled.pop(stamp, now)
            rows.append(((now - sent) / 1e6, (handled - sent) / 1e6, sent))
        with self.arrived:
            self.samples.extend(rows)  # type: ignore[arg-type]  # rows, not ages
            self.arrived.notify_all()
        return self.success


def _print_segments(rows: list[tuple[float, float, int]], marks: str) -> None:
    puts, writes = _marks(marks, "puts"), _marks(marks, "writes")
    took = {k: float(np.median(_marks(marks, k))) / 1e3 for k in ("send_now", "decode", "put")}
    print(
        f"  the broker's SEND, median us: send_now {took['send_now']:.0f} (decoding and "
        f"check {took['decode']:.0f}, put {took['put']:.0f})"
    )
    sent = np.array([r[2] for r in rows], np.int64)
    age = np.array([r[0] for r in rows])
    to_io = np.array([r[1] for r in rows])
    # each message's SEND: the first the broker took after it was sent; its stream
    # write: the first after that (the last mark when none: the run's end)
    put = puts[np.minimum(np.searchsorted(puts, sent), len(puts) - 1)]
    write = writes[np.minimum(np.searchsorted(writes, put), len(writes) - 1)]
    segments = [
        ("send -> broker", (put - sent) / 1e6),
        ("broker -> stream write", (write - put) / 1e6),
        ("stream write -> consumer I/O", to_io - (write - sent) / 1e6),
        ("consumer I/O -> listener", age - to_io),
    ]
    p99 = float(np.quantile(age, 0.99))
    slow = np.flatnonzero(age >= p99)
    for name, picked in (("all", np.arange(len(rows))), (f"at or over p99 ({p99:.2f} ms)", slow)):
        print(f"  {name}, {len(picked)} messages, median ms:")
        for what, values in segments:
            print(f"    {what:30s} {float(np.median(values[picked])):6.2f}")
    firsts = [int(i) for i in slow if i - 1 not in set(slow.tolist())]
    print(f"  {len(firsts)} runs of slow messages; the first ones, ms (segments as above):")
    for i in firsts[:8]:
        print(
            f"    #{i}: latency "
            + " ".join(f"{age[j]:.2f}" for j in range(i, min(len(rows), i + 5)))
            + "; first: "
            + " / ".join(f"{values[i]:.2f}" for _, values in segments)
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--delivery", choices=("stream", "pull"), default="stream")
    parser.add_argument(
        "--consume-on-io-thread",
        action="store_true",
        help="the listener on the consumer's I/O thread (PushConsumerConfig.consume_on_io_thread)",
    )
    parser.add_argument("--pids", metavar="FILE", help="write the pids here as JSON")
    parser.add_argument(
        "--segments", action="store_true", help="split each message's latency where it passes"
    )
    parser.add_argument(
        "--worker-nice",
        type=int,
        default=LOCAL_RAY_WORKER_NICENESS,
        help="the niceness of Ray's workers (Ray's own default: 15)",
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
    marks = tempfile.mkdtemp(prefix="raymq-steady-marks-") if args.segments else None
    if marks is not None:
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
        start_local_ray(
            runtime_env={
                "env_vars": {ENV_MARKS: marks, "PYTHONPATH": path},
                "worker_process_setup_hook": "steady_load.mark_broker",
            },
            worker_niceness=args.worker_nice,
        )
    else:
        start_local_ray(worker_niceness=args.worker_nice)
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
        consumer = ray.remote(num_cpus=0)(kind).remote(
            namespace, topic, args.delivery, consume_on_io_thread=args.consume_on_io_thread
        )
        peers.warm_up(producer, consumer, topic, body)
        # a fresh CommitLog is faulted in over the first seconds: let that pass
        sends = peers.Settled()
        peers.paced(
            args.rate,
            3.0,
            lambda i: sends.track(producer.send_async(Message(topic, peers.stamp(body)))),
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
        waited = {k: run_wait_s(p) for k, p in pids.items()}
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
        waited = {k: run_wait_s(p) - waited[k] for k, p in pids.items()}
        n = sends.sent
        print(
            f"latency p50 {peers.percentile(lat, 0.5):.2f} ms p99 {peers.percentile(lat, 0.99):.2f}"
            f" ms p99.9 {peers.percentile(lat, 0.999):.2f} ms; CPU us/msg user+sys: "
            + ", ".join(
                f"{k} {1e6 * (after[k][0] - before[k][0]) / n:.0f}"
                f"+{1e6 * (after[k][1] - before[k][1]) / n:.0f}"
                for k in pids
            )
            + "; waiting for a core us/msg: "
            + ", ".join(f"{k} {1e6 * waited[k] / n:.0f}" for k in pids),
            flush=True,
        )
        duplicates = ray.get(consumer.duplicates_seen.remote())
        if duplicates or len(lat) != n:  # at least once: say so when it shows
            print(f"arrived {len(lat)} of {n} sent; duplicates since the start: {duplicates}")
        if marks is not None and got:
            time.sleep(0.5)  # the broker's marks thread writes what it noted last
            _print_segments(got, marks)
        producer.close()
    finally:
        if consumer is not None:
            ray.get(consumer.close.remote())
            ray.kill(consumer)
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
        if marks is not None:
            shutil.rmtree(marks, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
