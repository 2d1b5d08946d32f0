"""The client of a fault run: a program the lab starts in the client's namespace.

It starts a RayMQ cluster on the lab's Ray (NameServers on the head node, brokers on the
nodes the spec names by resource), sends unique messages through the public API until
told to stop, then reads every queue back and prints the history. It talks to the test
in JSON lines: the spec is its argument; it prints ``ready`` (with each broker's pid and
node), ``progress`` every half second and finally ``history``; a line ``stop`` on its
stdin ends the sends. :class:`Workload` is the test's end of that conversation;
:func:`brokers_on`, :func:`start_workload`, :func:`finish` and :func:`assert_exactly_once`
are the setup and the verdict every scenario (and ``benchmarks.faults``) shares.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

import ray
from checker import ABORTED, Op, Verdict, check, torn_transactions

import actors
from actors import BrokerSpec, PullStatus, SendStatus
from actors.keeper import resolve_node, start_broker_actor
from storage import Message
from storage.errors import ProducerFencedError
from storage.message_id import parse_offset_msg_id

if TYPE_CHECKING:
    from harness import FaultLab, Node

log = logging.getLogger("raymq.tests.faults.workload")

SMALL_STORE = {
    "commitlog_file_size": 8 << 20,
    "consume_queue_file_entries": 20_000,
    "index_hash_slots": 4099,
    "index_max_entries": 200_000,
    "flush_interval_commitlog_ms": 50,
}


_EMITTING = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout. Several threads emit (progress, status, history): each
    line is written whole under a lock, since ``print`` writes the text and its newline
    in two calls, and two events run together into one line the runner cannot parse
    (a ``status`` lost that way stopped seeds 4 and 6 with "no 'status' in 60s")."""
    line = json.dumps({"event": event, **fields}) + "\n"
    with _EMITTING:
        sys.stdout.write(line)
        sys.stdout.flush()


def start(spec: dict[str, Any]) -> None:
    """Runs as a task on the head node, so the NameServers start there."""
    actors.start_cluster(
        namespace=spec["namespace"],
        nameservers=1,
        topics=[actors.TopicConfig(spec["topic"], spec["queues"], spec["queues"])],
        brokers=[
            BrokerSpec(b["name"], b["id"], node=b["node"], store_dir=b["store_dir"])
            for b in spec["brokers"]
        ],
        broker_options={"store": SMALL_STORE, **spec["broker_options"]},
        max_restarts=0,
        auto_promote=spec.get("auto_promote", False),
    )


class Sender:
    """Sends batches of unique bodies, paced, from one thread; keeps every op (with the
    broker groups that answered it, the store hosts, ``ip:port``, of the members that
    wrote it, each message's ``[host, CommitLog offset, "broker:queue", queue offset]``,
    when it was answered)."""

    def __init__(self, producer: actors.Producer, topic: str, batch: int, pace_s: float) -> None:
        self.producer, self.topic, self.batch, self.pace_s = producer, topic, batch, pace_s
        self.ops: list[dict[str, Any]] = []
        self.acked_max: dict[str, int] = {}  # host -> the highest offset it acknowledged
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seq = 0
        while not self.stop.is_set():
            bodies = [f"m-{seq + i:08d}" for i in range(self.batch)]
            seq += self.batch
            invoked = time.monotonic()
            brokers: list[str] = []
            hosts: list[str] = []
            offsets: list[list[Any]] = []
            try:
                results = self.producer.send_batch(
                    [Message(self.topic, b.encode()) for b in bodies]
                )
                statuses = {r.status for r in results}
                brokers = sorted({r.message_queue.broker_name for r in results})
                # which member of a group acknowledged: its host is in the offset msg id
                for r in results:
                    host, offset = parse_offset_msg_id(r.offset_msg_id)
                    mq = r.message_queue
                    offsets.append(
                        [host, offset, f"{mq.broker_name}:{mq.queue_id}", r.queue_offset]
                    )
                hosts = sorted({o[0] for o in offsets})
                outcome = (
                    "SEND_OK"
                    if statuses == {SendStatus.SEND_OK}
                    else "+".join(sorted(s.value for s in statuses))
                )
            except Exception as exc:  # noqa: BLE001 - every failure is part of the history
                outcome = type(exc).__name__
            if outcome == "SEND_OK":
                for host, offset, *_ in offsets:
                    self.acked_max[host] = max(self.acked_max.get(host, -1), offset)
            self.ops.append(
                {"bodies": bodies, "invoked": invoked, "completed": time.monotonic(),
                 "outcome": outcome, "brokers": brokers, "hosts": hosts, "offsets": offsets}
            )  # fmt: skip
            self.stop.wait(self.pace_s)

    def acked(self) -> int:
        return sum(len(op["bodies"]) for op in self.ops if op["outcome"] == "SEND_OK")

    def last_hosts(self) -> list[str]:
        """The store hosts that wrote the latest acknowledged send (a group's leader)."""
        return next((op["hosts"] for op in reversed(self.ops) if op["outcome"] == "SEND_OK"), [])


