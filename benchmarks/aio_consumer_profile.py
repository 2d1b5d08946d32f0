"""Why the asyncio consumer falls behind the synchronous one under load: both ways in
the same run, with what each thread of this process did meanwhile.

    python benchmarks/aio_consumer_profile.py [--rounds 2] [--seconds 3] [--rate 1000]
                                              [--profile] [--ways sync,async,split]

Messages stamped with their send time at ``--rate`` a second, as in ``aio_bench.py``
(one broker, ASYNC_FLUSH, 100 B); the ways alternate, in reverse order every other
round, after an uncounted pass of each:

* sync: ``Producer.send_async`` paced on the main thread, a ``PullConsumer``
  long-polling on a thread (and the client's I/O thread under both);
* async: ``AsyncProducer`` and a coordinated ``AsyncConsumer`` on one event loop (the
  group's coordinator started before the run);
* split: the same ``AsyncConsumer`` on the main thread's loop, the ``AsyncProducer``
  on a loop of another thread (does sharing the loop with the producer matter?).

Per run: the produce -> consume p50 / p99 and the p50 of each second (a backlog
grows), the process's CPU time per message, and for each busy thread of the process
its CPU time and the time it waited for a CPU while runnable
(``/proc/self/task/<tid>/schedstat``); for the async ways, how late a 5 ms timer of
the loop fires (the loop's lag) p50 / p99. With ``--profile``, each way's consuming
thread runs under cProfile in one extra round, and its top functions are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
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
from actors.aio import AsyncConsumer, AsyncProducer  # noqa: E402
from actors.coordinator.host import coordinator_for  # noqa: E402
from storage import Message  # noqa: E402

BODY, STAMP = B.BODY, B.STAMP


def threads() -> dict[int, tuple[str, int, int]]:
    """tid -> (name, ns on a CPU, ns runnable but waiting for one), this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, wait, _ = (int(x) for x in f.read().split())
        except OSError:
            continue
        out[int(tid)] = (name, run, wait)
    return out


def thread_report(before: dict[int, tuple[str, int, int]], names: dict[int, str]) -> str:
    """The threads that ran for 50 ms or more since ``before``: CPU / wait in ms."""
    after, parts = threads(), []
    for tid, (name, run, wait) in sorted(after.items()):
        _, run0, wait0 = before.get(tid, (name, 0, 0))
        if run - run0 >= 50e6:
            label = names.get(tid, name)
            parts.append(f"{label} cpu {(run - run0) / 1e6:.0f} wait {(wait - wait0) / 1e6:.0f}")
    return "; ".join(parts)


class Lag:
    """How late a 5 ms timer of the running loop fires, until stopped."""

    def __init__(self) -> None:
        self.late: list[float] = []
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(0.005)
            self.late.append(loop.time() - t - 0.005)

    def stop(self) -> str:
        self.task.cancel()
        if not self.late:
            return ""
        p50, p99, _ = B.percentiles(self.late)
        return f"loop lag p50 {p50 * 1e3:.2f} p99 {p99 * 1e3:.2f} ms"


def by_second(ends: dict[float, float]) -> str:
    first = min(ends, default=0.0)
    secs: dict[int, list[float]] = {}
    for sent, end in ends.items():
        secs.setdefault(int(sent - first), []).append(end - sent)
    return " ".join(f"{statistics.median(v) * 1e3:.1f}" for _, v in sorted(secs.items()))


def sync_run(
    cluster: Any, rate: int, seconds: float, group: str, prof: cProfile.Profile | None
) -> tuple[dict[float, float], dict[int, str], str]:
    producer = cluster.producer(f"{group}-p")
    consumer = cluster.pull_consumer(group)
    queues = consumer.fetch_subscribe_queues(B.LAT_TOPIC)
    offsets = {mq: consumer.max_offset(mq) for mq in queues}
    times = B.pace(rate, seconds)
    ends: dict[float, float] = {}
    names = {threading.get_native_id(): "main(producer)"}

    def consume() -> None:
        names[threading.get_native_id()] = "consumer"
        if prof is not None:
            prof.enable()
        while len(ends) < len(times):
            for r in consumer.pull_many(list(offsets.items()), 256, long_poll_s=1.0):
                now = time.perf_counter()
                if r.status is B.PullStatus.FOUND:
                    for b in r.bodies:
                        ends[STAMP.unpack_from(b)[0]] = now
                offsets[r.queue] = r.next_offset
        if prof is not None:
            prof.disable()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    futures = []
    for at in times:
        while (now := time.perf_counter()) < at:
            time.sleep(min(at - now, 0.0005))
        futures.append(
            producer.send_async(Message(B.LAT_TOPIC, STAMP.pack(time.perf_counter()) + BODY))
        )
    for f in futures:
        f.result(timeout=30)
    reader.join(timeout=60)
    consumer.close()
    producer.close()
    return ends, names, ""


async def paced_sends(producer: AsyncProducer, times: list[float]) -> None:
    sends = []
    for at in times:
        wait = at - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        message = Message(B.LAT_TOPIC, STAMP.pack(time.perf_counter()) + BODY)
        sends.append(asyncio.ensure_future(producer.send(message)))
    await asyncio.gather(*sends)


