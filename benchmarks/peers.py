"""RayMQ side by side with the queues a user would pick instead, on this machine.

    python benchmarks/peers.py [--seconds 5] [--json out.json] [--report docs/benchmarks.md]
                               [--peers raymq-async,raymq-sync,redis,redis-aof,nats,ray-queue]
                               [--rate 1000,10000] [--rounds 3] [--slowest 30]

Workloads (OpenMessaging benchmark shapes): one topic of 16 queues (16 Redis
streams, 16 JetStream subjects); bodies of 100 B and 1 KiB; 1 and 4 producers;
max-rate produce, consume and both together; produce->consume latency at a
fixed rate. Every peer uses its best batching: Redis pipelines of XADD and
XREADGROUP+XACK, JetStream async publish and pull fetch with ack-all, Ray's
queue with put/get batches, RayMQ's batch send and pull. Beside them, a
"one per call" produce row: one producer handing its client one message a call
(RayMQ's ``send_async(message)`` streamed, JetStream's ``publish_async``, Redis's
``XADD``, the queue's ``put``, the gRPC client's ``send_async``), as a service that
sends one message per request does.

Every peer is started at once; the latency phases of all peers run interleaved in
``--rounds`` rounds and each latency figure is the median of the rounds', so a drift
of the machine hits every peer alike. ``raymq-grpc`` is RayMQ through its RocketMQ 5
gRPC door, driven by the official Python client.

Raw limits, latency only, measured in the same run: ``tcp-echo`` (one socket round
trip), ``ray-noop`` (one Ray call), and ``py-relay``: the three processes of
RayMQ's latency path (this one sending, an actor relaying, an actor reading) with
nothing but asyncio sockets, the floor of a broker written in Python on this machine.

The script installs nothing: a missing peer is skipped with the one command
that installs it. Servers are started on free loopback ports in a temp dir and
removed afterwards; every run is bounded in time. Ratios RayMQ/peer are the
headline: absolute numbers drift on a shared machine, ratios much less.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import multiprocessing as mp
import os
import platform
import queue
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("raymq.bench.peers")

QUEUES = 16
BATCH = 1000
TOPIC = "PeerBench"


# ------------------------------------------------------------------ helpers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def stamp(body: bytes) -> bytes:
    """Put the send time (ns) in the first 8 bytes of the body."""
    return time.time_ns().to_bytes(8, "big") + body[8:]


def age_ms(body: bytes) -> float:
    return (time.time_ns() - int.from_bytes(body[:8], "big")) / 1e6


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Missing(RuntimeError):
    """A peer that is not installed here; the message says how to install it."""


@dataclass
class Figures:
    """Every number one peer produced, keyed by workload name."""

    peer: str
    throughput: dict[str, float] = field(default_factory=dict)  # msg/s
    mbps: dict[str, float] = field(default_factory=dict)
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    latency_samples: dict[str, list[float]] = field(default_factory=dict)  # all rounds'
    latency_rounds: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    skipped: str = ""
    failed: list[str] = field(default_factory=list)  # phases that raised: what and why
    work: str = ""  # what its consume does to mark messages consumed
    latency_only: bool = False  # a raw limit, not a queue


class Peer:
    """One system under test. Subclasses run the produce/consume loops."""

    name = "peer"
    work = ""
    latency_only = False
    """A raw limit rather than a queue: only its latency run means anything."""
    """What this peer's consume does per message or batch to mark it consumed: every
    peer's consume does that work (an acknowledgement or an offset commit), so their
    consume figures compare like with like."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def reset(self) -> None:
        """Empty the topic between workloads."""

    def produce(self, body: bytes, producers: int, seconds: float) -> int:
        raise NotImplementedError

    def consume(self, expected: int, seconds: float) -> int:
        raise NotImplementedError

    def produce_single(self, body: bytes, seconds: float) -> int | None:
        """One producer handing the client one message per call, as a service sending
        one message per request does (``None``: the peer has no such row)."""
        return None

    def together(self, body: bytes, producers: int, seconds: float) -> tuple[int, int]:
        """Produce and consume at once; (produced, consumed) within ``seconds``."""
        box: dict[str, Any] = {}

        def consume() -> None:
            try:
                box["c"] = self.consume(1 << 62, seconds)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                box["error"] = exc

        t = threading.Thread(target=consume)
        t.start()
        produced = self.produce(body, producers, seconds)
        t.join()
        if "error" in box:
            raise box["error"]
        return produced, box["c"]

    def latency(self, body: bytes, rate: int, seconds: float) -> list[float]:
        raise NotImplementedError


# ------------------------------------------------------------------ Redis Streams


def _redis_producer(port: int, body: bytes, seconds: float, out: Any) -> None:
    import redis

    r = redis.Redis(port=port)
    sent = 0
    stop = time.monotonic() + seconds
    i = 0
    while time.monotonic() < stop:
        pipe = r.pipeline(transaction=False)
        for _ in range(BATCH):
            pipe.xadd(f"{TOPIC}:{i % QUEUES}", {"b": body})
            i += 1
        pipe.execute()
        sent += BATCH
    out.put(sent)


def _redis_single_producer(port: int, body: bytes, seconds: float, out: Any) -> None:
    import redis

    r = redis.Redis(port=port)
    sent = 0
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        r.xadd(f"{TOPIC}:{sent % QUEUES}", {"b": body})
        sent += 1
    out.put(sent)