def door_acked(doors: Sequence[GrpcSender | TxnSender], last: int = 200) -> list[str]:
    """The bodies of each door's latest ``last`` acknowledged ops (gRPC sends, committed
    transactions), and each committed transaction's id: their answers name no CommitLog
    offset, so a power loss finds them in the store (``store_faults.last_record_holding``)
    to know what was fsynced. A one-phase commit's last record is its marker, which holds
    no body but the transaction's id."""
    return [
        needle
        for door in doors
        for op in door.ops[-last:]
        if op["outcome"] == "SEND_OK"
        for needle in (*op["bodies"], *([op["txn"]] if op.get("txn") else []))
    ]


GRPC_BODY_PREFIX = "g-"
"""The gRPC door's bodies: at least once (the official client sends again after a
refusal, and no broker drops the copy), where the idempotent producer's are once."""


class GrpcSender:
    """Sends single unique bodies (``g-...``) through the RocketMQ 5 gRPC door with the
    official client (``rocketmq-python-client``), paced, from one thread; its ops are
    kept as :class:`Sender`'s, with only the broker group the receipt names (its
    message id does not name the member that wrote it, nor the receipt the queue)."""

    def __init__(self, cluster: actors.Cluster, spec: dict[str, Any]) -> None:
        self.cluster, self.topic, self.pace_s = cluster, spec["topic"], spec["grpc_pace_s"]
        self.addrs = [f"{b['ip']}:{spec['grpc_port']}" for b in spec["brokers"]]
        self.ops: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from rocketmq import ClientConfiguration, Credentials
        from rocketmq import Message as GrpcMessage
        from rocketmq import Producer as GrpcProducer

        producer = None
        while producer is None and not self.stop.is_set():
            try:  # the first route query needs a broker that answers
                ak, sk = self.cluster.grpc_credentials()
                endpoints = ";".join(self.addrs)
                config = ClientConfiguration(endpoints, Credentials(ak, sk), request_timeout=3)
                producer = GrpcProducer(config, (self.topic,))
                producer.startup()
            except Exception:  # noqa: BLE001 - told on stderr, tried again
                log.exception("the gRPC producer did not start; trying again")
                producer = None
                self.stop.wait(1.0)
        seq = 0
        while producer is not None and not self.stop.is_set():
            body = f"{GRPC_BODY_PREFIX}{seq:08d}"
            seq += 1
            msg = GrpcMessage()
            msg.topic, msg.body = self.topic, body.encode()
            invoked = time.monotonic()
            offsets: list[list[Any]] = []
            try:
                receipt = producer.send(msg)
                # the broker the client sent to (kept private, name-mangled); the queue
                # is the broker's choice, as RocketMQ's proxy's, so the receipt's queue id
                # is not where the message went, nor its offset in which queue
                broker = receipt.message_queue._MessageQueue__broker_name
                offsets.append([None, None, f"{broker}:", None])
                outcome = "SEND_OK"
            except Exception as exc:  # noqa: BLE001 - every failure is part of the history
                outcome = type(exc).__name__
            self.ops.append(
                {"bodies": [body], "invoked": invoked, "completed": time.monotonic(),
                 "outcome": outcome, "brokers": [], "hosts": [], "offsets": offsets,
                 "door": "grpc"}
            )  # fmt: skip
            self.stop.wait(self.pace_s)
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.shutdown()