async def async_run(
    namespace: str,
    rate: int,
    seconds: float,
    group: str,
    split: bool,
    prof: cProfile.Profile | None,
) -> tuple[dict[float, float], dict[int, str], str]:
    ends: dict[float, float] = {}
    names = {threading.get_native_id(): "main(loop)"}
    async with AsyncConsumer(group, B.LAT_TOPIC, namespace=namespace) as consumer:
        elsewhere = asyncio.new_event_loop() if split else None
        if elsewhere is not None:
            thread = threading.Thread(target=elsewhere.run_forever, daemon=True)
            thread.start()
            names[thread.native_id or 0] = "producer loop"

            def on_other(coro: Any) -> Any:
                assert elsewhere is not None
                return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, elsewhere))

            producer: AsyncProducer = await on_other(_new_producer(f"{group}-p", namespace))
        else:
            producer = await _new_producer(f"{group}-p", namespace)
        first = Message(B.LAT_TOPIC, STAMP.pack(0.0) + BODY)
        await (on_other(producer.send(first)) if elsewhere is not None else producer.send(first))
        await consumer.__anext__()  # the consumer has its queues and is pulling
        times = B.pace(rate, seconds)
        lag = Lag()

        async def consume() -> None:
            if prof is not None:
                prof.enable()
            async for m in consumer:
                ends[STAMP.unpack_from(m.body)[0]] = time.perf_counter()
                if len(ends) >= len(times):
                    break
            if prof is not None:
                prof.disable()

        reader = asyncio.ensure_future(consume())
        if elsewhere is not None:
            await on_other(paced_sends(producer, times))
            await on_other(producer.close())
            elsewhere.call_soon_threadsafe(elsewhere.stop)
        else:
            await paced_sends(producer, times)
            await producer.close()
        await asyncio.wait_for(reader, 60)
        lagged = lag.stop()
    return ends, names, lagged


async def _new_producer(group: str, namespace: str) -> AsyncProducer:
    producer = AsyncProducer(group, namespace=namespace)
    await producer.__aenter__()
    return producer


def top(prof: cProfile.Profile, n: int = 22) -> str:
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(n)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ways", default="sync,async,split")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    ways = args.ways.split(",")
    start_local_ray()
    root = tempfile.mkdtemp(prefix="raymq-aio-profile-")
    namespace = "raymq-aio-profile"
    cluster = actors.start_cluster(
        namespace=namespace,
        nameservers=1,
        brokers=1,
        store_root=root,
        topics=[actors.TopicConfig(B.LAT_TOPIC, 4, 4)],
        broker_options={"store": {"flush_disk_type": "ASYNC_FLUSH"}},
    )
    rounds = ["warm", *range(args.rounds), *(["profile"] if args.profile else [])]
    groups = [f"{way}-{r}" for r in rounds for way in ways if way != "sync"]
    # every coordinator up and idle before any run: none starts within a window
    handles = [coordinator_for(g, namespace) for g in groups]
    ray.get([h.ping.remote() for h in handles])
    got: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
    try:
        for i, r in enumerate(rounds):
            for way in ways if i % 2 == 0 else ways[::-1]:
                prof = cProfile.Profile() if r == "profile" else None
                before, cpu0 = threads(), time.process_time()
                seconds = 1.0 if r == "warm" else args.seconds
                if way == "sync":
                    ends, names, extra = sync_run(cluster, args.rate, seconds, f"s-{r}", prof)
                else:
                    run = async_run(
                        namespace, args.rate, seconds, f"{way}-{r}", way == "split", prof
                    )
                    ends, names, extra = asyncio.run(run)
                cpu = (time.process_time() - cpu0) / max(1, len(ends)) * 1e6
                lat = [end - sent for sent, end in ends.items() if sent > 0]
                p50, p99, _ = B.percentiles(lat)
                print(
                    f"round {r} {way}: p50 {p50 * 1e3:.1f} p99 {p99 * 1e3:.1f} ms"
                    f" | p50 by second {by_second({s: e for s, e in ends.items() if s > 0})}"
                    f" | process CPU {cpu:.0f} us/msg, load {os.getloadavg()[0]:.1f}"
                )
                print(f"    threads (ms): {thread_report(before, names)}  {extra}")
                if isinstance(r, int):
                    got[way].append((p50, p99))
                if prof is not None:
                    print(f"--- cProfile of the {way} consumer's thread, by own time ---")
                    print(top(prof))
        print("\nmedians of the rounds, p50 / p99 ms:")
        for way, runs in got.items():
            if runs:
                p50 = statistics.median(x[0] for x in runs)
                p99 = statistics.median(x[1] for x in runs)
                print(f"  {way:6s} {p50 * 1e3:.2f} / {p99 * 1e3:.2f}")
        if "sync" in got and got["sync"]:
            base = statistics.median(x[0] for x in got["sync"])
            for way, runs in got.items():
                if runs and way != "sync":
                    ratio = statistics.median(x[0] for x in runs) / base
                    print(f"  {way} / sync p50: {ratio:.2f}")
    finally:
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