def _in_process(target: Callable[..., None], *args: Any, timeout: float) -> int:
    """``target(*args, out)`` in a spawned process; the count it puts in ``out``."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, out))
    proc.start()
    try:
        return int(out.get(timeout=timeout))
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.terminate()
            proc.join()


class RedisPeer(Peer):
    work = "XREADGROUP, then XACK of every entry read (pipelined per read)"

    def __init__(self, aof: bool) -> None:
        self.aof = aof
        self.name = "redis-aof" if aof else "redis"
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = ""

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise Missing("sudo apt-get install -y redis-server")
        try:
            import redis  # noqa: F401
        except ImportError as exc:
            raise Missing("pip install redis") from exc
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="raymq-peer-redis-")
        args = [
            exe,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            self.dir,
            "--save",
            "",
            "--protected-mode",
            "no",
        ]
        args += (
            ["--appendonly", "yes", "--appendfsync", "everysec"]
            if self.aof
            else ["--appendonly", "no"]
        )
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _client(self) -> Any:
        import redis

        return redis.Redis(port=self.port)

    def reset(self) -> None:
        r = self._client()
        r.flushall()
        for q in range(QUEUES):
            r.xgroup_create(f"{TOPIC}:{q}", "g", id="0", mkstream=True)

    def produce(self, body: bytes, producers: int, seconds: float) -> int:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_redis_producer, args=(self.port, body, seconds, out))
            for _ in range(producers)
        ]
        for p in procs:
            p.start()
        total = sum(out.get(timeout=seconds + 60) for _ in procs)
        for p in procs:
            p.join()
        return total

    def produce_single(self, body: bytes, seconds: float) -> int | None:
        """XADD one entry a call, each answered before the next (redis-py has no
        asynchronous single command but a pipeline, which is the batched row)."""
        return _in_process(_redis_single_producer, self.port, body, seconds, timeout=seconds + 60)

    def consume(self, expected: int, seconds: float) -> int:
        r = self._client()
        streams = {f"{TOPIC}:{q}": ">" for q in range(QUEUES)}
        got = 0
        stop = time.monotonic() + seconds
        while got < expected and time.monotonic() < stop:
            answer = r.xreadgroup("g", "c1", streams, count=BATCH // QUEUES * 4, block=100)
            pipe = r.pipeline(transaction=False)
            for stream, entries in answer:
                if entries:
                    pipe.xack(stream, "g", *[e[0] for e in entries])
                    got += len(entries)
            pipe.execute()
        return got

    def latency(self, body: bytes, rate: int, seconds: float) -> list[float]:
        r = self._client()
        samples: list[float] = []
        done = threading.Event()

        def consumer() -> None:
            c = self._client()
            streams = {f"{TOPIC}:{q}": ">" for q in range(QUEUES)}
            while not done.is_set():
                for stream, entries in c.xreadgroup("g", "c2", streams, count=100, block=50):
                    for _id, fields in entries:
                        samples.append(age_ms(fields[b"b"]))
                    if entries:
                        c.xack(stream, "g", *[e[0] for e in entries])

        t = threading.Thread(target=consumer)
        t.start()
        paced(rate, seconds, lambda i: r.xadd(f"{TOPIC}:{i % QUEUES}", {"b": stamp(body)}))
        time.sleep(0.2)
        done.set()
        t.join()
        return samples


def warm_up(producer: Any, consumer: Any, topic: str, body: bytes) -> None:
    """Send until the latency consumer actor (a :class:`_RayMQPushLatency`) got 200
    messages (it owns the queues, both sides' connections are open; at most a minute),
    then, once every one sent has arrived, drop what it recorded.

    Dropping at 200 left the last few sent on their way: they landed in the measured
    phase after it, with the age of the warm-up (a round of 3,016 samples for 3,000
    sent, p99 5.3 ms where the others had 0.9-1.6)."""
    import ray

    from storage import Message

    deadline = time.monotonic() + 60
    sent = 0
    while ray.get(consumer.count.remote()) < 200 and time.monotonic() < deadline:
        for _ in range(20):
            producer.send(Message(topic, stamp(body)))
        sent += 20
    ray.get(consumer.take_when.remote(sent, max(1.0, deadline - time.monotonic())))


def paced(rate: int, seconds: float, send: Callable[[int], Any]) -> None:
    """Call ``send(i)`` ``rate`` times a second for ``seconds``, on schedule."""
    interval = 1.0 / rate
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(i)


async def paced_async(rate: int, count: int, send: Callable[[int], Awaitable[Any]]) -> None:
    """:func:`paced` on an event loop: ``await send(i)`` ``count`` times, ``rate`` a
    second, on schedule."""
    interval = 1.0 / rate
    start = time.perf_counter()
    for i in range(count):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(i)


class Settled:
    """The futures of a latency phase's sends, counted as they settle and not kept.

    Keeping every future until the end (3,000 a phase: each with its lock, callbacks
    and result) moved them all into the collector's oldest generation, and the full
    collections that followed paused the sending process for 70-110 ms a phase,
    which an online service that drops a future once answered never sees. The peers'
    harnesses keep nothing either (redis and NATS await each send or keep no handle).
    """

    def __init__(self) -> None:
        self._settled = threading.Semaphore(0)
        self._lock = threading.Lock()
        self.sent = 0
        self.failed = 0
        self.errors: list[BaseException] = []

    def track(self, future: Any) -> None:
        self.sent += 1
        future.add_done_callback(self._done)

    def _done(self, future: Any) -> None:
        exc = future.exception()
        if exc is not None:
            with self._lock:
                self.failed += 1
                if len(self.errors) < 3:
                    self.errors.append(exc)
        self._settled.release()

    def wait(self, timeout_s: float = 60.0) -> None:
        """Until every tracked send settled (raises on a timeout)."""
        deadline = time.monotonic() + timeout_s
        for _ in range(self.sent):
            if not self._settled.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"sends still unanswered after {timeout_s}s")


# ------------------------------------------------------------------ NATS JetStream


def _nats_producer(port: int, body: bytes, seconds: float, out: Any) -> None:
    out.put(asyncio.run(_nats_produce(port, body, seconds)))


async def _nats_produce(port: int, body: bytes, seconds: float) -> int:
    import nats

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream(publish_async_max_pending=BATCH * 4)
    sent = 0
    stop = time.monotonic() + seconds
    i = 0
    while time.monotonic() < stop:
        for _ in range(BATCH):
            await js.publish_async(f"{TOPIC}.{i % QUEUES}", body)
            i += 1
        await js.publish_async_completed()
        sent += BATCH
    await nc.close()
    return sent


def _nats_single_producer(port: int, body: bytes, seconds: float, out: Any) -> None:
    out.put(asyncio.run(_nats_produce_single(port, body, seconds)))


async def _nats_produce_single(port: int, body: bytes, seconds: float) -> int:
    """``publish_async`` one message a call, the acknowledgements awaited as they come
    (at most 4,000 pending, the client's own back-pressure), all of them at the end."""
    import nats

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream(publish_async_max_pending=BATCH * 4)
    sent = 0
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        await js.publish_async(f"{TOPIC}.{sent % QUEUES}", body)
        sent += 1
    await js.publish_async_completed()
    await nc.close()
    return sent


class NatsPeer(Peer):
    name = "nats"
    work = "pull fetch of up to 1000, then one ack of the last (AckPolicy.ALL acks all before it)"

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = ""

    def start(self) -> None:
        exe = shutil.which("nats-server")
        if exe is None:
            raise Missing("sudo apt-get install -y nats-server")
        try:
            import nats  # noqa: F401
        except ImportError as exc:
            raise Missing("pip install nats-py") from exc
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="raymq-peer-nats-")
        self.proc = subprocess.Popen(
            [exe, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", self.dir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def reset(self) -> None:
        asyncio.run(self._reset())

    async def _reset(self) -> None:
        import nats
        from nats.js.api import StorageType

        nc = await nats.connect(f"nats://127.0.0.1:{self.port}")
        js = nc.jetstream()
        with contextlib.suppress(Exception):  # absent the first time
            await js.delete_stream(TOPIC)
        await js.add_stream(name=TOPIC, subjects=[f"{TOPIC}.*"], storage=StorageType.FILE)
        await nc.close()

    def produce(self, body: bytes, producers: int, seconds: float) -> int:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_nats_producer, args=(self.port, body, seconds, out))
            for _ in range(producers)
        ]
        for p in procs:
            p.start()
        total = sum(out.get(timeout=seconds + 60) for _ in procs)
        for p in procs:
            p.join()
        return total

    def produce_single(self, body: bytes, seconds: float) -> int | None:
        return _in_process(_nats_single_producer, self.port, body, seconds, timeout=seconds + 60)

    def consume(self, expected: int, seconds: float) -> int:
        return asyncio.run(self._consume(expected, seconds))

    async def _consume(self, expected: int, seconds: float) -> int:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig

        nc = await nats.connect(f"nats://127.0.0.1:{self.port}")
        js = nc.jetstream()
        sub = await js.pull_subscribe(
            f"{TOPIC}.*", durable="bench", config=ConsumerConfig(ack_policy=AckPolicy.ALL)
        )
        got = 0
        stop = time.monotonic() + seconds
        while got < expected and time.monotonic() < stop:
            try:
                msgs = await sub.fetch(BATCH, timeout=0.1)
            except Exception:  # noqa: BLE001 - nats.errors.TimeoutError: nothing yet
                continue
            if not msgs:
                continue
            got += len(msgs)
            await msgs[-1].ack()
        await nc.close()
        return got

    def latency(self, body: bytes, rate: int, seconds: float) -> list[float]:
        """Paced ``publish_async`` calls, as RayMQ's ``send_async``, to a pull consumer in
        a process of its own, as RayMQ's PushConsumer is (a consumer thread beside the
        producer shared its GIL and fell behind at 10,000 msg/s)."""
        ctx = mp.get_context("spawn")
        ready, out = ctx.Event(), ctx.Queue()
        total = int(rate * seconds)
        proc = ctx.Process(
            target=_nats_latency_consumer, args=(self.port, total, seconds + 30, ready, out)
        )
        proc.start()
        try:
            if not ready.wait(60):
                raise RuntimeError("the NATS latency consumer did not start")

            async def produce() -> None:
                import nats

                # acknowledgements are awaited as they come, not before the next send
                # (an awaited ``publish`` a message held NATS to ~4,000 msg/s here)
                nc = await nats.connect(f"nats://127.0.0.1:{self.port}")
                js = nc.jetstream(publish_async_max_pending=BATCH * 4)
                acks: list[Any] = []

                async def publish(i: int) -> None:
                    acks.append(await js.publish_async(f"{TOPIC}.{i % QUEUES}", stamp(body)))

                await paced_async(rate, total, publish)
                for ack in await asyncio.gather(*acks, return_exceptions=True):
                    if isinstance(ack, BaseException):
                        raise ack
                await nc.close()

            asyncio.run(produce())
            samples: list[float] = out.get(timeout=seconds + 60)
            return samples
        finally:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join()


def _nats_latency_consumer(port: int, expected: int, seconds: float, ready: Any, out: Any) -> None:
    """The latency phase's NATS consumer, in a spawned process: the ages of the
    ``expected`` messages, put in ``out``."""

    async def consume() -> list[float]:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig

        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        js = nc.jetstream()
        sub = await js.pull_subscribe(
            f"{TOPIC}.*", durable="lat", config=ConsumerConfig(ack_policy=AckPolicy.ALL)
        )
        ready.set()
        samples: list[float] = []
        stop = time.monotonic() + seconds
        while len(samples) < expected and time.monotonic() < stop:
            try:
                msgs = await sub.fetch(BATCH, timeout=0.1)
            except Exception:  # noqa: BLE001 - nats.errors.TimeoutError: nothing yet
                continue
            if msgs:
                samples.extend(age_ms(m.data) for m in msgs)
                await msgs[-1].ack()
        await nc.close()
        return samples

    out.put(asyncio.run(consume()))


# ------------------------------------------------------------------ ray.util.queue


class RayQueuePeer(Peer):
    """The naive Ray answer: one ``ray.util.queue.Queue`` actor, batch put/get."""

    name = "ray-queue"
    work = "get_nowait_batch: a queue item is gone once taken (nothing to acknowledge)"

    def start(self) -> None:
        ensure_ray()
        from ray.util.queue import Queue

        self.queue = Queue()

    def stop(self) -> None:
        self.queue.shutdown()

    def reset(self) -> None:
        self.queue.shutdown()
        from ray.util.queue import Queue

        self.queue = Queue()

    def produce(self, body: bytes, producers: int, seconds: float) -> int:
        import ray

        @ray.remote(num_cpus=0)
        def producer(queue: Any, body: bytes, seconds: float) -> int:
            sent = 0
            # distinct objects: pickle sends a repeated one once plus a 2-byte reference
            items = [i.to_bytes(8, "big") + body[8:] for i in range(BATCH)]
            stop = time.monotonic() + seconds
            while time.monotonic() < stop:
                queue.put_nowait_batch(items)
                sent += BATCH
            return sent

        return sum(ray.get([producer.remote(self.queue, body, seconds) for _ in range(producers)]))

    def produce_single(self, body: bytes, seconds: float) -> int | None:
        """``put`` of one item a call (an actor call answered before the next)."""
        import ray

        @ray.remote(num_cpus=0)
        def producer(queue: Any, body: bytes, seconds: float) -> int:
            sent = 0
            stop = time.monotonic() + seconds
            while time.monotonic() < stop:
                queue.put(sent.to_bytes(8, "big") + body[8:])
                sent += 1
            return sent

        return int(ray.get(producer.remote(self.queue, body, seconds)))

    def consume(self, expected: int, seconds: float) -> int:
        from ray.util.queue import Empty

        got = 0
        stop = time.monotonic() + seconds
        while got < expected and time.monotonic() < stop:
            n = min(BATCH, self.queue.qsize())
            if n == 0:
                time.sleep(0.001)
                continue
            try:
                got += len(self.queue.get_nowait_batch(n))
            except Empty:
                continue
        return got

    def latency(self, body: bytes, rate: int, seconds: float) -> list[float]:
        samples: list[float] = []
        done = threading.Event()

        def consumer() -> None:
            while not done.is_set():
                try:
                    samples.append(age_ms(self.queue.get(timeout=0.1)))
                except Exception:  # noqa: BLE001 - ray.util.queue.Empty
                    continue

        t = threading.Thread(target=consumer)
        t.start()
        paced(rate, seconds, lambda i: self.queue.put(stamp(body)))
        time.sleep(0.3)
        done.set()
        t.join()
        return samples


WORKER_NICENESS = [0]
"""The niceness of this run's Ray workers (``--worker-nice``): 0, as every peer's server
and consumer processes run, and as in the Ray RayMQ starts itself; Ray's default is 15."""


def ensure_ray() -> None:
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",  # a Ray of this run's own: never attach to another cluster
            num_cpus=4,
            include_dashboard=False,
            logging_level=logging.WARNING,
            namespace="raymq-peers",
            _system_config={"worker_niceness": WORKER_NICENESS[0]},
        )


