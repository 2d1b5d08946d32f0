"""Where a message's produce -> consume latency goes, hop by hop, for the synchronous
and the asyncio clients in the same run (the hops ``aio_bench.py`` only totals).

    python benchmarks/aio_hops.py [--rounds 2] [--seconds 3] [--rate 1000]

Messages stamped with their send time, as in ``aio_bench.py``; the client's frame
code in this process is wrapped to note when each message's frame is written and
when the pull answer carrying it is read (its body found in the frame), so each
message's latency splits into

* send -> write: the producer, from the caller's send to its frame on the socket;
* write -> arrive: the broker storing it, waking the held pull, answering, and the
  consumer's process reading the answer off its socket (a starved reader thread or
  event loop shows here);
* arrive -> body: the consumer, from the answer read to the message in the caller's
  hands (the loop body's first line, or ``pull_many`` returning).

Ways alternate in reverse order every other round: sync (``Producer.send_async``, a
``PullConsumer`` long-polling on a thread), async (``AsyncProducer`` and a coordinated
``AsyncConsumer`` on one loop) and uncoord (the same, ``coordinated=False``). Per run:
p50 / p99 of each hop in ms, the p50 of each second of the run (a backlog grows),
the process's CPU time per message, the coordinator hosts' CPU time during the
run and the load average; then the medians of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import aio_bench as B  # noqa: E402
from _local import start_local_ray  # noqa: E402

import actors  # noqa: E402
import actors.aio.connection as aio_connection  # noqa: E402
from actors.aio import AsyncConsumer, AsyncProducer  # noqa: E402
from actors.aio.connection import AsyncConnection  # noqa: E402
from actors.coordinator.host import coordinator_for  # noqa: E402
from actors.protocol import connection as sync_connection  # noqa: E402
from actors.protocol import frames  # noqa: E402
from actors.protocol.connection import BrokerConnection  # noqa: E402
from storage import Message  # noqa: E402

BODY, STAMP = B.BODY, B.STAMP
writes: dict[bytes, float] = {}  # stamp -> when its frame was written
arrivals: dict[bytes, float] = {}  # stamp -> when a frame carrying it was read


def scan(buf: Any, into: dict[bytes, float], t: float) -> None:
    b = bytes(buf)
    i = b.find(BODY)
    while i >= 8:
        into.setdefault(b[i - 8 : i], t)
        i = b.find(BODY, i + len(BODY))


def instrument() -> None:
    encode, write_frame = frames.encode, frames.write_frame

    def noting_encode(header: dict[str, Any], body: Any = ()) -> Any:
        t = time.perf_counter()
        for part in body:
            scan(part, writes, t)
        return encode(header, body)

    def noting_write(transport: Any, header: dict[str, Any], body: Any = ()) -> Any:
        t = time.perf_counter()
        for part in body:
            scan(part, writes, t)
        return write_frame(transport, header, body)

    setattr(sync_connection.frames, "encode", noting_encode)  # noqa: B010
    setattr(aio_connection.frames, "write_frame", noting_write)  # noqa: B010
    for cls in (BrokerConnection, AsyncConnection):

        def wrap(orig: Any) -> Any:
            def on_frame(self: Any, header: dict[str, Any], body: Any) -> None:
                scan(body, arrivals, time.perf_counter())
                orig(self, header, body)

            return on_frame

        setattr(cls, "_on_frame", wrap(cls._on_frame))  # noqa: B010


def sync_run(cluster: Any, rate: int, seconds: float, group: str) -> dict[bytes, float]:
    producer = cluster.producer(f"{group}-p")
    consumer = cluster.pull_consumer(group)
    queues = consumer.fetch_subscribe_queues(B.LAT_TOPIC)
    offsets = {mq: consumer.max_offset(mq) for mq in queues}
    times = B.pace(rate, seconds)
    ends: dict[bytes, float] = {}

    def consume() -> None:
        while len(ends) < len(times):
            for r in consumer.pull_many(list(offsets.items()), 256, long_poll_s=1.0):
                now = time.perf_counter()
                if r.status is B.PullStatus.FOUND:
                    for b in r.bodies:
                        ends[bytes(b[:8])] = now
                offsets[r.queue] = r.next_offset

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    futures = []
    for at in times:
        while (now := time.perf_counter()) < at:
            time.sleep(min(at - now, 0.0005))
        stamp = STAMP.pack(time.perf_counter())
        futures.append(producer.send_async(Message(B.LAT_TOPIC, stamp + BODY)))
    for f in futures:
        f.result(timeout=30)
    reader.join(timeout=60)
    consumer.close()
    producer.close()
    return ends


async def async_run(
    namespace: str, rate: int, seconds: float, group: str, coordinated: bool
) -> dict[bytes, float]:
    ends: dict[bytes, float] = {}
    async with (
        AsyncProducer(f"{group}-p", namespace=namespace) as producer,
        AsyncConsumer(group, B.LAT_TOPIC, namespace=namespace, coordinated=coordinated) as consumer,
    ):
        await producer.send(Message(B.LAT_TOPIC, STAMP.pack(0.0) + BODY))
        await consumer.__anext__()  # the consumer has its queues and is pulling
        times = B.pace(rate, seconds)

        async def consume() -> None:
            async for m in consumer:
                ends[bytes(m.body[:8])] = time.perf_counter()
                if len(ends) >= len(times):
                    return

        reader = asyncio.ensure_future(consume())
        sends = []
        for at in times:
            wait = at - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            stamp = STAMP.pack(time.perf_counter())
            sends.append(asyncio.ensure_future(producer.send(Message(B.LAT_TOPIC, stamp + BODY))))
        await asyncio.gather(*sends)
        await asyncio.wait_for(reader, 60)
    return ends


def coordinator_cpu_s() -> float:
    """CPU seconds of this machine's coordinator host processes started from our cwd."""
    total, cwd, tick = 0.0, os.getcwd(), os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if not f.read().startswith(b"ray::CoordinatorHost"):
                    continue
            if os.readlink(f"/proc/{pid}/cwd") != cwd:
                continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            continue
    return total


