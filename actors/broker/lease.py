"""A broker's lease on the cluster: it stops acknowledging writes when it has lost
the cluster, and leaves when its node has.

Ray fences a dead actor only for calls that go through Ray; clients reach a broker's
own socket directly (the data path), and a broker cut off from the rest of the
cluster (a partition, a paused raylet, a VM that froze) would go on acknowledging
writes there, from clients holding cached routes, while Ray takes a minute to declare
its node dead, the NameServers drop it from their routes, and its slave may be
promoted. So, as a Raft leader steps down when it cannot hear a majority:

* the broker renews a lease by reaching Ray's GCS or any of its NameServers every
  ``lease_renew_interval_s`` (either is enough: NameServers restarting do not stop a
  broker Ray can still hear, as in RocketMQ), *and* by its own raylet answering the
  health check Ray's GCS sends it (``grpc.health.v1.Health/Check`` on the node
  manager's port): a raylet that does not answer (paused, hung, swapped out) is what
  makes Ray declare a node dead, while the broker beside it can still reach the GCS
  and the NameServers directly. When the lease has not been renewed for
  ``cluster_lease_s`` (shorter than Ray's verdict on a node), it is *fenced*: every
  write is refused with ``BrokerUnavailableError`` (its producers retry, the
  idempotent ones on the same queue, where they find the promoted master once the
  route names it) until something answers again;
* when its raylet is gone (the broker's process was re-parented) or Ray, reached
  again, has declared its node dead, the broker exits, its store closed first so the
  store's lock is free for the broker Ray starts on a node with that disk.

``cluster_lease_s`` 0 turns the lease off (a single-node embedded cluster has no
partition to fear, but the default keeps it on: it costs one ping a few seconds).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import ray

from actors.broker.runtime import BrokerRuntime

log = logging.getLogger("raymq.actors.broker.lease")

_MAX_PINGS = 4
T = TypeVar("T")


def _gcs_ping() -> None:
    """One round trip to Ray's GCS (a key-value read): what it answers does not matter."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_get(b"raymq-lease")


class RayletProbe:
    """The health check Ray's GCS makes of a node's raylet, made from the broker's side:
    ``grpc.health.v1.Health/Check`` with an empty request (the whole server) on the node
    manager's port. Answered SERVING, the raylet is alive and not stopped; a paused
    raylet lets the call time out."""

    SERVING = b"\x08\x01"  # HealthCheckResponse{status: SERVING}

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._check: Any = None
        self.address: str | None = None

    def _connect(self) -> Any:
        import grpc

        node = next((n for n in ray.nodes() if n.get("NodeID") == self.node_id), None)
        if node is None:
            raise LookupError(f"node {self.node_id[:12]} is not among Ray's nodes")
        self.address = f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}"
        channel = grpc.insecure_channel(self.address)
        return channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )

    def check(self, timeout_s: float) -> bool:
        """Whether the raylet answers SERVING within ``timeout_s`` (blocking: run it on a
        thread). Its address is looked up once, from the GCS."""
        if self._check is None:
            self._check = self._connect()
        try:
            return bool(self._check(b"", timeout=timeout_s) == self.SERVING)
        except Exception:  # noqa: BLE001 - grpc.RpcError: not answered is the answer
            return False