# ------------------------------------------------------------------ RayMQ


def _raymq_producer(
    namespace: str, topic: str, body: bytes, seconds: float, data_path: str = "socket"
) -> int:
    """A producer process's loop: batches of BATCH sent with ``send_async`` without
    waiting, as an async RocketMQ producer is driven; the producer's own backpressure
    (``async_send_max_messages``) paces it. Counts what was acknowledged in time."""
    import actors
    from storage import Message

    producer = actors.connect(namespace).producer(
        f"peers-{os.getpid()}",
        max_batch_messages=BATCH,
        max_batch_bytes=8 << 20,
        data_path=data_path,
    )
    msgs = [Message(topic, body) for _ in range(BATCH)]
    futures: list[Any] = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        futures.append(producer.send_async(msgs))
    acked = BATCH * sum(f.done() and f.exception() is None for f in futures)
    for f in futures:
        f.result()
    producer.close()
    return acked


def _raymq_single_producer(namespace: str, topic: str, body: bytes, seconds: float) -> int:
    """``send_async(message)`` one message a call, streamed without waiting (the
    producer's ``async_send_max_messages`` paces it); counts what was acknowledged."""
    import actors
    from storage import Message

    producer = actors.connect(namespace).producer(f"peers-single-{os.getpid()}")
    sends = Settled()
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        sends.track(producer.send_async(Message(topic, body)))
    sends.wait(120.0)
    producer.close()
    return sends.sent - sends.failed