HOPS = ("send->write", "write->arrive", "arrive->body", "total")


def split(ends: dict[bytes, float]) -> dict[str, tuple[float, float]]:
    hops: dict[str, list[float]] = {h: [] for h in HOPS}
    by_second: dict[int, list[float]] = {}
    first = min((STAMP.unpack(k)[0] for k in ends if STAMP.unpack(k)[0] > 0), default=0.0)
    for k, end in ends.items():
        sent = STAMP.unpack(k)[0]
        if sent == 0.0 or k not in writes or k not in arrivals:
            continue
        w, a = writes[k], arrivals[k]
        for h, v in zip(HOPS, (w - sent, a - w, end - a, end - sent)):
            hops[h].append(v)
        by_second.setdefault(int(sent - first), []).append(end - sent)
    out = {h: B.percentiles(v)[:2] for h, v in hops.items() if v}
    seconds = " ".join(f"{statistics.median(v) * 1e3:.1f}" for _, v in sorted(by_second.items()))
    print(
        f"    n={len(hops['total'])}  "
        + "  ".join(f"{h} {p50 * 1e3:.2f}/{p99 * 1e3:.2f}" for h, (p50, p99) in out.items())
        + f"  | p50 by second {seconds}"
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    instrument()
    start_local_ray()
    root = tempfile.mkdtemp(prefix="raymq-aio-hops-")
    namespace = "raymq-aio-hops"
    cluster = actors.start_cluster(
        namespace=namespace,
        nameservers=1,
        brokers=1,
        store_root=root,
        topics=[actors.TopicConfig(B.LAT_TOPIC, 4, 4)],
        broker_options={"store": {"flush_disk_type": "ASYNC_FLUSH"}},
    )
    got: dict[str, list[dict[str, tuple[float, float]]]] = {"sync": [], "async": [], "uncoord": []}
    try:
        # each coordinated group's coordinator started, and idle, before the first run
        groups = ["warm-a", *(f"async{r}" for r in range(args.rounds))]
        ray.get([coordinator_for(g, namespace).ping.remote() for g in groups], timeout=120)
        sync_run(cluster, args.rate, 1.0, "warm-s")  # the cluster's first seconds: uncounted
        asyncio.run(async_run(namespace, args.rate, 1.0, "warm-a", True))
        asyncio.run(async_run(namespace, args.rate, 1.0, "warm-u", False))
        for r in range(args.rounds):
            kinds = list(got)
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                writes.clear()
                arrivals.clear()
                cpu0, coord0 = time.process_time(), coordinator_cpu_s()
                if kind == "sync":
                    ends = sync_run(cluster, args.rate, args.seconds, f"s{r}")
                else:
                    run = async_run(
                        namespace, args.rate, args.seconds, f"{kind}{r}", kind == "async"
                    )
                    ends = asyncio.run(run)
                cpu = (time.process_time() - cpu0) / max(1, len(ends)) * 1e6
                coord = coordinator_cpu_s() - coord0
                load = os.getloadavg()[0]
                print(
                    f"round {r + 1} {kind}: process CPU {cpu:.0f} us/message, "
                    f"coordinators' CPU {coord:.2f} s, load {load:.1f}"
                )
                got[kind].append(split(ends))
        print("\nmedians of the rounds, p50/p99 ms:")
        for kind, runs in got.items():
            line = "  ".join(
                f"{h} {statistics.median(x[h][0] for x in runs) * 1e3:.2f}"
                f"/{statistics.median(x[h][1] for x in runs) * 1e3:.2f}"
                for h in HOPS
            )
            print(f"  {kind:8s} {line}")
    finally:
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
