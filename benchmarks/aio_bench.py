"""The asyncio clients beside the synchronous ones, in the same run.

    python benchmarks/aio_bench.py [--rate 1000] [--seconds 5] [--warmup 0.5]
                                   [--messages 20000] [--rounds 3]

One broker (ASYNC_FLUSH), 100 B messages, producer and consumer in this process:

* latency: messages sent at ``--rate`` a second for ``--warmup`` then ``--seconds``
  seconds, each stamped with its send time, and the time from the send to the
  consumer handing it over, of the messages sent after the warm-up (a run's own
  start, its connections and first pulls, is not the steady state measured; every
  coordinated group's coordinator is started, and idle, before the first run):
  sync (``Producer.send_async`` paced on a thread, a ``PullConsumer`` long-polling on a
  thread) against async (``await AsyncProducer.send`` paced on the loop, ``async for``
  over an ``AsyncConsumer`` of a coordinated group, the default); p50, p99 and p99.9
  of each, and async / sync; and the same ``AsyncConsumer`` with ``coordinated=False``
  beside it, and coordinated / uncoordinated;
* rate: ``--messages`` single messages, ``await send(message)`` from 256 tasks on one
  loop against ``send_async(message)`` futures from one thread (all answered), in
  messages a second, and async / sync;
* transactions: ``--messages`` / 10 one-message transactions committed one after
  another (half message, local transaction, end answered by the broker):
  ``TransactionProducer.send_message_in_transaction`` (``end_oneway=False``) against
  ``await AsyncTransactionalProducer.send_message_in_transaction``, a second each.

The ways alternate ``--rounds`` times in the one run (the machine's drift is shared),
the latency runs in reverse order every other round so that none always runs first,
after one uncounted pass of each (the cluster's first seconds); each round's figures
are printed and the ratios are the medians'.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from typing import Any

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _local import start_local_ray  # noqa: E402

import actors  # noqa: E402
from actors import LocalTransactionState, PullStatus, TransactionProducer  # noqa: E402
from actors.aio import AsyncConsumer, AsyncProducer, AsyncTransactionalProducer  # noqa: E402
from actors.coordinator.host import coordinator_for  # noqa: E402
from storage import Message  # noqa: E402

STAMP = struct.Struct(">d")
BODY = b"x" * (100 - STAMP.size)
LAT_TOPIC, RATE_TOPIC, TXN_TOPIC = "AioLatency", "AioRate", "AioTxn"
COMMIT = LocalTransactionState.COMMIT_MESSAGE


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    s = sorted(samples)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
    return pick(0.5), pick(0.99), pick(0.999)


def pace(rate: int, seconds: float) -> list[float]:
    start = time.perf_counter() + 0.05
    return [start + i / rate for i in range(int(rate * seconds))]


# ------------------------------------------------------------ latency, sync
def sync_latency(
    cluster: Any, rate: int, seconds: float, group: str, warmup_s: float = 0.0
) -> list[float]:
    producer = cluster.producer(f"{group}-p")
    consumer = cluster.pull_consumer(group)
    queues = consumer.fetch_subscribe_queues(LAT_TOPIC)
    offsets = {mq: consumer.max_offset(mq) for mq in queues}
    times = pace(rate, warmup_s + seconds)
    measured_from = times[int(rate * warmup_s)]
    latencies: list[float] = []
    received = [0]
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set() or received[0] < len(times):
            results = consumer.pull_many(list(offsets.items()), 256, long_poll_s=1.0)
            now = time.perf_counter()
            for r in results:
                if r.status is PullStatus.FOUND:
                    for b in r.bodies:
                        sent = STAMP.unpack_from(b)[0]
                        received[0] += 1
                        if sent >= measured_from:
                            latencies.append(now - sent)
                offsets[r.queue] = r.next_offset
            if stop.is_set() and received[0] >= len(times):
                return

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    futures = []
    for at in times:
        while (now := time.perf_counter()) < at:
            time.sleep(min(at - now, 0.0005))
        futures.append(
            producer.send_async(Message(LAT_TOPIC, STAMP.pack(time.perf_counter()) + BODY))
        )
    for f in futures:
        f.result(timeout=30)
    stop.set()
    reader.join(timeout=30)
    consumer.close()
    producer.close()
    return latencies


# ------------------------------------------------------------ latency, async
async def async_latency(
    namespace: str,
    rate: int,
    seconds: float,
    group: str,
    coordinated: bool = True,
    warmup_s: float = 0.0,
) -> list[float]:
    latencies: list[float] = []
    async with (
        AsyncProducer(f"{group}-p", namespace=namespace) as producer,
        AsyncConsumer(group, LAT_TOPIC, namespace=namespace, coordinated=coordinated) as consumer,
    ):
        await producer.send(Message(LAT_TOPIC, STAMP.pack(time.perf_counter()) + BODY))
        await consumer.__anext__()  # the consumer has its queues and is pulling
        times = pace(rate, warmup_s + seconds)
        measured_from = times[int(rate * warmup_s)]
        received = 0

        async def consume() -> None:
            nonlocal received
            async for m in consumer:
                sent = STAMP.unpack_from(m.body)[0]
                received += 1
                if sent >= measured_from:
                    latencies.append(time.perf_counter() - sent)
                if received >= len(times):
                    return

        reader = asyncio.ensure_future(consume())
        sends = []
        for at in times:
            wait = at - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            message = Message(LAT_TOPIC, STAMP.pack(time.perf_counter()) + BODY)
            sends.append(asyncio.ensure_future(producer.send(message)))
        await asyncio.gather(*sends)
        await asyncio.wait_for(reader, 60)
    return latencies


# ------------------------------------------------------------ rate
def sync_rate(cluster: Any, n: int) -> float:
    producer = cluster.producer("rate-sync")
    producer.send(Message(RATE_TOPIC, BODY))  # routes, connection, producer id
    message = Message(RATE_TOPIC, BODY)
    t0 = time.perf_counter()
    futures = [producer.send_async(message) for _ in range(n)]
    for f in futures:
        f.result(timeout=60)
    elapsed = time.perf_counter() - t0
    producer.close()
    return n / elapsed


async def async_rate(namespace: str, n: int, tasks: int = 256) -> float:
    async with AsyncProducer("rate-async", namespace=namespace) as producer:
        await producer.send(Message(RATE_TOPIC, BODY))
        message = Message(RATE_TOPIC, BODY)
        per = n // tasks

        async def worker() -> None:
            for _ in range(per):
                await producer.send(message)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(tasks)))
        return per * tasks / (time.perf_counter() - t0)


# ------------------------------------------------------------ transactions
class Commit:
    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return COMMIT

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        return COMMIT


def sync_txn_rate(namespace: str, n: int) -> float:
    producer = TransactionProducer("txn-sync", Commit(), namespace=namespace, end_oneway=False)
    try:
        producer.send_message_in_transaction(Message(TXN_TOPIC, BODY))  # routes, connection
        t0 = time.perf_counter()
        for _ in range(n):
            producer.send_message_in_transaction(Message(TXN_TOPIC, BODY))
        return n / (time.perf_counter() - t0)
    finally:
        producer.close()


async def async_txn_rate(namespace: str, n: int) -> float:
    async def execute(message: Message) -> LocalTransactionState:
        return COMMIT

    async with AsyncTransactionalProducer("txn-async", namespace=namespace) as producer:
        await producer.send_message_in_transaction(Message(TXN_TOPIC, BODY), execute)
        t0 = time.perf_counter()
        for _ in range(n):
            await producer.send_message_in_transaction(Message(TXN_TOPIC, BODY), execute)
        return n / (time.perf_counter() - t0)


def latency_run(cluster: Any, namespace: str, args: Any, kind: str, r: int) -> list[float]:
    """One latency run of ``kind`` ("sync", "async" or "uncoord"), round ``r``."""
    group = f"lat-{kind}-{r}"
    if kind == "sync":
        return sync_latency(cluster, args.rate, args.seconds, group, args.warmup)
    coordinated = kind == "async"
    return asyncio.run(
        async_latency(namespace, args.rate, args.seconds, group, coordinated, args.warmup)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=0.5)
    args = parser.parse_args()
    start_local_ray()
    root = tempfile.mkdtemp(prefix="raymq-aio-bench-")
    namespace = "raymq-aio-bench"
    cluster = actors.start_cluster(
        namespace=namespace,
        nameservers=1,
        brokers=1,
        store_root=root,
        topics=[
            actors.TopicConfig(LAT_TOPIC, 4, 4),
            actors.TopicConfig(RATE_TOPIC, 4, 4),
            actors.TopicConfig(TXN_TOPIC, 4, 4),
        ],
        broker_options={"store": {"flush_disk_type": "ASYNC_FLUSH"}},
    )
    lat: dict[str, list[tuple[float, float, float]]] = {"sync": [], "async": [], "uncoord": []}
    rate: dict[str, list[float]] = {"sync": [], "async": []}
    txn: dict[str, list[float]] = {"sync": [], "async": []}
    n_txn = max(1, args.messages // 10)
    try:
        # each coordinated group's coordinator (and the coordinator host, a Ray worker
        # process) started and idle before the first run, so none starts within a window
        groups = ["lat-warm-async", *(f"lat-async-{r}" for r in range(args.rounds))]
        ray.get([coordinator_for(g, namespace).ping.remote() for g in groups], timeout=120)
        # the cluster's first seconds (its broker warming up, Ray starting workers)
        # would fall on whichever way ran first: a pass of each, not counted
        sync_latency(cluster, args.rate, 1.0, "lat-warm-sync")
        asyncio.run(async_latency(namespace, args.rate, 1.0, "lat-warm-async"))
        asyncio.run(async_latency(namespace, args.rate, 1.0, "lat-warm-uncoord", False))
        for r in range(args.rounds):
            kinds = ["sync", "async", "uncoord"]
            order = kinds if r % 2 == 0 else kinds[::-1]  # neither always first
            got = {k: percentiles(latency_run(cluster, namespace, args, k, r)) for k in order}
            s, a, u = got["sync"], got["async"], got["uncoord"]
            lat["sync"].append(s)
            lat["async"].append(a)
            lat["uncoord"].append(u)
            if r % 2 == 0:
                rs = sync_rate(cluster, args.messages)
                ra = asyncio.run(async_rate(namespace, args.messages))
            else:
                ra = asyncio.run(async_rate(namespace, args.messages))
                rs = sync_rate(cluster, args.messages)
            rate["sync"].append(rs)
            rate["async"].append(ra)
            ms = lambda t: " / ".join(f"{x * 1000:.2f}" for x in t)  # noqa: E731
            print(
                f"round {r + 1} ({', '.join(order)}): latency p50/p99/p99.9 ms  sync {ms(s)}"
                f"  async {ms(a)}  async coordinated=False {ms(u)}"
            )
            print(f"round {r + 1}: single-message rate msg/s  sync {rs:,.0f}  async {ra:,.0f}")
            ts = sync_txn_rate(namespace, n_txn)
            ta = asyncio.run(async_txn_rate(namespace, n_txn))
            txn["sync"].append(ts)
            txn["async"].append(ta)
            print(
                f"round {r + 1}: transactions a second, one at a time  sync {ts:,.0f}  async {ta:,.0f}"
            )
        med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in lat.items()}
        print(f"\nproduce -> consume latency at {args.rate} msg/s (median of rounds), ms:")
        for k in ("sync", "async", "uncoord"):
            print(
                f"  {k:7s}  p50 {med[k][0] * 1000:.2f}  p99 {med[k][1] * 1000:.2f}"
                f"  p99.9 {med[k][2] * 1000:.2f}"
            )
        print(
            "  async / sync: "
            + "  ".join(
                f"{name} {med['async'][i] / med['sync'][i]:.2f}"
                for i, name in enumerate(("p50", "p99", "p99.9"))
            )
        )
        print(
            "  async coordinated / coordinated=False: "
            + "  ".join(
                f"{name} {med['async'][i] / med['uncoord'][i]:.2f}"
                for i, name in enumerate(("p50", "p99", "p99.9"))
            )
        )
        rs, ra = statistics.median(rate["sync"]), statistics.median(rate["async"])
        print(
            f"single-message sends: sync send_async {rs:,.0f} msg/s, "
            f"async await send (256 tasks) {ra:,.0f} msg/s, async / sync {ra / rs:.2f}"
        )
        ts, ta = statistics.median(txn["sync"]), statistics.median(txn["async"])
        print(
            f"one-message transactions one at a time: sync {ts:,.0f}/s, "
            f"async {ta:,.0f}/s, async / sync {ta / ts:.2f}"
        )
    finally:
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