class RayMQPeer(Peer):
    """This repository: producers -> one broker actor (its store on local disk) -> pulls."""

    work = (
        "pull_many of all 16 queues, then commit_offsets of every queue that moved "
        "(one broker call per round); 'consume ... no commit' is the same loop without it"
    )

    def __init__(
        self,
        flush: str,
        data_path: str = "socket",
        delivery: str | None = None,
        on_io_thread: bool = False,
    ) -> None:
        self.flush = flush
        self.data_path = data_path
        self.delivery = delivery
        self.on_io_thread = on_io_thread
        self.name = "raymq-sync" if flush == "SYNC_FLUSH" else "raymq-async"
        if data_path != "socket":
            self.name = f"raymq-{data_path}"
            self.work += f"; every per-message call through {data_path} (data_path={data_path!r})"
        if delivery is not None:  # else the PushConsumer's default for the data path
            self.name = f"raymq-{delivery}"
            self.work += f"; the latency phase's PushConsumer with delivery={delivery!r}"
        if on_io_thread:
            self.name = "raymq-io"
            self.work += "; the latency phase's listener on the client's I/O thread"
        self.round = 0

    def start(self) -> None:
        ensure_ray()
        import actors

        self.root = tempfile.mkdtemp(prefix="raymq-peer-")
        self.namespace = f"raymq-peers-{self.name}-{os.getpid()}"
        self.cluster = actors.start_cluster(
            namespace=self.namespace,
            nameservers=1,
            brokers=1,
            store_root=self.root,
            broker_options={
                "store": {
                    "flush_disk_type": self.flush,
                    "commitlog_file_size": 256 << 20,
                    "index_hash_slots": 1_000_003,
                    "index_max_entries": 8_000_000,
                }
            },
        )
        self.consumer = self.cluster.pull_consumer("peers", data_path=self.data_path)
        self.reset()

    def stop(self) -> None:
        self.consumer.close()
        self.cluster.shutdown()
        shutil.rmtree(self.root, ignore_errors=True)

    def reset(self) -> None:
        self.round += 1
        self.topic = f"{TOPIC}{self.round}"
        self.cluster.admin.create_topic(self.topic, QUEUES, QUEUES)
        self.queues = self.consumer.fetch_subscribe_queues(self.topic)
        self.offsets = dict.fromkeys(self.queues, 0)

    def produce(self, body: bytes, producers: int, seconds: float) -> int:
        import ray

        task = ray.remote(num_cpus=0)(_raymq_producer)
        refs = [
            task.remote(self.namespace, self.topic, body, seconds, self.data_path)
            for _ in range(producers)
        ]
        return sum(ray.get(refs))

    def produce_single(self, body: bytes, seconds: float) -> int | None:
        import ray

        task = ray.remote(num_cpus=0)(_raymq_single_producer)
        return int(ray.get(task.remote(self.namespace, self.topic, body, seconds)))

    def consume(self, expected: int, seconds: float, commit: bool = True) -> int:
        """Pull every queue in rounds; after each round commit the offsets of the queues
        that moved, as a consumer group does (``commit=False``: the bare pull loop)."""
        got = 0
        stop = time.monotonic() + seconds
        while got < expected and time.monotonic() < stop:
            results = self.consumer.pull_many(
                [(q, self.offsets[q]) for q in self.queues], BATCH * 4, long_poll_s=0.05
            )
            moved = {}
            for q, r in zip(self.queues, results):
                if r.count:
                    got += len(r.bodies)
                    moved[q] = r.next_offset
                self.offsets[q] = r.next_offset
            if commit and moved:
                self.consumer.commit_offsets(moved)
        return got

    def consume_again_without_commit(self, expected: int, seconds: float) -> int:
        """The same messages once more, from offset 0, without committing."""
        self.offsets = dict.fromkeys(self.queues, 0)
        return self.consume(expected, seconds, commit=False)

    def latency(self, body: bytes, rate: int, seconds: float) -> list[float]:
        """Single messages sent with ``send_async`` on a schedule, to a long-polling
        PushConsumer in its own process (a Ray actor), as an online service would."""
        import ray

        from storage import Message

        consumer = ray.remote(num_cpus=0)(_RayMQPushLatency).remote(
            self.namespace, self.topic, self.data_path, self.delivery, self.on_io_thread
        )
        producer = self.cluster.producer("peers-latency", data_path=self.data_path)
        warm_up(producer, consumer, self.topic, body)
        sends = Settled()
        paced(
            rate,
            seconds,
            lambda i: sends.track(producer.send_async(Message(self.topic, stamp(body)))),
        )
        sends.wait()
        if sends.errors:
            raise sends.errors[0]
        samples: list[float] = ray.get(consumer.take_when.remote(sends.sent, 30.0))
        producer.close()
        ray.get(consumer.close.remote())
        ray.kill(consumer)
        return samples


class _RayMQAioLatency:
    """An ``AsyncConsumer`` (``actors.aio``) in its own process, a Ray async actor: its
    ``async for`` runs on the actor's event loop, as NATS's consumer runs on its own."""

    def __init__(self, namespace: str, topic: str) -> None:
        self.namespace, self.topic = namespace, topic
        self.samples: list[float] = []
        self.task: asyncio.Task[None] | None = None
        self.changed: asyncio.Event | None = None

    async def _consume(self) -> None:
        from actors.aio import AsyncConsumer

        assert self.changed is not None
        async with AsyncConsumer(
            "peers-aio-latency", self.topic, namespace=self.namespace
        ) as consumer:
            async for m in consumer:
                self.samples.append(age_ms(m.body))
                self.changed.set()

    async def count(self) -> int:
        if self.task is None:  # started on the actor's loop, by its first call
            self.changed = asyncio.Event()
            self.task = asyncio.ensure_future(self._consume())
        return len(self.samples)

    async def take(self) -> list[float]:
        samples, self.samples = self.samples, []
        return samples

    async def take_when(self, n: int, timeout_s: float) -> list[float]:
        assert self.changed is not None
        deadline = time.monotonic() + timeout_s
        while len(self.samples) < n and time.monotonic() < deadline:
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), deadline - time.monotonic())
        return await self.take()

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


class RayMQAioPeer(RayMQPeer):
    """RayMQ through its asyncio clients (``actors.aio``), as NATS's harness uses
    nats-py: ``AsyncProducer.send`` paced on an event loop in this process, not
    awaited before the next send, to an ``AsyncConsumer`` on the loop of a process of
    its own. The throughput phases are ``raymq-async``'s."""

    def __init__(self) -> None:
        super().__init__("ASYNC_FLUSH")
        self.name = "raymq-aio"
        self.work += "; the latency phase through the asyncio clients (actors.aio)"

    def latency(self, body: bytes, rate: int, seconds: float) -> list[float]:
        import ray

        from storage import Message

        consumer = ray.remote(num_cpus=0)(_RayMQAioLatency).remote(self.namespace, self.topic)
        producer = self.cluster.producer("peers-aio-warm")
        warm_up(producer, consumer, self.topic, body)
        producer.close()
        total = int(rate * seconds)

        async def produce() -> None:
            from actors.aio import AsyncProducer

            async with AsyncProducer("peers-aio-latency", namespace=self.namespace) as p:
                await p.send(Message(self.topic, stamp(body)))  # routes and connection
                ray.get(consumer.take_when.remote(1, 30.0))  # arrived: not in the phase
                sends: list[Any] = []

                async def send(i: int) -> None:  # not awaited before the next, as NATS's
                    sends.append(asyncio.ensure_future(p.send(Message(self.topic, stamp(body)))))

                await paced_async(rate, total, send)
                await asyncio.gather(*sends)

        asyncio.run(produce())
        samples: list[float] = ray.get(consumer.take_when.remote(total, 30.0))
        ray.get(consumer.close.remote())
        ray.kill(consumer)
        return samples


class _RayMQPushLatency:
    """A PushConsumer in its own process; its listener records each message's age."""

    def __init__(
        self,
        namespace: str,
        topic: str,
        data_path: str,
        delivery: str | None = None,
        on_io_thread: bool = False,
    ) -> None:
        from actors import ConsumeStatus, PushConsumer

        self.samples: list[float] = []
        self.stamps: set[bytes] = set()  # each message's send time: a second one is a duplicate
        self.duplicates = 0
        self.arrived = threading.Condition()
        self.success = ConsumeStatus.SUCCESS
        self.consumer = PushConsumer(
            "peers-latency",
            topic,
            listener=self._on,
            namespace=namespace,
            data_path=data_path,
            delivery=delivery,
            consume_threads=2,
            consume_on_io_thread=on_io_thread,
        )
        self.consumer.start()

    def _on(self, msgs: list[Any]) -> Any:
        ages = [age_ms(m.body) for m in msgs]
        with self.arrived:
            for m in msgs:
                sent = bytes(m.body[:8])
                if sent in self.stamps:
                    self.duplicates += 1
                self.stamps.add(sent)
            self.samples.extend(ages)
            self.arrived.notify_all()
        return self.success

    def duplicates_seen(self) -> int:
        """Messages that arrived a second time (same send time), since the start."""
        return self.duplicates

    def count(self) -> int:
        return len(self.samples)

    def take(self) -> list[float]:
        with self.arrived:
            samples, self.samples = self.samples, []
        return samples

    def take_when(self, n: int, timeout_s: float) -> list[float]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.samples) >= n, timeout_s)
        return self.take()

    def close(self) -> None:
        self.consumer.shutdown()


