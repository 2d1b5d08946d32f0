"""What a message's steps cost when each comes a millisecond after the last, against
the same steps back to back, in one process.

    python benchmarks/cold_steps.py [--gap-ms 1] [--calls 2000] [--rounds 3]

At 1,000 msg/s a message's path runs once a millisecond. This measures, in one
thread, each step of that path alone (no Ray, no sockets): called back to back
("warm"), then each call after ``--gap-ms`` of other work on the same thread (a
loop reading the clock: the thread keeps its core, so what changes is only the time
that passed), then after ``--gap-ms`` of sleep (the core idles, as a process waiting
for its next message does). Two floors run beside the steps: a small Python function
(a few attribute reads, a dict and a loop: the interpreter alone) and a CRC-32 of
4 KiB (native code over data). Each figure is the CPU time of the call
(``time.thread_time_ns``: other processes do not change it), the mean over
``--calls``, the median of ``--rounds`` that alternate the order of the three ways;
the ratios are to the warm figure of the same round.

What it shows on a VM whose cores are shared with other tenants: the caches hold
little of a process across a millisecond even while its thread runs, so every step
of Python costs several times its warm figure at 1,000 msg/s, and native code over
data much less. What a message costs there grows with the code and the objects its
path touches, not only with what it computes. The steps:

* ``encode``: the producer's ``MessageEncoder.encode`` of one 100 B message;
* ``frame``: the send's wire parts and frame (``EncodedBatch.wire_parts``,
  ``frames.encode``);
* ``decode``: the broker's ``EncodedBatch.from_bytes`` of an idempotent producer's
  one-message send (parse and check);
* ``put``: ``MessageStore.put_encoded`` of it (ASYNC_FLUSH, a 64 MiB CommitLog file
  on a temporary directory, deleted: a put's cost does not depend on the file's size,
  and 64 MiB is faulted in fast);
* ``ack``: the broker's ``SendAck.to_wire`` and the producer's ``SendAck.from_wire``.

Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator

from actors.client.encoder import MessageEncoder
from actors.config.client import ProducerConfig
from actors.protocol import frames
from actors.protocol.wire import SendAck
from storage import Message, MessageStore, StoreConfig, codec
from storage._fast_encode import encode_plain
from storage.seq_slots import seq_slot

WAYS = ("warm", "spin", "sleep")


class _Small:
    def __init__(self) -> None:
        self.a, self.b, self.c = 1, 2, {"x": 3}


def small_python() -> int:
    """The interpreter alone: an object, attribute reads, a dict, a loop."""
    o, total = _Small(), 0
    for _ in range(10):
        total += o.a + o.b + o.c["x"]
    return total


def sends(n: int) -> list[bytes]:
    """``n`` one-message sends of an idempotent producer to queue 0, as the wire has them."""
    uniq = codec.UniqueKeyGenerator()
    born = codec.host_to_bytes("127.0.0.1:1")
    slot = seq_slot("cold-producer")
    now = int(time.time() * 1000)
    return [
        encode_plain([Message("Cold", b"x" * 100)], 4 << 20, now, born, uniq, slot)
        .with_sequence("cold-producer", 0, seq, 0)
        .to_bytes()
        for seq in range(n)
    ]


def gap(way: str, seconds: float) -> None:
    if way == "spin":
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    elif way == "sleep":
        time.sleep(seconds)


def mean_us(step: Callable[[int], object], calls: int, way: str, seconds: float) -> float:
    """The mean CPU time of ``step(i)`` for ``i`` in ``range(calls)``, each after ``way``."""
    clock = time.thread_time_ns
    total = 0
    for i in range(calls):
        gap(way, seconds)
        started = clock()
        step(i)
        total += clock() - started
    return total / calls / 1000


def steps(calls: int, root: str) -> Iterator[tuple[str, Callable[[int], object]]]:
    """Each step, ready for ``calls`` calls (inputs made beforehand)."""
    data = b"y" * 4096
    yield "small Python function", lambda i: small_python()
    yield "CRC-32 of 4 KiB", lambda i: zlib.crc32(data)
    encoder = MessageEncoder(ProducerConfig())
    message = Message("Cold", b"x" * 100)
    yield "encode", lambda i: encoder.encode([message])
    chunk = encoder.encode([message])[0].batch.with_queue(0)
    header = {"m": "send", "a": [0], "o": 1, "f": 0}
    yield "frame", lambda i: frames.encode(header, codec.EncodedBatch.wire_parts([chunk]))
    wire = sends(calls)
    decoded = [codec.EncodedBatch.from_bytes(b) for b in wire]  # fresh ones for the puts
    yield "decode", lambda i: codec.EncodedBatch.from_bytes(wire[i])
    store = MessageStore(
        StoreConfig(root, flush_disk_type="ASYNC_FLUSH", commitlog_file_size=64 << 20),
        start_services=False,
    )
    try:
        results = [store.put_encoded(b) for b in decoded[: calls // 2]]  # faults the file in
        again = [codec.EncodedBatch.from_bytes(b) for b in sends(2 * calls)[calls // 2 :]]
        at = [0]

        def put(i: int) -> object:
            at[0] += 1
            return store.put_encoded(again[at[0] - 1])

        yield "put", put
        result = results[-1]
        ack = SendAck(
            result.status, "broker-a", "127.0.0.1:1", result.queue_offsets, result.commitlog_offsets
        )
        yield "ack to_wire", lambda i: ack.to_wire()
        ack_wire = ack.to_wire()
        yield "ack from_wire", lambda i: SendAck.from_wire(ack_wire)
    finally:
        store.close()


def one_round(calls: int, seconds: float, order: tuple[str, ...]) -> dict[str, dict[str, float]]:
    root = tempfile.mkdtemp(prefix="raymq-cold-steps-")
    try:
        got: dict[str, dict[str, float]] = {}
        for name, step in steps(calls, root):
            if name != "put":  # a put takes a fresh send each time: warmed by the puts before
                for _ in range(200):  # warmed: imports, first calls, caches of our own
                    step(0)
            row = got[name] = {}
            for way in order:
                n = calls // 4 if name == "put" and way != "warm" else calls
                row[way] = mean_us(step, n, way, seconds)
        return got
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gap-ms", type=float, default=1.0)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    seconds = args.gap_ms / 1000
    rounds = []
    for rnd in range(args.rounds):
        order = WAYS if rnd % 2 == 0 else tuple(reversed(WAYS))
        rounds.append(one_round(args.calls, seconds, order))
        print(f"round {rnd + 1} of {args.rounds} done", flush=True)
    print(
        f"CPU per call (us): warm, and after {args.gap_ms:g} ms of a loop on the same thread"
        f" (spin) or of sleep; medians of {args.rounds} rounds, ratios to warm"
    )
    print(f"  {'':24s}{'warm':>8s}{'spin':>8s}{'sleep':>8s}{'spin/w':>8s}{'sleep/w':>8s}")
    for name in rounds[0]:
        med = {w: statistics.median(r[name][w] for r in rounds) for w in WAYS}
        ratio = {w: statistics.median(r[name][w] / r[name]["warm"] for r in rounds) for w in WAYS}
        print(
            f"  {name:24s}{med['warm']:>8.1f}{med['spin']:>8.1f}{med['sleep']:>8.1f}"
            f"{ratio['spin']:>8.1f}{ratio['sleep']:>8.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
