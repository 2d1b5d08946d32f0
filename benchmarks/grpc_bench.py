"""RocketMQ 5 gRPC SendMessage: RayMQ's broker beside the raw grpc.aio floor, one run.

    PYTHONPATH=$PWD flock /tmp/raymq-ray.lock python benchmarks/grpc_bench.py \
        [--seconds 3] [--rounds 3] [--in-flight 1,64] [--rate 1000] \
        [--targets floor,ray-noop,broker,official] [--json out.json]

Targets, all answering the same unary ``SendMessage`` on 127.0.0.1:

* ``floor``: a ``grpc.aio`` server in a plain process whose SendMessage returns a
  canned answer: what Python gRPC itself costs on this machine, nothing of RayMQ.
* ``ray-noop``: the same no-op server inside a Ray async actor (on the actor's event
  loop, as the broker's was): what Ray's actor loop adds.
* ``ray-thread``: the same no-op server on an event loop of its own, in a thread of a
  Ray actor's process (Ray's actor loop left alone).
* ``broker``: a RayMQ broker (``grpc_enable``): signature check, conversion, the store.
* ``official-floor``: the official Python client's ``Producer`` (``send_async``) against
  the floor's no-op server: what the client itself can do.
* ``official``: the broker driven by the official Producer.

The raw client is grpc.aio in its own process with the official client's generated
stubs (``rocketmq.grpc_protocol``) and metadata signed per call as the official client
signs it (``rocketmq.v5.util.signature.Signature``). Two measures per target and
round: throughput with N calls in flight for ``--seconds`` (closed loop), and round-trip
latency of single calls started on a schedule of ``--rate`` calls a second (open loop,
p50/p99). Rounds alternate the targets (the machine drifts); medians are printed, and
each target's throughput as a ratio of the floor's in the same run. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing as mp
import os
import queue
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TOPIC = "GrpcBench"
QUEUES = 16
BODY = 100


# ------------------------------------------------------------------ the no-op servers


def _noop_servicer(addr: list[str]) -> Any:
    """A MessagingService whose SendMessage answers OK at once, with just enough of
    QueryRoute, Telemetry and Heartbeat for the official Producer to start against it
    (our generated stubs: only ever imported in a process that does not load the official
    client's)."""
    from actors.broker.grpc.v2 import definition_pb2 as pb
    from actors.broker.grpc.v2 import service_pb2 as spb
    from actors.broker.grpc.v2 import service_pb2_grpc as sgrpc

    ok = pb.Status(code=pb.Code.OK, message="OK")

    class Noop(sgrpc.MessagingServiceServicer):
        async def SendMessage(self, request: Any, context: Any) -> Any:
            entries = [
                spb.SendResultEntry(status=ok, message_id=m.system_properties.message_id, offset=0)
                for m in request.messages
            ]
            return spb.SendMessageResponse(status=ok, entries=entries)

        async def Heartbeat(self, request: Any, context: Any) -> Any:
            return spb.HeartbeatResponse(status=ok)

        async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
            return spb.NotifyClientTerminationResponse(status=ok)

        async def QueryRoute(self, request: Any, context: Any) -> Any:
            host, _, port = addr[0].rpartition(":")
            broker = pb.Broker(
                name="noop",
                id=0,
                endpoints=pb.Endpoints(
                    scheme=pb.AddressScheme.IPv4, addresses=[pb.Address(host=host, port=int(port))]
                ),
            )
            queues = [
                pb.MessageQueue(
                    topic=request.topic,
                    id=i,
                    permission=pb.Permission.READ_WRITE,
                    broker=broker,
                    accept_message_types=[pb.MessageType.NORMAL],
                )
                for i in range(QUEUES)
            ]
            return spb.QueryRouteResponse(status=ok, message_queues=queues)

        async def Telemetry(self, request_iterator: Any, context: Any) -> Any:
            async for command in request_iterator:
                if command.WhichOneof("command") == "settings":
                    yield spb.TelemetryCommand(status=ok, settings=command.settings)

    return Noop(), sgrpc


async def _start_noop() -> tuple[Any, str]:
    import grpc

    addr: list[str] = []
    servicer, sgrpc = _noop_servicer(addr)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    sgrpc.add_MessagingServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    addr.append(f"127.0.0.1:{port}")
    await server.start()
    return server, f"127.0.0.1:{port}"


def _floor_process(out: Any, stop: Any) -> None:
    async def main() -> None:
        server, addr = await _start_noop()
        out.put(addr)
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        await server.stop(0)

    asyncio.run(main())


class NoopActor:
    """The no-op server on a Ray async actor's event loop, or (``thread``) on an event
    loop of its own in a thread of the actor's process."""

    async def start(self, thread: bool = False) -> str:
        if not thread:
            self.server, addr = await _start_noop()
            return addr
        import concurrent.futures
        import threading

        ready: concurrent.futures.Future[str] = concurrent.futures.Future()

        def run() -> None:
            async def serve() -> None:
                self.server, addr = await _start_noop()
                ready.set_result(addr)
                await asyncio.Event().wait()

            asyncio.run(serve())

        threading.Thread(target=run, name="grpc-noop", daemon=True).start()
        return await asyncio.wrap_future(ready)

    def pid(self) -> int:
        return os.getpid()


# ------------------------------------------------------------------ the clients


class _Creds:
    def __init__(self, ak: str, sk: str) -> None:
        self.ak, self.sk = ak, sk


class _Config:
    def __init__(self, ak: str, sk: str) -> None:
        self.credentials = _Creds(ak, sk)
        self.namespace = ""


def _raw_client(
    addr: str, ak: str, sk: str, in_flight: int, seconds: float, rate: int, out: Any
) -> None:
    """grpc.aio with the official client's stubs: (calls/s with ``in_flight`` in flight,
    latencies (ms) of calls started ``rate`` a second)."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as spb
    from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc
    from rocketmq.v5.util.signature import Signature

    config = _Config(ak, sk)
    client_id = f"bench@{os.getpid()}@0@{uuid.uuid4().hex[:8]}"

    def request() -> Any:
        req = spb.SendMessageRequest()
        m = req.messages.add()
        m.topic.name = TOPIC
        m.body = b"x" * BODY
        sp = m.system_properties
        sp.message_id = uuid.uuid4().hex.upper()
        sp.message_type = pb.MessageType.NORMAL
        sp.born_timestamp.seconds = int(time.time())
        sp.born_host = "127.0.0.1"
        sp.body_encoding = pb.Encoding.IDENTITY
        return req

    failed = 0

    async def call(stub: Any) -> float | None:
        """The round trip (ms), or None for a call that failed."""
        nonlocal failed
        started = time.perf_counter()
        try:
            res = await stub.SendMessage(
                request(), metadata=Signature.metadata(config, client_id), timeout=10
            )
        except grpc.aio.AioRpcError:
            failed += 1
            return None
        if res.status.code != pb.Code.OK:
            raise RuntimeError(f"SendMessage answered {res.status}")
        return (time.perf_counter() - started) * 1e3

    async def main() -> tuple[float, list[float], int]:
        nonlocal failed
        async with grpc.aio.insecure_channel(addr) as channel:
            stub = sgrpc.MessagingServiceStub(channel)
            for _ in range(200):  # warm up
                await call(stub)
            done = 0
            stop = time.perf_counter() + seconds

            async def worker() -> None:
                nonlocal done
                while time.perf_counter() < stop:
                    await call(stub)
                    done += 1

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(in_flight)))
            rate_out = done / (time.perf_counter() - started)
            # open loop: a call started every 1/rate s whatever the others do (a call that
            # could not start within 1 s of its time is counted as failed: saturated)
            tasks = []
            t0 = time.perf_counter()
            for i in range(int(rate * seconds)):
                delay = t0 + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -1.0:
                    failed += 1
                    continue
                tasks.append(asyncio.ensure_future(call(stub)))
            lat = [x for x in await asyncio.gather(*tasks) if x is not None]
            return rate_out, lat, 200 + done + len(tasks)

    cpu = time.process_time()
    rate_out, lat, calls = asyncio.run(main())
    out.put((rate_out, lat, calls, time.process_time() - cpu, failed))


def _official_client(addr: str, ak: str, sk: str, in_flight: int, seconds: float, out: Any) -> None:
    """The official Producer's ``send_async`` with ``in_flight`` sends in flight: acked/s."""
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    producer = Producer(ClientConfiguration(addr, Credentials(ak, sk)), (TOPIC,))
    producer.startup()
    try:

        def run(secs: float) -> int:
            acked = 0
            pending: list[Any] = []
            stop = time.perf_counter() + secs
            while time.perf_counter() < stop:
                m = Message()
                m.topic = TOPIC
                m.body = b"x" * BODY
                pending.append(producer.send_async(m))
                if len(pending) >= in_flight:
                    pending.pop(0).result()
                    acked += 1
            for f in pending:
                f.result()
            return acked + len(pending)

        cpu = time.process_time()
        warm = run(0.5)
        started = time.perf_counter()
        n = run(seconds)
        out.put((n / (time.perf_counter() - started), warm + n, time.process_time() - cpu))
    finally:
        producer.shutdown()


def cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system, every thread) a process has used so far."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _in_process(target: Any, *args: Any) -> Any:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, out))
    p.start()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                return out.get(timeout=1.0)
            except queue.Empty:
                if not p.is_alive():
                    raise RuntimeError(f"{target.__name__} died (exit {p.exitcode})") from None
        raise TimeoutError(f"{target.__name__} gave no answer in 300 s")
    finally:
        p.join(timeout=30)