def raymq_peer(
    flush: str, data_path: str = "socket", delivery: str | None = None, on_io_thread: bool = False
) -> Peer:
    return RayMQPeer(flush, data_path, delivery, on_io_thread)


# ------------------------------------------------------------------ raw limits


class _Echo:
    """An asyncio echo server in a Ray actor: what one socket round trip costs here."""

    async def start(self) -> int:
        import asyncio

        async def serve(reader: Any, writer: Any) -> None:
            with contextlib.suppress(Exception):
                while True:
                    size = int.from_bytes(await reader.readexactly(4), "big")
                    writer.write(size.to_bytes(4, "big") + await reader.readexactly(size))

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def noop(self, body: bytes) -> None:
        return None

    def pid(self) -> int:
        return os.getpid()

    async def start_relay(self) -> int:
        """A relay: each frame a producer sends goes to every consumer connected, then
        is acknowledged (a connection says which it is by its first byte, P or C)."""
        import asyncio

        consumers: list[Any] = []

        async def serve(reader: Any, writer: Any) -> None:
            with contextlib.suppress(Exception):
                if await reader.readexactly(1) == b"C":
                    consumers.append(writer)
                    writer.write(b"R")  # registered: frames sent from now on reach it
                    try:
                        await reader.read()  # until it goes
                    finally:
                        consumers.remove(writer)
                    return
                while True:
                    head = await reader.readexactly(4)
                    frame = head + await reader.readexactly(int.from_bytes(head, "big"))
                    for consumer in consumers:
                        consumer.write(frame)
                    writer.write(b"\x00\x00\x00\x00")

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])


class _RelayConsumer:
    """The relay's consumer, in a process of its own: each frame's age on arrival."""

    def __init__(self, port: int) -> None:
        self.samples: list[float] = []
        self.arrived = threading.Condition()
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(b"C")
        if self.sock.recv(1) != b"R":
            raise RuntimeError("the relay did not register this consumer")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        reader = self.sock.makefile("rb")
        with contextlib.suppress(Exception):
            while True:
                head = reader.read(4)
                if len(head) < 4:  # the relay went away
                    return
                body = reader.read(int.from_bytes(head, "big"))
                age = age_ms(body)
                with self.arrived:
                    self.samples.append(age)
                    self.arrived.notify_all()

    def take_when(self, n: int, timeout_s: float) -> list[float]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.samples) >= n, timeout_s)
            samples, self.samples = self.samples, []
        return samples

    def pid(self) -> int:
        return os.getpid()


class RawLimit(Peer):
    """No queue: one round trip paced at the latency run's rate, over a plain TCP socket
    to an asyncio server in a Ray actor ('tcp-echo'), or as a Ray no-op actor call
    ('ray-noop'). The floor under each of RayMQ's two paths, measured in the same run."""

    latency_only = True

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = kind
        self.cpu_per_message_us: dict[str, float] = {}  # py-relay: each process's, last run
        self.run_wait_per_message_us: dict[str, float] = {}  # and its wait for a core
        self.work = {
            "tcp-echo": "no queue: a 100 B round trip over TCP to an asyncio echo server in a Ray actor",
            "ray-noop": "no queue: a round trip of a no-op call to an async Ray actor",
            "py-relay": (
                "no queue: each message sent over TCP to an asyncio relay in a Ray actor, which"
                " forwards it to a reader in another actor and then acknowledges it: RayMQ's"
                " three processes with nothing but the sockets (the floor of a broker in Python)"
            ),
        }[kind]

    def start(self) -> None:
        ensure_ray()
        import ray

        self.actor = ray.remote(num_cpus=0)(_Echo).remote()
        if self.kind == "py-relay":
            self.port = ray.get(self.actor.start_relay.remote())
        else:
            self.port = ray.get(self.actor.start.remote())

    def stop(self) -> None:
        import ray

        ray.kill(self.actor)

    def latency(self, body: bytes, rate: int, seconds: float) -> list[float]:
        import ray

        samples: list[float] = []
        if self.kind == "ray-noop":

            def call(i: int) -> None:
                started = time.perf_counter()
                ray.get(self.actor.noop.remote(body))
                samples.append((time.perf_counter() - started) * 1e3)

            paced(rate, seconds, call)
            return samples
        if self.kind == "py-relay":
            return self._relay(body, rate, seconds)
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        frame = len(body).to_bytes(4, "big") + body

        def echo(i: int) -> None:
            started = time.perf_counter()
            sock.sendall(frame)
            left = len(frame)
            while left:
                left -= len(sock.recv(left))
            samples.append((time.perf_counter() - started) * 1e3)

        try:
            paced(rate, seconds, echo)
        finally:
            sock.close()
        return samples

    def _relay(self, body: bytes, rate: int, seconds: float) -> list[float]:
        """Sent from here, each acknowledged before the next; its age taken on arrival."""
        import ray
        from _local import run_wait_s, total_cpu_s  # benchmarks/, beside this file

        consumer = ray.remote(num_cpus=0)(_RelayConsumer).remote(self.port)
        pids = {  # the same three processes as RayMQ's path (sender, broker, consumer)
            "sender": os.getpid(),
            "relay": ray.get(self.actor.pid.remote()),
            "reader": ray.get(consumer.pid.remote()),  # connected once it answers
        }
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(b"P")
        sent = 0

        def send(i: int) -> None:
            nonlocal sent
            stamped = stamp(body)
            sock.sendall(len(stamped).to_bytes(4, "big") + stamped)
            left = 4
            while left:
                left -= len(sock.recv(left))
            sent += 1

        try:
            before = {k: total_cpu_s(pid) for k, pid in pids.items()}
            waited = {k: run_wait_s(pid) for k, pid in pids.items()}
            paced(rate, seconds, send)
            samples = list(ray.get(consumer.take_when.remote(sent, 30.0)))
            self.cpu_per_message_us = {
                k: 1e6 * (total_cpu_s(pid) - before[k]) / max(1, sent) for k, pid in pids.items()
            }
            self.run_wait_per_message_us = {
                k: 1e6 * (run_wait_s(pid) - waited[k]) / max(1, sent) for k, pid in pids.items()
            }
            return samples
        finally:
            sock.close()
            ray.kill(consumer)


# ------------------------------------------------------------------ the run


# ------------------------------------------------------------------ RayMQ over gRPC


GRPC_IN_FLIGHT = 512  # a gRPC producer's sends in flight (send_async futures)
GRPC_ACKERS = 8
"""Threads acking for a gRPC SimpleConsumer: the official client acks one message per
call, and its ``ack_async`` returns no future (5.1.2), so the acks are the blocking
``ack`` on a pool, off the receive loop (as a consumer handing messages to workers does)."""


def _grpc_config(addr: str, ak: str, sk: str) -> Any:
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(addr, Credentials(ak, sk))