class TxnSender:
    """Multi-message transactions (``TransactionalProducer``) of ``txn_size`` unique
    bodies (``t-...``) spread over every queue, hence over every broker of the topic,
    from one thread; every ``abort_every``-th is aborted on purpose. Each transaction is
    one op, its outcome ``SEND_OK`` (the commit answered), ``ABORTED`` or the
    exception's name (its end unknown)."""

    def __init__(self, cluster: actors.Cluster, spec: dict[str, Any]) -> None:
        self.cluster, self.spec = cluster, spec
        self.ops: list[dict[str, Any]] = []
        self.details: dict[str, list[str]] = {}  # outcome -> its first errors' text
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _producer(self) -> actors.TransactionalProducer:
        return self.cluster.transactional_producer(
            "fault-txn",
            "fault-txn-1",
            coordinator_log_dir=self.spec["txn_log_dir"],
            send_timeout_s=self.spec["send_timeout_s"],
        )

    def _run(self) -> None:
        spec = self.spec
        producer = self._producer()
        seq = 0
        n = 0
        while not self.stop.is_set():
            bodies = [f"t-{seq + i:08d}" for i in range(spec["txn_size"])]
            seq += len(bodies)
            n += 1
            invoked = time.monotonic()
            txn = None
            try:
                txn = producer.begin()
                txn.send([Message(spec["topic"], b.encode()) for b in bodies])
                if n % spec["abort_every"] == 0:
                    txn.abort()
                    outcome = ABORTED
                else:
                    txn.commit()
                    outcome = "SEND_OK"
            except Exception as exc:  # noqa: BLE001 - every failure is part of the history
                outcome = type(exc).__name__
                seen = self.details.setdefault(outcome, [])
                if len(seen) < 3:
                    seen.append(f"{exc}"[:500])
                if txn is not None:
                    with contextlib.suppress(Exception):
                        txn.abort()  # what the coordinator decides stands; free the producer
                if isinstance(exc, ProducerFencedError):  # no other instance exists: a
                    with contextlib.suppress(Exception):  # new one takes the id over, as
                        producer.close()  # an operator's restart would; the history keeps it
                    producer = self._producer()
            self.ops.append(
                {"bodies": bodies, "invoked": invoked, "completed": time.monotonic(),
                 "outcome": outcome, "door": "txn", "txn": txn and txn.txn_id}
            )  # fmt: skip
            self.stop.wait(spec["txn_pace_s"])
        with contextlib.suppress(Exception):
            producer.close()


def watch_roles(
    cluster: actors.Cluster, spec: dict[str, Any], stop: threading.Event, out: list[list[Any]]
) -> None:
    """The role history: every ``roles_s`` each broker member's own word on its role, kept
    as ``[t, member, host ip, leads, epoch]`` whenever it changes (``leads``: a master or
    Raft leader that is not fenced; ``epoch``: its Raft term or its master epoch)."""
    last: dict[str, tuple[Any, ...]] = {}
    handles: dict[str, Any] = {}
    while not stop.wait(spec["roles_s"]):
        for b in spec["brokers"]:
            key = f"{b['name']}-{b['id']}"
            t = time.monotonic()
            try:
                if key not in handles:
                    handles[key] = cluster.broker(b["name"], b["id"])
                st = ray.get(handles[key].status.remote(), timeout=1.0)
            except Exception:  # noqa: BLE001 - down, restarting or partitioned
                handles.pop(key, None)
                continue
            raft = st.get("raft_role")
            leads = (raft == "leader" if raft else st.get("role") == "MASTER") and not st.get(
                "fenced"
            )
            epoch = int(st.get("term", st.get("master_epoch", 0)) or 0)
            state = (st.get("node_ip"), leads, epoch)
            if last.get(key) != state:
                out.append([t, key, st.get("node_ip"), leads, epoch])
                last[key] = state