class ClusterLease:
    """See the module doc. ``leave`` closes the broker's store and ends its process."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        leave: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rt = runtime
        self.leave = leave
        self._clock = clock
        self._parent = os.getppid()  # the raylet that started this worker
        self._task: asyncio.Task[None] | None = None
        self._checking = False  # a check of the node's verdict is under way
        self._gcs_busy = False  # a GCS read is still on a thread (blocked in a partition)
        self._raylet = RayletProbe(runtime.node_id)
        self._raylet_busy = False
        self._nameservers: dict[str, Any] = {}  # handles, kept while they answer or time out
        # threads of its own: the broker's I/O threads may all wait on a slow disk, which
        # says nothing of whether the broker can hear the cluster
        self._threads = ThreadPoolExecutor(3, thread_name_prefix="raymq-lease")
        # the NameServers' pings are submitted from a thread too: a ``.remote()`` made
        # on the loop held the data path (and the GIL) for up to 24 ms in a latency run
        self._submit = ThreadPoolExecutor(1, thread_name_prefix="raymq-lease-ping")

    def _run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        return self.rt.loop.run_in_executor(self._threads, fn, *args)

    def _gcs_done(self, _: asyncio.Future[None]) -> None:
        self._gcs_busy = False

    def _raylet_done(self, _: asyncio.Future[bool]) -> None:
        self._raylet_busy = False

    def start(self) -> None:
        self.rt.lease_renewed = self._clock()  # however long the store took to recover
        if self.rt.config.cluster_lease_s > 0:
            self._task = self.rt.loop.create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._threads.shutdown(wait=False)
        self._submit.shutdown(wait=False)

    async def _loop(self) -> None:
        cfg = self.rt.config
        pings: set[asyncio.Task[None]] = set()
        while not self.rt.closing:
            if os.getppid() != self._parent:
                self.leave("its raylet is gone")
                return
            if len(pings) < _MAX_PINGS:  # a ping hanging in a partition does not pile up
                ping = self.rt.loop.create_task(self._renew(self._clock()))
                pings.add(ping)
                ping.add_done_callback(pings.discard)
            if (
                self.rt.fenced is None
                and self._clock() - self.rt.lease_renewed > cfg.cluster_lease_s
            ):
                self.rt.fenced = (
                    f"broker {cfg.actor_name} has not heard Ray's GCS or a NameServer, or "
                    f"its raylet, for {cfg.cluster_lease_s:g} s (cluster_lease_s): it may "
                    "be cut off from the cluster, so it takes no writes"
                )
                log.warning("%s", self.rt.fenced)
            await asyncio.sleep(cfg.lease_renew_interval_s)

    async def _renew(self, sent_at: float) -> None:
        """One ping, sent at ``sent_at``: an answer renews the lease from then. An answer
        after the lease lapsed takes the broker back only once Ray is found not to have
        declared its node dead meanwhile (it stays fenced while that is asked)."""
        cfg, rt = self.rt.config, self.rt
        if rt.faults.take("lose_cluster") or not await self._reach_cluster(cfg.cluster_lease_s):
            return
        lapsed = rt.fenced is not None or self._clock() - rt.lease_renewed > cfg.cluster_lease_s
        if lapsed and rt.fenced is None:
            rt.fenced = f"broker {cfg.actor_name}: its cluster lease lapsed; back once checked"
        rt.lease_renewed = max(rt.lease_renewed, sent_at)
        if not lapsed or self._checking:
            return
        self._checking = True
        try:
            dead = await self._node_declared_dead()
        finally:
            self._checking = False
        if dead:
            self.leave("Ray declared its node dead")
            return
        log.warning("broker %s hears the cluster again: it takes writes again", cfg.actor_name)
        rt.fenced = None

    async def _reach_cluster(self, timeout_s: float) -> bool:
        """Whether the GCS or any NameServer answers within ``timeout_s``, and the
        broker's own raylet too."""

        async def raylet() -> bool:
            if self._raylet_busy:  # the last check has not come back: not answered yet
                return False
            self._raylet_busy = True
            call = self._run(self._raylet.check, min(timeout_s, 5.0))
            call.add_done_callback(self._raylet_done)
            try:
                return await asyncio.wait_for(asyncio.shield(call), timeout_s)
            except (asyncio.TimeoutError, TimeoutError):
                return False
            except Exception as exc:  # noqa: BLE001 - its address unknown: the GCS decides
                log.info("raylet of %s not checked: %s", self.rt.config.actor_name, exc)
                return True

        async def gcs() -> bool:
            if self._gcs_busy:  # one read at a time: a blocked one must not take the threads
                return False
            self._gcs_busy = True
            call = self._run(_gcs_ping)
            call.add_done_callback(self._gcs_done)  # the thread's end, not our wait's
            try:
                await asyncio.wait_for(asyncio.shield(call), timeout_s)
                return True
            except Exception:  # noqa: BLE001 - unreachable is the answer
                return False

        async def nameserver(name: str) -> bool:
            # the handle is kept across a partition: a ping that timed out says nothing
            # of the actor, and looking it up again would wait for the GCS
            try:
                handle: Any = self._nameservers.get(name)
                if handle is None:
                    handle = await asyncio.wait_for(self._run(self.rt.nameserver, name), timeout_s)
                    self._nameservers[name] = handle
                await asyncio.wait_for(self._ping(handle), timeout_s)
                return True
            except Exception as exc:  # noqa: BLE001 - unreachable is the answer
                if isinstance(exc, ray.exceptions.RayActorError):  # gone: look it up again
                    self._nameservers.pop(name, None)
                return False

        tries = [gcs(), *(nameserver(n) for n in self.rt.config.nameservers)]
        local, *cluster = await asyncio.gather(raylet(), *tries)
        return bool(local) and any(cluster)

    async def _ping(self, handle: Any) -> None:
        """A NameServer's ``ping``, submitted on the ping thread, its answer awaited here."""
        ref = await self.rt.loop.run_in_executor(self._submit, handle.ping.remote)
        await ref

    async def _node_declared_dead(self) -> bool:
        """Whether the GCS lists this broker's node as dead (a verdict given while the
        broker was cut off: Ray starts its actors elsewhere, so it must not go on)."""
        node_id = self.rt.node_id
        try:
            nodes = await asyncio.wait_for(self._run(ray.nodes), 10.0)
        except Exception:  # noqa: BLE001 - not known: the lease decides alone
            return False
        return any(n.get("NodeID") == node_id and not n.get("Alive", True) for n in nodes)