def _grpc_producer(
    addr: str,
    ak: str,
    sk: str,
    topic: str,
    body: bytes,
    seconds: float,
    in_flight_max: int,
    out: Any,
) -> None:
    """A producer process: the official client's ``send_async`` with at most
    ``in_flight_max`` sends in flight; reports (acknowledged, failed) whatever happens, so
    the parent never waits on a producer that died (a failed send raises from its
    future: it is counted, not raised)."""
    from rocketmq import Message, Producer

    acked = failed = 0

    def settle(f: Any) -> None:
        nonlocal acked, failed
        if f.exception() is None:
            acked += 1
        else:
            failed += 1

    producer = Producer(_grpc_config(addr, ak, sk), (topic,))
    try:
        producer.startup()
        in_flight: collections.deque[Any] = collections.deque()
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            m = Message()
            m.topic = topic
            m.body = body
            in_flight.append(producer.send_async(m))
            if len(in_flight) >= in_flight_max:
                settle(in_flight.popleft())
        while in_flight:
            settle(in_flight.popleft())
    finally:
        out.put((acked, failed))
        producer.shutdown()  # after the answer: a slow shutdown costs the parent nothing


class RayMQGrpcPeer(Peer):
    """This repository's brokers speaking RocketMQ 5's gRPC protocol, driven by the
    official Python client (``rocketmq-python-client``): Producer in, SimpleConsumer out."""

    name = "raymq-grpc"
    work = f"SimpleConsumer.receive of up to 32 (POP); each message acked by a pool of {GRPC_ACKERS} threads (the client acks one message a call; a consume phase ends when every ack is answered)"

    def __init__(self) -> None:
        self.round = 0

    def start(self) -> None:
        try:
            import rocketmq  # noqa: F401
        except ImportError as exc:
            raise Missing("pip install rocketmq-python-client") from exc
        ensure_ray()
        import actors

        self.root = tempfile.mkdtemp(prefix="raymq-peer-grpc-")
        self.namespace = f"raymq-peers-grpc-{os.getpid()}"
        self.cluster = actors.start_cluster(
            namespace=self.namespace,
            nameservers=1,
            brokers=1,
            store_root=self.root,
            broker_options={
                "grpc_enable": True,
                "grpc_bind": "127.0.0.1",
                "store": {
                    "commitlog_file_size": 256 << 20,
                    "index_hash_slots": 1_000_003,
                    "index_max_entries": 8_000_000,
                },
            },
        )
        self.ak, self.sk = self.cluster.grpc_credentials()
        (info,) = self.cluster.grpc_endpoints().values()
        self.addr = info["addr"]
        self.reset()

    def stop(self) -> None:
        self.cluster.shutdown()
        shutil.rmtree(self.root, ignore_errors=True)

    def reset(self) -> None:
        self.round += 1
        self.topic = f"{TOPIC}{self.round}"
        self.cluster.admin.create_topic(self.topic, QUEUES, QUEUES)

    def produce(self, body: bytes, producers: int, seconds: float) -> int:
        """``producers`` processes sharing GRPC_IN_FLIGHT sends in flight: more would only
        queue at the broker, past the client's 3 s request timeout."""
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        in_flight = max(1, GRPC_IN_FLIGHT // producers)
        args = (self.addr, self.ak, self.sk, self.topic, body, seconds, in_flight, out)
        procs = [ctx.Process(target=_grpc_producer, args=args) for _ in range(producers)]
        for p in procs:
            p.start()
        answers: list[tuple[int, int]] = []
        deadline = time.monotonic() + seconds + 60
        try:
            while len(answers) < len(procs):
                try:
                    answers.append(out.get(timeout=1.0))
                except queue.Empty:
                    if time.monotonic() > deadline or not any(p.is_alive() for p in procs):
                        raise RuntimeError(
                            f"{len(procs) - len(answers)} of {len(procs)} gRPC producers "
                            "gave no count (died or stuck)"
                        ) from None
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():  # a client that does not shut down: not this run's to wait on
                    p.terminate()
                    p.join()
        failed = sum(f for _, f in answers)
        if failed:
            print(f"  raymq-grpc   {failed} sends failed", flush=True)
        return sum(a for a, _ in answers)

    def produce_single(self, body: bytes, seconds: float) -> int | None:
        """The official client sends one message a call (``send_async``): its produce row
        already is one message per call."""
        return self.produce(body, 1, seconds)

    def _consumer(self, group: str) -> Any:
        from rocketmq import FilterExpression, SimpleConsumer

        consumer = SimpleConsumer(
            _grpc_config(self.addr, self.ak, self.sk),
            group,
            {self.topic: FilterExpression()},
            await_duration=1,
        )
        consumer.startup()
        return consumer

    def consume(
        self,
        expected: int,
        seconds: float,
        samples: list[float] | None = None,
        done: threading.Event | None = None,
    ) -> int:
        from concurrent.futures import ThreadPoolExecutor, wait

        consumer = self._consumer(f"peers-{self.round}-{'lat' if samples is not None else 'c'}")
        got = 0
        stop = time.monotonic() + seconds
        acks: list[Any] = []
        try:
            with ThreadPoolExecutor(GRPC_ACKERS, thread_name_prefix="grpc-ack") as ackers:
                while got < expected and time.monotonic() < stop and not (done and done.is_set()):
                    msgs = consumer.receive(32, 30)
                    if samples is not None:
                        samples.extend(age_ms(m.body) for m in msgs)
                    acks.extend(ackers.submit(consumer.ack, m) for m in msgs)
                    got += len(msgs)
                wait(acks)
        finally:
            consumer.shutdown()
        failed = sum(1 for f in acks if f.exception() is not None)
        if failed:
            print(f"  raymq-grpc   {failed} of {len(acks)} acks failed", flush=True)
        return got

    def latency(self, body: bytes, rate: int, seconds: float) -> list[float]:
        """Single messages sent with ``send_async`` on a schedule, to a SimpleConsumer
        long-polling in a thread."""
        from rocketmq import Message, Producer

        samples: list[float] = []
        done = threading.Event()
        t = threading.Thread(target=self.consume, args=(1 << 62, seconds + 30, samples, done))
        t.start()
        producer = Producer(_grpc_config(self.addr, self.ak, self.sk), (self.topic,))
        producer.startup()

        def send(i: int) -> Any:
            m = Message()
            m.topic = self.topic
            m.body = stamp(body)
            return producer.send_async(m)

        sends = Settled()
        paced(rate, seconds, lambda i: sends.track(send(i)))
        sends.wait(120.0)  # a send that timed out is no sample
        failed = sends.failed
        if failed:
            log.debug("raymq-grpc latency sends failed: %s", sends.errors)
            print(f"  raymq-grpc   {failed} of {sends.sent} latency sends failed", flush=True)
        deadline = time.monotonic() + 30
        while len(samples) < sends.sent - failed and time.monotonic() < deadline:
            time.sleep(0.05)
        done.set()
        t.join()
        producer.shutdown()
        return samples


def start_peer(peer: Peer) -> Figures:
    """Start ``peer``; its figures, marked skipped if it is not installed here."""
    fig = Figures(peer.name, work=peer.work, latency_only=peer.latency_only)
    print(f"- {peer.name}", flush=True)
    try:
        peer.start()
    except Missing as exc:
        fig.skipped = f"not installed; install with: {exc}"
        print(f"- {peer.name}: skipped, {fig.skipped}", flush=True)
    return fig


def run_peers(peers: list[Peer], args: argparse.Namespace) -> list[Figures]:
    """Every peer started at once; the throughput workloads peer by peer, then the
    latency phases of all peers interleaved in rounds (a drift of the machine hits all
    alike), each figure the median of the rounds'."""
    started: list[tuple[Peer, Figures]] = []
    try:
        for peer in peers:
            fig = start_peer(peer)
            started.append((peer, fig))
        live = [(p, f) for p, f in started if not f.skipped]
        for peer, fig in [] if args.latency_only else live:
            _throughput(peer, fig, args)
        for i in range(args.rounds):
            print(f"- latency, round {i + 1} of {args.rounds}", flush=True)
            for peer, fig in live:
                _latency(peer, fig, args)
        for _, fig in live:
            _summarise_latency(fig)
    finally:
        for peer, fig in started:
            if not fig.skipped:
                peer.stop()
    return [f for _, f in started]


def _failed(fig: Figures, phase: str, exc: BaseException) -> None:
    """A phase of one peer raised: said in the report, and the run goes on without it
    (one peer's failure does not cost the figures of the others)."""
    fig.failed.append(f"{phase}: {type(exc).__name__}: {str(exc)[:200]}")
    print(f"  {fig.peer:12s} {phase}: FAILED ({type(exc).__name__}: {exc})", flush=True)


def _throughput(peer: Peer, fig: Figures, args: argparse.Namespace) -> None:
    for size in [] if peer.latency_only else args.sizes:
        body = os.urandom(size)
        for producers in args.producers:
            key = f"{size}B x{producers}p"
            try:
                _workload(peer, fig, args, body, producers, key)
            except Exception as exc:  # noqa: BLE001 - reported, the next workload goes on
                _failed(fig, key, exc)
        key = f"produce {size}B x1p one per call"
        try:
            peer.reset()
            single = peer.produce_single(body, args.seconds)
        except Exception as exc:  # noqa: BLE001 - reported, the next workload goes on
            _failed(fig, key, exc)
            continue
        if single is not None:
            fig.throughput[key] = single / args.seconds
            fig.mbps[key] = fig.throughput[key] * size / 1e6
            print(f"  {peer.name:12s} {key}: {fig.throughput[key]:>12,.0f} msg/s", flush=True)


def _workload(
    peer: Peer, fig: Figures, args: argparse.Namespace, body: bytes, producers: int, key: str
) -> None:
    size = len(body)
    peer.reset()
    produced = peer.produce(body, producers, args.seconds)
    fig.throughput[f"produce {key}"] = produced / args.seconds
    started = time.perf_counter()
    consumed = peer.consume(produced, args.seconds * 4)
    elapsed = time.perf_counter() - started
    fig.throughput[f"consume {key}"] = consumed / elapsed
    again = getattr(peer, "consume_again_without_commit", None)
    if again is not None:  # the figure before consumes did the same work
        started = time.perf_counter()
        bare = again(produced, args.seconds * 4)
        fig.throughput[f"consume {key} no commit"] = bare / (time.perf_counter() - started)
    peer.reset()
    p, c = peer.together(body, producers, args.seconds)
    fig.throughput[f"together {key}"] = c / args.seconds  # delivered end to end
    for name in (f"produce {key}", f"consume {key}", f"together {key}"):
        fig.mbps[name] = fig.throughput[name] * size / 1e6
    print(
        f"  {peer.name:12s} {key:10s} produce {fig.throughput[f'produce {key}']:>12,.0f}"
        f"  consume {fig.throughput[f'consume {key}']:>12,.0f}"
        f"  together {fig.throughput[f'together {key}']:>12,.0f} msg/s",
        flush=True,
    )


def _latency(peer: Peer, fig: Figures, args: argparse.Namespace) -> None:
    """One round of ``peer``'s latency phases: each size at each rate."""
    for size in args.sizes:
        for rate in args.rates:
            key = f"{size}B @{rate}/s"
            try:
                peer.reset()
                samples = peer.latency(os.urandom(size), rate, args.seconds)
            except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                _failed(fig, f"latency {key}", exc)
                continue
            fig.latency_samples.setdefault(key, []).extend(samples)
            lat = {
                "p50": percentile(samples, 0.5),
                "p99": percentile(samples, 0.99),
                "p999": percentile(samples, 0.999),
                "n": len(samples),
            }
            fig.latency_rounds.setdefault(key, []).append(lat)
            print(
                f"  {peer.name:12s} latency {key}: p50 {lat['p50']:.2f} ms  p99 {lat['p99']:.2f}"
                f" ms  p99.9 {lat['p999']:.2f} ms ({len(samples)} samples)",
                flush=True,
            )
            if args.slowest:
                print(f"    slowest sent at ms: {slowest_at(samples, rate, args.slowest)}")


def slowest_at(samples: list[float], rate: int, n: int) -> list[int]:
    """When in the phase (ms after its first send) its ``n`` slowest messages were sent,
    in order: the samples come in the order the messages arrived, which at a paced rate
    is the order they were sent, one every ``1000 / rate`` ms. A periodic stall shows as
    bursts a period apart, in every round."""
    worst = sorted(range(len(samples)), key=samples.__getitem__, reverse=True)[:n]
    return sorted(int(i * 1000 / rate) for i in worst)


def _summarise_latency(fig: Figures) -> None:
    """Each latency figure: the median of the rounds' (samples: all rounds')."""
    for key, rounds in fig.latency_rounds.items():
        fig.latency[key] = {
            q: statistics.median(r[q] for r in rounds) for q in ("p50", "p99", "p999")
        }
        fig.latency[key]["n"] = sum(r["n"] for r in rounds)
        fig.latency[key]["rounds"] = len(rounds)


def latency_ratios(results: list[Figures]) -> dict[str, dict[str, float]]:
    """RayMQ (async flush) latency over each peer's, per load and percentile (medians
    of rounds): below 1 is RayMQ faster."""
    ours = next((f for f in results if f.peer == "raymq-async" and not f.skipped), None)
    out: dict[str, dict[str, float]] = {}
    if ours is None:
        return out
    for f in results:
        if f is ours or f.skipped:
            continue
        out[f.peer] = {
            f"{key} {q}": ours.latency[key][q] / lat[q]
            for key, lat in f.latency.items()
            if key in ours.latency
            for q in ("p50", "p99", "p999")
            if lat[q]
        }
    return out


def machine() -> dict[str, str]:
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    disk = shutil.disk_usage(tempfile.gettempdir())
    versions = {"python": platform.python_version()}
    for mod in ("ray", "redis", "nats", "numpy"):
        with contextlib.suppress(Exception):
            versions[mod] = __import__(mod).__version__
    for exe in ("redis-server", "nats-server"):
        path = shutil.which(exe)
        if path:
            out = subprocess.run([path, "--version"], capture_output=True, text=True)
            versions[exe] = (out.stdout or out.stderr).strip().splitlines()[0][:80]
    return {
        "cores": str(os.cpu_count()),
        "memory": mem,
        "cpu": platform.processor() or platform.machine(),
        "disk": f"{disk.total / 1e9:.0f} GB ({disk.free / 1e9:.0f} GB free)",
        "kernel": platform.release(),
        **versions,
    }


def ratios(results: list[Figures]) -> dict[str, dict[str, float]]:
    """RayMQ (async flush) throughput over each peer's, per workload."""
    ours = next((f for f in results if f.peer == "raymq-async" and not f.skipped), None)
    out: dict[str, dict[str, float]] = {}
    if ours is None:
        return out
    for f in results:
        if f is ours or f.skipped or f.latency_only:
            continue
        out[f.peer] = {
            k: ours.throughput[k] / v for k, v in f.throughput.items() if v and k in ours.throughput
        }
    return out


def write_report(path: Path, results: list[Figures], info: dict[str, str], command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    every = [f for f in results if not f.skipped]
    live = [f for f in every if not f.latency_only]  # the queues; the raw limits join latency
    workloads = sorted({k for f in live for k in f.throughput})
    fig, ax = plt.subplots(figsize=(max(10, len(workloads) * 0.9), 5))
    width = 0.8 / max(1, len(live))
    for i, f in enumerate(live):
        ax.bar(
            [x + i * width for x in range(len(workloads))],
            [f.throughput.get(w, 0) for w in workloads],
            width,
            label=f.peer,
        )
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(workloads))])
    ax.set_xticklabels(workloads, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("messages / s")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("Throughput per workload (log scale)")
    fig.tight_layout()
    bars = path.with_name(path.stem + "-throughput.png")
    fig.savefig(bars, dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 5))
    series = [(f.peer, key, s) for f in every for key, s in f.latency_samples.items() if s]
    colours = plt.get_cmap("tab10").colors
    styles = ("-", "--", "-.", ":")
    for i, (peer_name, key, samples) in enumerate(series):  # a colour and a style each
        ordered = sorted(samples)
        ax.plot(
            ordered,
            [j / len(ordered) for j in range(len(ordered))],
            label=f"{peer_name} {key}",
            color=colours[i % len(colours)],
            linestyle=styles[(i // len(colours) + i) % len(styles)],
        )
    ax.set_xscale("log")
    ax.set_xlabel("produce -> consume latency (ms)")
    ax.set_ylabel("fraction of messages")
    ax.legend(fontsize=7)
    ax.set_title("Latency CDF at a fixed rate")
    fig.tight_layout()
    cdf = path.with_name(path.stem + "-latency.png")
    fig.savefig(cdf, dpi=110)
    plt.close(fig)

    lines = [
        "# RayMQ next to its peers",
        "",
        "Measured side by side, in one run, on one machine. Ratios are RayMQ (ASYNC_FLUSH) "
        "throughput over the peer's; absolute figures drift on a shared machine.",
        "",
        f"Command: `{command}`",
        "",
        "## Machine",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    lines += [
        "",
        "## Throughput (messages/s)",
        "",
        "| workload | " + " | ".join(f.peer for f in live) + " |",
        "|---|" + "---|" * len(live),
    ]
    for w in workloads:  # a workload only some peers run shows "–" for the others
        cells = (f"{f.throughput[w]:,.0f}" if w in f.throughput else "–" for f in live)
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## What each peer's consume does",
        "",
        "Every consume marks what it read as consumed, so the consume figures compare the "
        "same work:",
        "",
    ]
    lines += [f"- **{f.peer}**: {f.work}" for f in every if f.work]
    lines += ["", "## RayMQ / peer", ""]
    for peer, table in ratios(results).items():
        lines.append(
            f"- **{peer}**: " + ", ".join(f"{k} {v:.2f}x" for k, v in sorted(table.items()))
        )
    lat_table = latency_ratios(results)
    if lat_table:
        lines += ["", "## RayMQ / peer latency (below 1: RayMQ faster)", ""]
        for peer, table in lat_table.items():
            lines.append(
                f"- **{peer}**: " + ", ".join(f"{k} {v:.2f}x" for k, v in sorted(table.items()))
            )
    lines += [
        "",
        "## Latency at a fixed rate (ms)",
        "",
        "Each figure is the median of the rounds' (the peers' phases interleaved in every "
        "round); samples are all rounds'.",
        "",
        "| peer | load | p50 | p99 | p99.9 | samples |",
        "|---|---|---|---|---|---|",
    ]
    for f in every:
        for key, lat in f.latency.items():
            lines.append(
                f"| {f.peer} | {key} | {lat['p50']:.2f} | {lat['p99']:.2f} | "
                f"{lat['p999']:.2f} | {lat['n']:.0f} |"
            )
    skipped = [f for f in results if f.skipped]
    if skipped:
        lines += ["", "## Skipped", ""] + [f"- {f.peer}: {f.skipped}" for f in skipped]
    failed = [(f.peer, why) for f in results for why in f.failed]
    if failed:
        lines += ["", "## Failed phases (no figure)", ""] + [f"- {p}: {w}" for p, w in failed]
    lines += ["", f"![throughput]({bars.name})", "", f"![latency]({cdf.name})", ""]
    path.write_text("\n".join(lines))
    print(f"report written to {path}")


PEERS: dict[str, Callable[[], Peer]] = {
    "raymq-async": lambda: raymq_peer("ASYNC_FLUSH"),
    "raymq-sync": lambda: raymq_peer("SYNC_FLUSH"),
    "raymq-ray": lambda: raymq_peer("ASYNC_FLUSH", "ray"),
    "raymq-stream": lambda: raymq_peer("ASYNC_FLUSH", delivery="stream"),
    "raymq-pull": lambda: raymq_peer("ASYNC_FLUSH", delivery="pull"),
    "raymq-io": lambda: raymq_peer("ASYNC_FLUSH", on_io_thread=True),
    "raymq-grpc": RayMQGrpcPeer,
    "raymq-aio": RayMQAioPeer,
    "tcp-echo": lambda: RawLimit("tcp-echo"),
    "ray-noop": lambda: RawLimit("ray-noop"),
    "py-relay": lambda: RawLimit("py-relay"),
    "redis": lambda: RedisPeer(aof=False),
    "redis-aof": lambda: RedisPeer(aof=True),
    "nats": NatsPeer,
    "ray-queue": RayQueuePeer,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    parser.add_argument("--sizes", default="100,1024")
    parser.add_argument("--producers", default="1,4")
    parser.add_argument(
        "--rate", default="1000", help="messages/s for the latency phases (comma-separated)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="latency rounds, the peers interleaved in each"
    )
    parser.add_argument(
        "--slowest",
        type=int,
        default=0,
        metavar="N",
        help="also print when in its phase each latency round's N slowest messages were sent",
    )
    parser.add_argument(
        "--latency-only",
        action="store_true",
        help="only the latency rounds (for alternated runs of one change)",
    )
    parser.add_argument(
        "--worker-nice",
        type=int,
        default=WORKER_NICENESS[0],
        help="the niceness of Ray's workers (RayMQ's processes and the Ray-hosted peers; "
        "Ray's own default: 15)",
    )
    parser.add_argument("--json", default=None)
    parser.add_argument("--report", default=None, help="write a Markdown page with plots here")
    args = parser.parse_args()
    if args.report:  # before the run, not after its twenty minutes
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--report draws its plots with matplotlib: pip install matplotlib")
    args.sizes = [int(x) for x in args.sizes.split(",")]
    args.producers = [int(x) for x in args.producers.split(",")]
    args.rates = [int(x) for x in args.rate.split(",")]
    WORKER_NICENESS[0] = args.worker_nice
    logging.basicConfig(level=logging.WARNING)
    info = machine()
    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    for name in args.peers.split(","):
        if name not in PEERS:
            parser.error(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
    results = run_peers([PEERS[name]() for name in args.peers.split(",")], args)
    table = ratios(results)
    print("\nRayMQ (ASYNC_FLUSH) / peer throughput:")
    for peer, values in table.items():
        print(f"  {peer:10s} " + "  ".join(f"{k}: {v:.2f}x" for k, v in sorted(values.items())))
    lat_table = latency_ratios(results)
    print(
        f"\nRayMQ (ASYNC_FLUSH) / peer latency, medians of {args.rounds} rounds (below 1: faster):"
    )
    for peer, values in lat_table.items():
        print(f"  {peer:10s} " + "  ".join(f"{k}: {v:.2f}x" for k, v in sorted(values.items())))
    command = "python " + " ".join(sys.argv)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": info,
                    "command": command,
                    "ratios": table,
                    "latency_ratios": lat_table,
                    "results": [
                        {
                            "peer": f.peer,
                            "throughput": f.throughput,
                            "mb_s": f.mbps,
                            "latency": f.latency,
                            "skipped": f.skipped,
                            "failed": f.failed,
                        }
                        for f in results
                    ],
                },
                indent=2,
            )
        )
    if args.report:
        write_report(Path(args.report), results, info, command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