class Committer:
    """A consumer group (``fault-consumer``) pulling every queue and committing what it
    pulled, from one thread; before each pull it reads the group's committed offset back
    from the broker and keeps it as ``[broker:queue, offset, when]`` (a committed offset
    must never move backwards)."""

    def __init__(self, cluster: actors.Cluster, topic: str, stop: threading.Event) -> None:
        self.consumer = cluster.pull_consumer("fault-consumer")
        self.topic, self.stop = topic, stop
        self.seen: list[list[Any]] = []
        self.failures = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        queues: list[Any] = []
        while not self.stop.wait(0.1):
            try:
                queues = queues or self.consumer.fetch_subscribe_queues(self.topic)
                for mq in queues:
                    committed = self.consumer.fetch_offset(mq)
                    key = f"{mq.broker_name}:{mq.queue_id}"
                    self.seen.append([key, committed, time.monotonic()])
                    r = self.consumer.pull(mq, max(committed, 0), 64)
                    if r.status is PullStatus.FOUND:
                        self.consumer.commit(mq, r.next_offset)
            except Exception:  # noqa: BLE001 - a broker down or failing over: next round
                self.failures += 1


def read_all(cluster: actors.Cluster, topic: str) -> list[str]:
    consumer = cluster.pull_consumer("fault-checker")
    out: list[str] = []
    for mq in consumer.fetch_subscribe_queues(topic):
        offset = 0
        while True:
            r = consumer.pull(mq, offset, 1000)
            if r.status is not PullStatus.FOUND:
                break
            out.extend(b.decode() for b in r.bodies)
            offset = r.next_offset
    return out


def restart_broker(cluster: actors.Cluster, spec: dict[str, Any], index: int) -> None:
    """Start broker ``spec["brokers"][index]`` again from its store on its node, with the
    config ``start()`` gave it (an operator restarting a crashed machine's broker), unless
    the cluster's keeper (``actors/keeper``) has already started it there: then wait for
    that one to answer."""
    b = spec["brokers"][index]
    names = [x for x in spec["brokers"] if x["name"] == b["name"]]
    options = {"store": SMALL_STORE, **spec["broker_options"]}
    config = actors.BrokerConfig(
        listen_port=10911 + 10 * index,
        **options,
        **(
            {"dledger_peers": tuple(x["id"] for x in names)}
            if options.get("enable_dledger")
            else {}
        ),
        broker_name=b["name"],
        broker_id=b["id"],
        cluster_name=actors.ClusterConfig().cluster_name,
        namespace=spec["namespace"],
        nameservers=tuple(cluster.nameserver_names),
        store_dir=b["store_dir"],
    )
    try:
        handle = start_broker_actor(config, resolve_node(b["node"]), 0)
    except ray.exceptions.ActorAlreadyExistsError:  # the keeper was first
        handle = ray.get_actor(config.actor_name, namespace=config.namespace)
    ray.get(handle.ping.remote(), timeout=60)