# ------------------------------------------------------------------ the run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--in-flight", default="1,64")
    ap.add_argument("--rate", type=int, default=1000, help="open-loop calls a second")
    ap.add_argument("--targets", default="floor,ray-noop,ray-thread,broker,official-floor,official")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    targets = args.targets.split(",")
    in_flights = [int(x) for x in args.in_flight.split(",")]

    addrs: dict[str, str] = {}
    pids: dict[str, int | None] = {}
    creds = ("bench", "bench-secret")
    ctx = mp.get_context("spawn")
    floor_stop = ctx.Event()
    floor_proc = None
    cluster = None
    noops: list[Any] = []
    root = tempfile.mkdtemp(prefix="raymq-grpc-bench-")
    try:
        if {"floor", "official-floor"} & set(targets):
            q = ctx.Queue()
            floor_proc = ctx.Process(target=_floor_process, args=(q, floor_stop))
            floor_proc.start()
            addrs["floor"] = addrs["official-floor"] = q.get(timeout=60)
            pids["floor"] = pids["official-floor"] = floor_proc.pid
        if {"ray-noop", "ray-thread", "broker", "official"} & set(targets):
            import ray

            ray.init(
                address="local",  # never another cluster
                num_cpus=4,
                include_dashboard=False,
                logging_level=logging.WARNING,
                namespace=f"raymq-grpc-bench-{os.getpid()}",
            )
        for target in ("ray-noop", "ray-thread"):
            if target in targets:
                import ray

                actor = ray.remote(num_cpus=0)(NoopActor).remote()  # type: ignore[arg-type]
                noops.append(actor)
                addrs[target] = ray.get(actor.start.remote(target == "ray-thread"))
                pids[target] = ray.get(actor.pid.remote())
        if {"broker", "official"} & set(targets):
            import actors

            cluster = actors.start_cluster(
                namespace=f"raymq-grpc-bench-{os.getpid()}",
                nameservers=1,
                brokers=1,
                store_root=root,
                broker_options={"grpc_enable": True, "grpc_bind": "127.0.0.1"},
            )
            creds = cluster.grpc_credentials()
            ((name, info),) = cluster.grpc_endpoints().items()
            addrs["broker"] = addrs["official"] = info["addr"]
            import ray

            status = ray.get(ray.get_actor(name, namespace=cluster.namespace).status.remote())
            pids["broker"] = pids["official"] = status.get("pid")
            cluster.admin.create_topic(TOPIC, QUEUES, QUEUES)

        results: dict[str, dict[str, list[float]]] = {t: {} for t in targets}
        for r in range(args.rounds):
            for target in targets if r % 2 == 0 else reversed(targets):
                res = results[target]
                for n in in_flights:
                    server_cpu = cpu_s(pids.get(target))
                    if target.startswith("official"):
                        rate, calls, client_cpu = _in_process(
                            _official_client, addrs[target], *creds, n, args.seconds
                        )
                        server_us = (cpu_s(pids.get(target)) - server_cpu) / calls * 1e6
                        client_us = client_cpu / calls * 1e6
                        res.setdefault(f"{n} in flight msg/s", []).append(rate)
                        res.setdefault(f"{n} in flight server cpu us/call", []).append(server_us)
                        res.setdefault(f"{n} in flight client cpu us/call", []).append(client_us)
                        print(
                            f"round {r} {target:9s} {n:3d} in flight {rate:8.0f}/s   "
                            f"cpu/call server {server_us:5.0f} us client {client_us:5.0f} us",
                            flush=True,
                        )
                        continue
                    rate, lat, calls, client_cpu, failed = _in_process(
                        _raw_client, addrs[target], *creds, n, args.seconds, args.rate
                    )
                    server_us = (cpu_s(pids.get(target)) - server_cpu) / calls * 1e6
                    client_us = client_cpu / calls * 1e6
                    res.setdefault(f"{n} in flight server cpu us/call", []).append(server_us)
                    res.setdefault(f"{n} in flight client cpu us/call", []).append(client_us)
                    lat.sort()
                    p50 = lat[len(lat) // 2] if lat else float("nan")
                    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
                    res.setdefault(f"{n} in flight msg/s", []).append(rate)
                    res.setdefault(f"failed calls ({n} in flight run)", []).append(failed)
                    res.setdefault(f"p50 ms @{args.rate}/s", []).append(p50)
                    res.setdefault(f"p99 ms @{args.rate}/s", []).append(p99)
                    print(
                        f"round {r} {target:9s} {n:3d} in flight {rate:8.0f}/s   "
                        f"@{args.rate}/s p50 {p50:6.2f} ms p99 {p99:6.2f} ms   "
                        f"cpu/call server {server_us:5.0f} us client {client_us:5.0f} us"
                        + (f"   {failed} calls failed" if failed else ""),
                        flush=True,
                    )
        medians = {t: {k: statistics.median(v) for k, v in m.items()} for t, m in results.items()}
        print(f"\nmedians of {args.rounds} rounds, {BODY} B, {args.seconds:g} s each:")
        for t, m in medians.items():
            cells = []
            for k, v in m.items():
                ratio = ""
                floor = medians.get("floor", {}).get(k)
                if "msg/s" in k and floor:
                    ratio = f" ({v / floor:.2f}x floor)"
                cells.append(f"{k} {v:.2f}{ratio}" if " ms" in k else f"{k} {v:.0f}{ratio}")
            print(f"  {t:9s} " + "\n            ".join(cells))
        if args.json:
            Path(args.json).write_text(json.dumps({"raw": results, "medians": medians}, indent=1))
    finally:
        floor_stop.set()
        if floor_proc is not None:
            floor_proc.join(timeout=10)
        if cluster is not None:
            cluster.shutdown()
        for actor in noops:
            import ray

            ray.kill(actor)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
