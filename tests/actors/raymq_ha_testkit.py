"""Helpers shared by the high-availability tests (imported by name, like raymq_testkit)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from raymq_testkit import SMALL_STORE, wait_until

import actors
from actors import BrokerConfig, PullStatus, SendStatus
from actors.keeper import start_broker_actor
from actors.protocol.wire import pull_from_wire
from rebalance import MessageQueue
from storage import Message
from storage.codec import decode_records

RAFT = {
    "enable_dledger": True,
    "dledger_peers": (0, 1, 2),
    "dledger_tick_ms": 50,
    "dledger_heartbeat_ms": 150,
    "dledger_election_timeout_ms": 600,
    "slave_sync_interval_s": 0.3,
}
"""Broker options of a three-member DLedger group with timings short enough for tests."""


def status_of(handle: Any, timeout: float = 10.0) -> dict[str, Any]:
    """A broker's status, or {} while it is dead or restarting."""
    try:
        return ray.get(handle.status.remote(), timeout=timeout)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return {}


def commitlog_bytes(store_dir: str) -> bytes:
    """The whole CommitLog of a store directory as one string of bytes (file by file,
    trailing zeros of the last file dropped)."""
    files = sorted((Path(store_dir) / "commitlog").iterdir())
    data = b"".join(f.read_bytes() for f in files)
    return data.rstrip(b"\x00")


def broker_config(
    cluster: actors.Cluster, store_root: str, broker_name: str, broker_id: int, **options: Any
) -> BrokerConfig:
    """The config ``make_cluster`` gives a broker (to start it again by hand)."""
    values: dict[str, Any] = {
        "store": SMALL_STORE,
        "heartbeat_interval_s": 2.0,
        "auto_create_topic_enable": True,
        **options,
    }
    return BrokerConfig(
        broker_name=broker_name,
        broker_id=broker_id,
        namespace=cluster.namespace,
        nameservers=tuple(cluster.nameserver_names),
        store_dir=f"{store_root}/{broker_name}-{broker_id}",
        **values,
    )


def start_broker(config: BrokerConfig, node_id: str | None = None) -> Any:
    """Start a Broker actor the way ``start_cluster`` and the keeper do
    (``actors.keeper.start_broker_actor``), on ``node_id`` or this node, and wait for it."""
    handle = start_broker_actor(config, node_id or ray.get_runtime_context().get_node_id(), 0)
    ray.get(handle.ping.remote(), timeout=60)
    return handle


def is_dead(handle: Any) -> bool:
    """True once the actor is dead. A status call that only times out (a busy machine)
    says nothing: the actor may still replicate and answer."""
    try:
        ray.get(handle.status.remote(), timeout=2.0)
    except ray.exceptions.RayActorError:
        return True
    except ray.exceptions.GetTimeoutError:
        return False
    return False


def _gone(pid: int) -> bool:
    """True once process ``pid`` has exited (a zombie has: it runs no more code)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def kill(handle: Any) -> None:
    """Kill the broker and wait until its process is gone. Ray calls the actor dead
    before its process has stopped: a slave still running for those milliseconds may
    append one more transfer (a test's "behind" slave then is not behind)."""
    pid = ray.get(handle.status.remote(), timeout=30)["pid"]
    ray.kill(handle, no_restart=True)
    wait_until(lambda: is_dead(handle), timeout_s=30, what="broker dead")
    wait_until(lambda: _gone(pid), timeout_s=30, what="broker process gone")


def members(cluster: actors.Cluster, broker_name: str) -> dict[int, str]:
    info = ray.get(cluster.nameserver(0).get_cluster_info.remote())
    entry = info["brokers"].get(broker_name, {}).get("members", {})
    return {bid: m["actor_name"] for bid, m in entry.items()}


def restart_nameserver(cluster: actors.Cluster, index: int = 0) -> None:
    """SIGKILL NameServer ``index`` and wait until Ray's restart of it answers (it has
    forgotten every registration). ``ray.kill`` returns before the process stops: the
    old one may still answer for a moment, with the registrations it held."""
    handle = cluster.nameserver(index)
    old = ray.get(handle.get_cluster_info.remote(), timeout=30)["pid"]
    ray.kill(handle, no_restart=False)

    def restarted() -> bool:
        try:
            return ray.get(handle.get_cluster_info.remote(), timeout=5)["pid"] != old
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False

    wait_until(restarted, timeout_s=60, what=f"NameServer {index} restarted")


@dataclass
class Load:
    """Sends batches in a thread until stopped; keeps what was acknowledged (SEND_OK)."""

    producer: actors.Producer
    topic: str
    batch: int = 20
    acked: list[bytes] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # statuses/errors of the rest
    ok_times: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _seq: int = 0

    def start(self) -> Load:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            bodies = [b"load-%08d" % (self._seq + i) for i in range(self.batch)]
            self._seq += self.batch
            try:
                results = self.producer.send_batch([Message(self.topic, b) for b in bodies])
            except Exception as exc:  # noqa: BLE001 - failover in progress
                self.other.append(type(exc).__name__)
                self.stop.wait(0.02)  # a pause between failed sends, cut short by stop()
                continue
            for body, r in zip(bodies, results):
                if r.status is SendStatus.SEND_OK:
                    self.acked.append(body)
                else:
                    self.other.append(r.status.value)
            if all(r.status is SendStatus.SEND_OK for r in results):
                self.ok_times.append(time.monotonic())

    def acked_since(self, t: float) -> int:
        return sum(1 for x in self.ok_times if x > t)

    def finish(self) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def read_all(
    consumer: actors.PullConsumer, topic: str, queues: Iterable[MessageQueue] | None = None
) -> list[bytes]:
    """Every body of ``topic`` from offset 0 (through whichever member serves reads)."""
    out: list[bytes] = []
    for mq in queues if queues is not None else consumer.fetch_subscribe_queues(topic):
        offset = 0
        while True:
            r = consumer.pull(mq, offset, 1000)
            if r.status is not PullStatus.FOUND:
                break
            out.extend(r.bodies)
            offset = r.next_offset
    return out


def read_member(handle: Any, topic: str, queue_ids: Iterable[int]) -> list[bytes]:
    """Every body of ``topic`` one broker actor holds (committed, for a DLedger member)."""
    out: list[bytes] = []
    for qid in queue_ids:
        offset = 0
        while True:
            raw = pull_from_wire(
                ray.get(handle.pull.remote("", topic, qid, offset, 1000), timeout=30)
            )
            if not raw.count:
                break
            out.extend(m.body for m in decode_records(raw.data, check_crc=False))
            offset = raw.next_offset
    return out


@dataclass
class RaftGroup:
    cluster: actors.Cluster
    handles: dict[str, Any]
    """Each member's handle by actor name (``<broker name>-<id>``)."""
    leader: str
    """The actor name of the member that led when the group started."""

    def leader_handle(self) -> Any:
        return self.handles[self.leader]

    def followers(self) -> dict[str, Any]:
        return {n: h for n, h in self.handles.items() if n != self.leader}