def statuses(
    cluster: actors.Cluster, spec: dict[str, Any], timeout_s: float = 10.0
) -> dict[str, Any]:
    """Each broker's status ({} for one that does not answer), all asked at once and
    answered within ``timeout_s`` in all: a broker whose node Ray has yet to declare
    dead, or a slow name lookup, holds none of the others' answers (nor the runner,
    which waits for this reply)."""
    got: dict[str, Any] = {}

    def ask(key: str, b: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # dead, restarting or unreachable
            got[key] = ray.get(
                cluster.broker(b["name"], b["id"]).status.remote(), timeout=timeout_s
            )

    keys = [f"{b['name']}-{b['id']}" for b in spec["brokers"]]
    askers = [
        threading.Thread(target=ask, args=(key, b), daemon=True)
        for key, b in zip(keys, spec["brokers"])
    ]
    for t in askers:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in askers:
        t.join(max(deadline - time.monotonic(), 0.0))
    return {key: got.get(key, {}) for key in keys}


def commands(cluster: actors.Cluster, spec: dict[str, Any], sender: Sender) -> None:
    """The test's lines on stdin: ``stop`` ends the sends; ``{"restart": i}`` starts
    broker ``i`` again (answered by ``restarted``); ``status`` asks every broker's."""
    for line in sys.stdin:
        if line.strip() == "stop":
            break
        if line.strip() == "status":
            emit("status", brokers=statuses(cluster, spec))
            continue
        try:
            restart_broker(cluster, spec, json.loads(line)["restart"])
            emit("restarted", error=None)
        except Exception as exc:  # noqa: BLE001 - the test reads and reports it
            emit("restarted", error=f"{type(exc).__name__}: {exc}")
    sender.stop.set()


def watch(cluster: actors.Cluster, stop: threading.Event, interval_s: float) -> None:
    """With ``spec["watch"]``: what Ray and the keeper say, as ``watch`` events whenever
    it changes: the addresses of the nodes Ray counts dead and alive, and the promotions
    and restarts the keeper made. ``t`` is when the change was seen, ``since`` the look
    before (the change happened between them)."""
    from actors.keeper import KEEPER_ACTOR_NAME

    keeper: Any = None
    last: dict[str, Any] = {}
    since = time.monotonic()
    while not stop.wait(interval_s):
        now = time.monotonic()
        try:
            nodes = ray.nodes()
            dead = sorted(n["NodeManagerAddress"] for n in nodes if not n.get("Alive"))
            alive = sorted(n["NodeManagerAddress"] for n in nodes if n.get("Alive"))
            if keeper is None:
                keeper = ray.get_actor(KEEPER_ACTOR_NAME, namespace=cluster.namespace)
            kept = ray.get(keeper.status.remote(), timeout=2)
        except Exception:  # noqa: BLE001 - the keeper starting, the GCS slow: next look
            keeper = None
            continue
        state = {
            "dead": dead,
            "alive": alive,
            "promotions": kept["promotions"],
            "restarts": {k: v["restarts"] for k, v in kept["brokers"].items()},
        }
        if state != last:
            emit("watch", t=now, since=since, **state)
            last = state
        since = now


def main() -> None:
    # every thread's stack on stderr when the test finds an answer late (even with the
    # interpreter stuck: the dump is written from the signal handler, in C)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    spec = json.loads(sys.argv[1])
    ray.init(address=spec["address"], logging_level="ERROR", log_to_driver=False)
    head = {"num_cpus": 0, "resources": {spec["head_resource"]: 0.001}}
    ray.get(ray.remote(start).options(**head).remote(spec), timeout=120)
    cluster = actors.connect(spec["namespace"])
    brokers = {}
    for b in spec["brokers"]:
        status = ray.get(cluster.broker(b["name"], b["id"]).status.remote(), timeout=30)
        brokers[f"{b['name']}-{b['id']}"] = {"pid": status["pid"], "node": b["node"]}
    emit("ready", brokers=brokers)

    producer = cluster.producer(
        "fault-producer",
        send_timeout_s=spec["send_timeout_s"],
        enable_idempotence=spec.get("idempotence", True),
    )
    sender = Sender(producer, spec["topic"], spec["batch"], spec["pace_s"])
    sender.thread.start()
    committer = Committer(cluster, spec["topic"], sender.stop) if spec.get("consume") else None
    if committer is not None:
        committer.thread.start()
    doors: list[GrpcSender | TxnSender] = []
    if spec.get("grpc"):
        doors.append(GrpcSender(cluster, spec))
    if spec.get("transactions"):
        doors.append(TxnSender(cluster, spec))
    for door in doors:
        door.stop = sender.stop
        door.thread.start()
    roles: list[list[Any]] = []
    if spec.get("roles_s"):
        args = (cluster, spec, sender.stop, roles)
        threading.Thread(target=watch_roles, args=args, daemon=True).start()
    threading.Thread(target=commands, args=(cluster, spec, sender), daemon=True).start()
    if spec.get("watch"):
        args = (cluster, sender.stop, spec["watch"])
        threading.Thread(target=watch, args=args, daemon=True).start()
    while not sender.stop.wait(0.5):
        emit(
            "progress",
            ops=len(sender.ops),
            acked=sender.acked(),
            hosts=sender.last_hosts(),
            acked_max=dict(sender.acked_max),
            door_acked=door_acked(doors),
        )
    sender.thread.join(timeout=60)
    if committer is not None:
        committer.thread.join(timeout=60)
    for door in doors:
        door.thread.join(timeout=60)
    read = read_all(cluster, spec["topic"])
    emit(
        "history",
        ops=sender.ops + [op for d in doors if isinstance(d, GrpcSender) for op in d.ops],
        txns=[op for d in doors if isinstance(d, TxnSender) for op in d.ops],
        txn_errors=next((d.details for d in doors if isinstance(d, TxnSender)), {}),
        roles=roles,
        read=read,
        committed=committer.seen if committer else [],
        commit_failures=committer.failures if committer else 0,
    )
    producer.close()
    cluster.shutdown(timeout_s=10.0)


class Workload:
    """The workload program (``workload.py``) running in the client's namespace: its
    JSON-line events, read as they come."""

    def __init__(self, lab: FaultLab, node: Node, spec: dict[str, Any]) -> None:
        self.log = node.dir / "workload.log"
        self._err: IO[bytes] = self.log.open("wb")
        self.proc = lab.popen(
            node,
            [sys.executable, __file__, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
        )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.last: dict[str, dict[str, Any]] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:  # a library's stray print
                # Ray's driver prints raylet deaths (and their indented stack traces)
                # on stdout even with log_to_driver off: expected under node faults.
                ray_s = line[:1].isspace() or line.startswith((b"\x1b[", b"(raylet)"))
                log.log(
                    logging.DEBUG if ray_s else logging.WARNING,
                    "workload: a stdout line that is no event: %.200r",
                    line,
                )
                continue
            self.events.put(event)
        self.events.put(None)

    def wait_for(self, name: str, timeout_s: float, until: Any = None) -> dict[str, Any]:
        """The next event ``name`` (for which ``until(event)`` holds, if given)."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                break
            if event is None:
                raise AssertionError(
                    f"the workload exited {self.proc.wait()} before {name!r}:\n{self.tail()}"
                )
            self.last[event["event"]] = event
            if event["event"] == name and (until is None or until(event)):
                return event
        raise AssertionError(
            f"no {name!r} from the workload in {timeout_s}s:\n{self.tail()}\n{self.stacks()}"
        )

    def stacks(self, settle_s: float = 2.0) -> str:
        """Every thread's stack in the workload, as it dumps them on SIGUSR1 (where a late
        answer waits); "" when it has exited."""
        if self.proc.poll() is not None:
            return ""
        self._err.flush()
        start = self.log.stat().st_size
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + settle_s
        size = start
        while time.monotonic() < deadline:  # written at once, in a few writes
            time.sleep(0.1)
            if (now := self.log.stat().st_size) == size and size > start:
                break
            size = now
        with self.log.open("rb") as f:
            f.seek(start)
            return "the workload's threads:\n" + f.read().decode(errors="replace")

    def stop(self) -> None:
        self.send("stop")

    def send(self, line: str) -> None:
        """One command line to the workload (``stop``, ``status``, ``{"restart": i}``)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def tail(self, chars: int = 4000) -> str:
        self._err.flush()
        return self.log.read_text(errors="replace")[-chars:]


# --- the test's side: a scenario's setup and verdict ----------------------------------


SHARED_NODES = ["a", "b", "c", "d", "client"]
"""The nodes of the fault tests that share one lab (their modules' ``LAB_GROUP`` is
``"shared"``, see conftest.py): ``a`` the Ray head (GCS and NameServer), ``b``, ``c``,
``d`` for brokers, ``client`` for the workload (no CPU for actors). A test that needs
fewer broker nodes leaves the others idle, which costs less than a lab of its own."""


def brokers_on(lab: FaultLab, name: str, nodes: Sequence[str]) -> list[dict[str, Any]]:
    """Broker group ``name``: member ``i`` pinned to ``nodes[i]`` with its store in that
    node's directory (``<node dir>/store/<name>-<i>``)."""
    return [
        {
            "name": name,
            "id": i,
            "node": lab.nodes[n].resource,
            "store_dir": str(lab.nodes[n].dir / "store" / f"{name}-{i}"),
            "ip": lab.nodes[n].ip,
        }
        for i, n in enumerate(nodes)
    ]


def start_workload(
    lab: FaultLab,
    topic: str,
    brokers: list[dict[str, Any]],
    broker_options: dict[str, Any],
    client: str = "client",
    **spec: Any,
) -> Workload:
    """The workload in node ``client``'s namespace: a cluster on the lab's Ray with those
    brokers, 4 queues of ``topic``, an idempotent producer sending batches of 4 every
    20 ms with a 3 s send timeout (``spec`` overrides any of it: ``idempotence``,
    ``auto_promote``, ``watch``, ``batch``, ``pace_s``...). Also, when asked:
    ``consume`` (a group committing offsets), ``grpc`` (single sends through the gRPC
    door every ``grpc_pace_s``; the brokers need ``grpc_enable`` on ``grpc_port``),
    ``transactions`` (transactions of ``txn_size`` every ``txn_pace_s``, every
    ``abort_every``-th aborted, the coordinator's log in ``txn_log_dir``), ``roles_s``
    (the role history, looked at that often)."""
    return Workload(
        lab,
        lab.nodes[client],
        {
            "address": lab.address,
            "head_resource": lab.head.resource,
            "namespace": "faults",
            "topic": topic,
            "queues": 4,
            "brokers": brokers,
            "broker_options": broker_options,
            "send_timeout_s": 3.0,
            "batch": 4,
            "pace_s": 0.02,
            "grpc_pace_s": 0.1,
            "txn_size": 4,
            "txn_pace_s": 0.2,
            "abort_every": 5,
            "roles_s": 0,
            **spec,
        },
    )


def finish(client: Workload, timeout_s: float = 120.0) -> tuple[list[dict[str, Any]], Verdict]:
    """Stop the sends, read the history back and check it: (the raw ops, the verdict; its
    ``notes["committed"]``: the committed offsets a ``consume`` workload read back;
    ``notes["txns"]`` and ``notes["torn"]``: a ``transactions`` workload's transactions
    and those read in part; ``notes["roles"]``: the role history of a ``roles_s`` one)."""
    client.stop()
    history = client.wait_for("history", timeout_s=timeout_s)
    code = client.proc.wait(timeout=60)
    assert code == 0, f"the workload exited {code}:\n{client.tail()}"
    txns = [Op.from_json(o) for o in history.get("txns", [])]
    verdict = check([Op.from_json(o) for o in history["ops"]] + txns, history["read"])
    verdict.notes["committed"] = history.get("committed", [])
    verdict.notes["torn"] = torn_transactions(txns, history["read"])
    verdict.notes["txns"] = txns
    verdict.notes["roles"] = history.get("roles", [])
    verdict.notes["txn_errors"] = history.get("txn_errors", {})
    return history["ops"], verdict


def assert_exactly_once(verdict: Verdict) -> None:
    """Something was acknowledged, and every acknowledged body was read exactly once."""
    assert verdict.acknowledged > 0
    assert not verdict.lost, f"acknowledged, never read: {verdict.lost[:20]}"
    assert not verdict.duplicated, f"read more than once: {verdict.duplicated[:20]}"
    assert not verdict.unexpected, f"read, never sent: {verdict.unexpected[:20]}"


if __name__ == "__main__":
    main()
