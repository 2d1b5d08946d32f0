"""One seed's run: a :class:`harness.FaultLab`, the workload of ``tests/faults/workload.py``,
the seed's faults injected on schedule, healing and a quiet period, then the checks.

The workload sends through three doors at once: the native producer (batches of 4,
idempotent or not as the seed says), the RocketMQ 5 gRPC door (the official client, one
message every 0.1 s) and multi-message transactions (4 messages over every queue, every
5th aborted on purpose); a consumer group commits offsets all along.

Checks (per mode's promise, ``docs/guarantees.md``):

- lost: an acknowledged body never read back. Under ``ASYNC_FLUSH`` a body acknowledged
  by a broker before its power loss, in a CommitLog record at or past where the loss
  cut its CommitLog or one the cut went through, is an *allowed loss*; every other
  loss is a violation.
- duplicated: a body read more than once; a violation for an idempotent producer's
  bodies. The gRPC door's are at least once, as RocketMQ's: the official client sends
  again, with the same message id, after an answer that was not OK (a slave that did
  not confirm in time), and neither RocketMQ nor RayMQ drops the second copy.
- split brain, two ways: two different acknowledged bodies at the same queue offset of
  the same queue (two members each took a write for one queue slot), unless one is an
  allowed loss; and against the role history (each member's role and epoch, looked at
  every 0.3 s): two members' tenures, (host, epoch), taking one queue's writes in
  overlapping time (``checker.split_brains``).
- torn: a transaction read in part (a commit not whole, an abort at all, one whose end
  is unknown in part).
- unavailable: the time no send was acknowledged (gaps over 1 s). Per queue
  (``worst_queue_s``, :func:`queue_outages`): the time a queue took no write while the
  producer's sends were acknowledged on other queues (passed over: its broker down,
  fenced or avoided). A gap between two writes to one queue is not that by itself: the
  producer takes the queues in turn, so one queue's writes are as far apart as the
  sends to all the others take (12 queues of three single masters: over 1 s whenever a
  send takes 85 ms, as under a slowed network or a loaded machine).
- recovery: after each fault ends, how long until the next acknowledged send; per
  event, ``lab_recover_s``: how long the lab took to have every node's Ray and every
  broker answering again after it (a node Ray declared dead is started again then, as
  an operator would, and its brokers with it), and ``began_s``/``ended_s``, the
  fault's times from the schedule's start (a fault starts late when the recovery from
  the one before took longer than the gap between them).
- offsets back: a consumer group pulls and commits all along, reading its committed
  offsets back; one lower than one read before on its queue is a violation unless a
  failover or a power loss that lost the broker's offset journal (not fsynced: any mode
  but SYNC_FLUSH) came between the two looks, or the lower one was read while a fault
  kept the client from the leading member (it reads a slave's copy then)
  (``Run.offsets_excused``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checker import ACK, OUTAGE_GAP_S, Look, Write, offsets_moved_back, split_brains
from harness import FaultLab, LabError
from store_faults import (
    commitlog_end,
    cut_commitlog,
    flip_bit,
    flushed_offset,
    last_record_holding,
    lose_offset_journal,
    lose_unflushed,
    record_end,
    record_start,
    truncate,
)
from workload import GRPC_BODY_PREFIX, SMALL_STORE, brokers_on, finish, start_workload

from actors.client.instance import DEFAULT_ROUTE_TTL_S

from .schedule import Fault, Plan

log = logging.getLogger("raymq.benchmarks.faults")

TOPIC = "FaultRunner"
LEASE = {"cluster_lease_s": 4.0, "lease_renew_interval_s": 0.5, "heartbeat_interval_s": 2.0}
"""A broker fences itself 4 s after losing Ray and the NameServer: before Ray's verdict
on its node (``HEALTH_CHECKS``), as the default lease (10 s) is before Ray's default."""
HEALTH_CHECKS = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "4",
}
"""The GCS gives a silent node up after ~8 s (Ray's default is about a minute)."""
RAFT = {
    "enable_dledger": True,
    "dledger_tick_ms": 50,
    "dledger_heartbeat_ms": 150,
    "dledger_election_timeout_ms": 600,
    "slave_sync_interval_s": 0.3,
}
SYNC_MASTER = {
    "broker_role": "SYNC_MASTER",
    "sync_replication_timeout_s": 2.0,
    "slave_sync_interval_s": 0.3,
    "ha_slave_timeout_s": 2.0,
}
GRPC = {
    "grpc_enable": True,
    "grpc_port": 18081,
    "grpc_access_key": "fault-runner",
    "grpc_secret_key": "fault-runner-secret-0123456789abcdef0123456789",
}
"""The gRPC door on every broker, on one port of its node's address (a broker started
again keeps it, so the client's endpoints stay right)."""
QUIET_S = 10.0
RECOVER_S = 120.0


@dataclass
class Event:
    fault: Fault
    began: float
    ended: float = 0.0
    node: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Result:
    plan: Plan
    ops: int = 0
    acknowledged: int = 0
    lost: list[str] = field(default_factory=list)
    allowed_loss: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    split_brain: list[str] = field(default_factory=list)  # one queue slot, two bodies
    split_roles: list[str] = field(default_factory=list)  # overlapping tenures
    role_changes: int = 0
    roles: list[list[Any]] = field(default_factory=list)  # [t, member, host, leads, epoch]
    started: float = 0.0  # the schedule's time 0 (monotonic s, as every time here)
    txns: int = 0
    txns_committed: int = 0
    torn: list[str] = field(default_factory=list)
    grpc_acked: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # "door outcome" -> ops
    lost_where: dict[str, list[Any]] = field(default_factory=dict)  # [ip, offset, queue, ...]
    txn_errors: dict[str, list[str]] = field(default_factory=dict)  # outcome -> first errors
    crashes: list[list[Any]] = field(default_factory=list)  # [ip, lost from, when]
    offsets_back: list[str] = field(default_factory=list)  # "queue: from -> to", unexcused
    offsets_back_allowed: list[str] = field(default_factory=list)  # after a failover or loss
    unavailable_s: float = 0.0
    worst_queue_s: float = 0.0  # the worst queue's time passed over (:func:`queue_outages`)
    worst_queue: str = ""
    queue_outages: dict[str, list[list[float]]] = field(default_factory=dict)  # from, to
    queue_gaps_s: float = 0.0  # the worst queue's gaps over 1 s, however many sends between
    recover_s: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""

    @property
    def idempotent_duplicates(self) -> list[str]:
        """Bodies read twice that the idempotent producer sent (not the gRPC door's)."""
        return [b for b in self.duplicated if not b.startswith(GRPC_BODY_PREFIX)]

    @property
    def violations(self) -> list[str]:
        out = []
        if self.error:
            out.append(f"run failed: {self.error}")
        if self.lost:
            out.append(f"{len(self.lost)} acknowledged lost")
        if self.plan.idempotent and (twice := self.idempotent_duplicates):
            out.append(f"{len(twice)} duplicated by an idempotent producer")
        if self.unexpected:
            out.append(f"{len(self.unexpected)} read, never sent")
        if self.split_brain:
            out.append(f"{len(self.split_brain)} queue slots acknowledged twice")
        if self.split_roles:
            out.append(f"{len(self.split_roles)} split brains in the role history")
        if self.torn:
            out.append(f"{len(self.torn)} transactions read in part")
        if self.offsets_back:
            out.append(f"{len(self.offsets_back)} committed offsets moved back")
        if fenced := self.failures.get("txn ProducerFencedError"):
            out.append(f"{fenced} transactions of a producer fenced with no successor")
        return out

    HEADER = (
        f"{'seed':>4} {'mode':<11} {'idem':<4} {'faults':>6} {'ops':>6} {'acked':>7} "
        f"{'lost':>5} {'allowed':>7} {'dup':>5} {'split':>5} {'unavail s':>9} "
        f"{'worst q s':>9} {'recover s':>9} {'off back':>8} {'grpc':>5} {'txns':>5} "
        f"{'torn':>4}  verdict"
    )

    def row(self) -> str:
        p = self.plan
        return (
            f"{p.seed:>4} {p.mode:<11} {'yes' if p.idempotent else 'no':<4} "
            f"{len(self.events):>6} {self.ops:>6} {self.acknowledged:>7} {len(self.lost):>5} "
            f"{len(self.allowed_loss):>7} {len(self.duplicated):>5} {len(self.split_brain):>5} "
            f"{self.unavailable_s:>9.1f} {self.worst_queue_s:>9.1f} {self.recover_s:>9.1f} "
            f"{len(self.offsets_back):>8} {self.grpc_acked:>5} {self.txns_committed:>5} "
            f"{len(self.torn):>4}  " + ("; ".join(self.violations) or "ok")
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_json(),
            "ops": self.ops,
            "acknowledged": self.acknowledged,
            "lost": self.lost[:50],
            "allowed_loss": len(self.allowed_loss),
            "duplicated": self.duplicated[:50],
            "unexpected": self.unexpected[:50],
            "split_brain": self.split_brain[:50],
            "split_roles": self.split_roles[:50],
            "role_changes": self.role_changes,
            "roles": self.roles[:1000],
            "started": round(self.started, 3),
            "txns": self.txns,
            "txns_committed": self.txns_committed,
            "torn": self.torn[:50],
            "grpc_acked": self.grpc_acked,
            "failures": self.failures,
            "lost_where": self.lost_where,
            "txn_errors": self.txn_errors,
            "crashes": self.crashes,
            "offsets_back": self.offsets_back[:50],
            "offsets_back_allowed": self.offsets_back_allowed[:50],
            "unavailable_s": round(self.unavailable_s, 2),
            "worst_queue_s": round(self.worst_queue_s, 2),
            "worst_queue": self.worst_queue,
            "queue_outages": self.queue_outages,
            "queue_gaps_s": round(self.queue_gaps_s, 2),
            "recover_s": round(self.recover_s, 2),
            "events": self.events,
            "violations": self.violations,
        }


PASSED_OVER_ROUNDS = 2
"""A queue is passed over when the producer had this many rounds of sends (one per
queue each) acknowledged on other queues between two of its own writes."""


def queue_outages(acks: list[tuple[float, str]]) -> dict[str, list[tuple[float, float]]]:
    """Per queue, the spans over ``OUTAGE_GAP_S`` between two of its acknowledged writes
    (``acks``: ``(when, queue)``, in time order) in which at least
    :data:`PASSED_OVER_ROUNDS` rounds of writes were acknowledged on the other queues: the
    queue took none while the topic took writes (its broker down, fenced, or avoided by
    the producer). A queue passed over until the end counts until the last write. A gap
    with fewer writes between is the pace of the sends (every queue gets every
    ``len(queues)``-th), or the whole topic unavailable (``unavailable_s`` counts that)."""
    queues = {q for _, q in acks}
    rounds = PASSED_OVER_ROUNDS * len(queues)
    last: dict[str, tuple[float, int]] = {}
    out: dict[str, list[tuple[float, float]]] = {q: [] for q in queues}

    def passed_over(q: str, until: float, index: int) -> None:
        at, i = last[q]
        if until - at > OUTAGE_GAP_S and index - i - 1 >= rounds:
            out[q].append((at, until))

    for index, (t, q) in enumerate(acks):
        if q in last:
            passed_over(q, t, index)
        last[q] = (t, index)
    if acks:
        for q in queues:
            passed_over(q, acks[-1][0], len(acks))
    return out


def queue_gaps(acks: list[tuple[float, str]]) -> float:
    """The worst queue's gaps over ``OUTAGE_GAP_S`` between two of its acknowledged
    writes, however many writes other queues took meanwhile (what ``worst_queue_s``
    was before :func:`queue_outages`: it counts the pace of the sends as unavailable)."""
    times: dict[str, list[float]] = defaultdict(list)
    for t, q in acks:
        times[q].append(t)
    return max(
        (sum(b - a for a, b in zip(ts, ts[1:]) if b - a > OUTAGE_GAP_S) for ts in times.values()),
        default=0.0,
    )


def layout(lab: FaultLab, plan: Plan) -> tuple[list[dict[str, Any]], dict[str, Any], bool]:
    """The brokers, their options and auto_promote for the plan's mode."""
    members = plan.broker_nodes
    if plan.mode in ("ASYNC_FLUSH", "SYNC_FLUSH"):
        brokers = [brokers_on(lab, f"broker-{i}", [n])[0] for i, n in enumerate(members)]
        store = {**SMALL_STORE, "flush_disk_type": plan.mode}
        return brokers, {"broker_role": "ASYNC_MASTER", "store": store, **LEASE, **GRPC}, False
    if plan.mode == "SYNC_MASTER":
        return brokers_on(lab, "broker-a", members), {**SYNC_MASTER, **LEASE, **GRPC}, True
    return brokers_on(lab, "broker-a", members), {**RAFT, **LEASE, **GRPC}, False


class Run:
    def __init__(self, plan: Plan, keep: bool = False) -> None:
        self.plan = plan
        self.keep = keep
        self.events: list[Event] = []
        self.crashes: list[tuple[str, int, float]] = []  # (ip, cut offset, crashed at)
        # (ip, frozen at, crashed at): its offsets' journal lost
        self.offset_losses: list[tuple[str, float, float]] = []
        self.rng = random.Random(plan.seed ^ 0x5EED)

    # --- the workload's events ---------------------------------------------------------

    def drain(self) -> dict[str, Any]:
        """Take every event the workload printed so far; the latest progress."""
        with contextlib.suppress(queue.Empty):
            while (event := self.client.events.get_nowait()) is not None:
                self.client.last[event["event"]] = event
        return self.client.last.get("progress", {})

    def settled_progress(
        self, ip: str, frozen: float, *, least_s: float = 3.0, timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """The workload's progress once it has heard every answer the brokers on ``ip``
        sent before they were frozen at ``frozen``: at least ``least_s`` later, and with
        what they acknowledged unchanged over the last two reports (0.5 s apart). An
        answer already in the client's socket is read whenever its thread gets a core:
        on a loaded machine that was 0.9 s after the freeze, past two reports."""
        self.drain()
        last: Any = None
        while True:
            progress = self.client.wait_for("progress", timeout_s=timeout_s)
            theirs = sorted(
                (h, o) for h, o in progress.get("acked_max", {}).items()
                if h.rpartition(":")[0] == ip
            )  # fmt: skip
            now = time.monotonic()
            if (theirs == last and now - frozen >= least_s) or now - frozen >= timeout_s:
                return self.drain() or progress
            last = theirs

    def statuses(self) -> dict[str, Any]:
        self.drain()
        self.client.send("status")
        return self.client.wait_for("status", timeout_s=60)["brokers"]

    # --- targets -----------------------------------------------------------------------

    def node_of_ip(self, ip: str) -> str:
        return next(n for n in self.plan.broker_nodes if self.lab.nodes[n].ip == ip)

    def resolve(self, target: str, draw: int) -> str:
        if target not in ("leader", "follower"):
            return target
        hosts = self.drain().get("hosts", [])
        leader = None
        for h in hosts:
            with contextlib.suppress(StopIteration):
                leader = self.node_of_ip(h.rpartition(":")[0])
        leader = leader or self.plan.broker_nodes[0]
        if target == "leader":
            return leader
        others = [n for n in self.plan.broker_nodes if n != leader]
        return others[draw % len(others)]

    def index(self, node: str) -> int:
        return self.plan.broker_nodes.index(node)

    def store(self, node: str) -> Path:
        return Path(self.brokers[self.index(node)]["store_dir"])

    # --- faults ------------------------------------------------------------------------

    def inject(self, fault: Fault) -> Event:
        p, lab = fault.params, self.lab
        ev = Event(fault, time.monotonic())
        if fault.kind == "isolate":
            ev.node = p["node"]
            lab.partition([p["node"]], [n for n in lab.nodes if n != p["node"]])
        elif fault.kind == "split":
            lab.partition(p["minority"], p["majority"])
        elif fault.kind == "bridge":
            lab.partition([p["sides"][0]], [p["sides"][1]])
        elif fault.kind == "one_way":
            lab.drop_one_way(p["src"], p["dst"])
        elif fault.kind == "netem":
            ev.node = p["node"]
            lab.degrade(p["node"], p["delay_ms"], p["jitter_ms"], p["loss_pct"])
        elif fault.kind in ("pause_broker", "kill_broker"):
            ev.node = self.resolve(p["target"], p["draw"])
            pids = lab.nodes[ev.node].actor_pids("Broker")
            ev.detail["pids"] = pids
            (lab.pause if fault.kind == "pause_broker" else lab.kill)(ev.node, pids)
        elif fault.kind == "pause_node":
            ev.node = self.resolve(p["target"], p["draw"])
            pids = list(lab.nodes[ev.node].pids())
            ev.detail["pids"] = pids
            for pid in pids:
                with contextlib.suppress(LabError, ProcessLookupError):
                    lab.pause(ev.node, [pid])
        elif fault.kind in ("power_loss", "bad_replica"):
            ev.node = self.resolve(p["target"], p["draw"])
            self.power_loss(ev, random.Random(p["draw"]))
        return ev

    def power_loss(self, ev: Event, rng: random.Random) -> None:
        """Freeze the node's brokers, let the client hear every answer they sent, crash
        the node, cut its CommitLog back (to the flushed offset, or past it), and for
        ``bad_replica`` damage its log."""
        lab, node = self.lab, self.lab.nodes[ev.node]
        with contextlib.suppress(LabError, ProcessLookupError):
            lab.pause(ev.node, node.actor_pids("Broker"))
        frozen = time.monotonic()
        progress = self.settled_progress(node.ip, frozen)
        acked = progress.get("acked_max", {})
        lab.crash(ev.node)
        # what its brokers answered, they answered before the freeze; the client may read
        # an answer later (seed 0 read 4 of them 0.6 ms after): until now, every answer
        # from that address is one of theirs
        crashed = time.monotonic()
        store = self.store(ev.node)
        floor = 0
        mine = [o for h, o in acked.items() if h.rpartition(":")[0] == node.ip]
        if mine and self.plan.mode in ("SYNC_FLUSH", "RAFT") and (store / "commitlog").exists():
            floor = record_end(store, max(mine))  # fsynced before it was acknowledged
        if self.plan.mode == "SYNC_FLUSH" and (store / "commitlog").exists():
            # the gRPC door's and the transactions' acknowledged writes, found by body:
            # their answers name no CommitLog offset, and were fsynced before them too
            bodies = [b.encode() for b in progress.get("door_acked", [])]
            floor = last_record_holding(store, bodies, floor)
        if self.plan.mode != "SYNC_FLUSH":  # the offsets' journal was not fsynced
            ev.detail["offset_journal_lost"] = lose_offset_journal(store)
            self.offset_losses.append((node.ip, frozen, crashed))
        if not (store / "checkpoint").exists():
            ev.detail["cut"] = "no store yet"
            return
        if ev.fault.params.get("tail") == "between":
            low = max(flushed_offset(store), floor)
            end = commitlog_end(store)
            at = rng.randint(min(low, end), end)
            torn = record_start(store, at)  # the record the cut goes through is lost whole
            cut_commitlog(store, at)
        else:  # the flushed offset, or the end of an fsynced record: a record's start
            at, end = lose_unflushed(store, floor)
            torn = at
        ev.detail.update(cut=at, end=end, floor=floor, lost_bytes=end - at, torn_from=torn)
        self.crashes.append((node.ip, torn, crashed))
        if ev.fault.kind == "bad_replica":
            damage = ev.fault.params["damage"]
            what = (flip_bit if damage == "flip" else truncate)(store, ev.fault.params["log"], rng)
            ev.detail["damage"] = what

    def undo(self, ev: Event) -> None:
        kind, lab = ev.fault.kind, self.lab
        if kind in ("isolate", "split", "bridge", "one_way", "netem"):
            lab.heal()
        elif kind in ("pause_broker", "pause_node"):
            for pid in ev.detail["pids"]:
                with contextlib.suppress(LabError, ProcessLookupError):
                    lab.resume(ev.node, [pid])
        elif kind in ("power_loss", "bad_replica"):
            lab.restart(ev.node, timeout_s=RECOVER_S)
        # kill_broker: recover() starts it again
        ev.ended = time.monotonic()
        restarted = self.recover()
        ev.detail["lab_recover_s"] = round(time.monotonic() - ev.ended, 2)
        if restarted:
            ev.detail["restarted"] = restarted

    def recover(self) -> list[str]:
        """Every node's Ray up (a node Ray declared dead has lost its raylet: started
        again) and every broker answering (the keeper starts a broker again on a node that
        rejoins; one that does not answer is started again as an operator would). Returns
        what was started again: nodes' Ray (``ray@n1``) and brokers (``broker-0-0``)."""
        deadline = time.monotonic() + RECOVER_S
        again: list[str] = []
        while time.monotonic() < deadline:
            again += [f"ray@{n}" for n in self.restart_dead_nodes()]
            down = [k for k, v in self.statuses().items() if not v]
            if not down:
                return again
            again += down
            for key in down:
                i = next(i for i, b in enumerate(self.brokers) if f"{b['name']}-{b['id']}" == key)
                self.client.send(json.dumps({"restart": i}))
                restarted = self.client.wait_for("restarted", timeout_s=RECOVER_S)
                if restarted["error"]:
                    log.warning("restarting %s: %s", key, restarted["error"])
            time.sleep(1.0)
        raise LabError(f"brokers not answering {RECOVER_S:.0f}s after the heal: {down}")

    def restart_dead_nodes(self) -> list[str]:
        """Start Ray again on every broker node whose Ray is gone or that the GCS counts
        dead (a node it gave up during a partition or a pause: its raylet leaves); returns
        those nodes."""
        alive = set(self.lab.alive_ips())
        dead = []
        for name in self.plan.broker_nodes:
            node = self.lab.nodes[name]
            gone = not node.procs or any(p.poll() is not None for p in node.procs)
            if gone or node.ip not in alive:
                log.info("Ray on %s is gone or declared dead: starting it again", name)
                self.lab.crash(name)  # every dead node's leftovers first: the restart
                dead.append(name)  # checks that no node's Ray has exited
        if dead:
            self.lab.restart_nodes(dead, timeout_s=RECOVER_S)
        return dead

    # --- the run -----------------------------------------------------------------------

    def execute(self, root: Path | None = None) -> Result:
        plan = self.plan
        result = Result(plan)
        nodes = ["a", *plan.broker_nodes, "client"]
        with FaultLab(
            nodes, root=root, cpus={"client": 0}, ray_env=HEALTH_CHECKS, keep=self.keep
        ) as lab:
            self.lab = lab
            self.brokers, options, auto_promote = layout(lab, plan)
            self.client = start_workload(
                lab,
                TOPIC,
                self.brokers,
                options,
                auto_promote=auto_promote,
                idempotence=plan.idempotent,
                consume=True,
                grpc=True,
                grpc_port=GRPC["grpc_port"],
                transactions=True,
                txn_log_dir=str(lab.head.dir / "txn"),
                roles_s=0.3,
            )
            self.client.wait_for("ready", timeout_s=180)
            self.client.wait_for("progress", timeout_s=120, until=lambda e: e["acked"] >= 100)
            start = result.started = time.monotonic()
            try:
                for fault in plan.faults:
                    if (wait := start + fault.start_s - time.monotonic()) > 0:
                        time.sleep(wait)
                    log.info("seed %d: %s", plan.seed, fault.describe())
                    ev = self.inject(fault)
                    self.events.append(ev)
                    time.sleep(max(0.0, ev.began + fault.duration_s - time.monotonic()))
                    self.undo(ev)
            except Exception as exc:  # noqa: BLE001 - reported as the seed's failure
                result.error = f"{type(exc).__name__}: {exc}"[:2000]
                # whole: the workload's log tail and, for a late answer, its threads' stacks
                log.error("seed %d: %s: %s", plan.seed, type(exc).__name__, exc)
                lab.heal()
                with contextlib.suppress(LabError, AssertionError):
                    self.recover()
            at = self.drain().get("acked", 0)
            with contextlib.suppress(AssertionError):
                self.client.wait_for("progress", timeout_s=60, until=lambda e: e["acked"] > at)
            time.sleep(QUIET_S)
            raw, verdict = finish(self.client, timeout_s=300)
        self.analyse(result, raw, verdict)
        return result

    def offsets_excused(self, roles: list[Look]) -> Any:
        """When a committed offset may read back lower (``docs/guarantees.md``): during
        or after a failover (a member that stopped leading, or one leading in a new
        epoch: it had not copied the latest commits)
        or after a power loss of the queue's broker that lost its offsets' journal (not
        fsynced under ASYNC_FLUSH). A process killed loses none (the journal is in the
        page cache), nor a SYNC_FLUSH broker's power loss."""
        ips: dict[str, set[str]] = defaultdict(set)
        for b in self.brokers:
            ips[b["name"]].add(b["ip"])
        slack = 2.0  # the role history is looked at every 0.3 s, the offsets every 0.1 s
        leads = sorted((lk.t, lk.host, lk.epoch) for lk in roles if lk.leads)
        # a member that stops leading: a failover is under way from then, and offsets are
        # read from whichever member answers until a new leader is seen (an election on a
        # loaded machine took 6.5 s, past the slack)
        stepped_down: list[tuple[float, str]] = []
        leading: dict[str, bool] = {}
        for lk in sorted(roles, key=lambda lk: lk.t):
            if leading.get(lk.member) and not lk.leads:
                stepped_down.append((lk.t, lk.host))
            leading[lk.member] = lk.leads

        cut_off = self.leader_cut_off(leads)

        def excused(queue: str, high_at: float, low_at: float) -> bool:
            group = ips[queue.partition(":")[0]]
            # the higher offset was committed before the freeze; its answer may be read
            # until the node is crashed (seed 0 of the 52b1935 run read one 0.1 s after
            # the freeze), the lower one after the loss
            if any(
                ip in group and high_at <= crashed and frozen <= low_at
                for ip, frozen, crashed in self.offset_losses
            ):
                return True
            if any(ip in group and began <= low_at <= until for began, until, ip in cut_off):
                return True
            if any(high_at - slack <= t <= low_at + slack for t, h in stepped_down if h in group):
                return True
            before = {(h, e) for t, h, e in leads if t <= high_at and h in group}
            return any(
                (h, e) not in before
                for t, h, e in leads
                if high_at - slack <= t <= low_at + slack and h in group
            )

        return excused

    def leader_cut_off(self, leads: list[tuple[float, str, int]]) -> list[tuple[float, float, str]]:
        """``(from, until, leader's IP)`` for each fault that kept the client or the
        NameServers (on the head, ``a``) from the member leading when it began: the
        client then reads committed offsets from a slave, whose copy of the master's
        table is up to ``slave_sync_interval_s`` old (``docs/guarantees.md``), and keeps
        reading there until its route is refreshed (up to ``DEFAULT_ROUTE_TTL_S``)."""
        node_of = {b["ip"]: b["node"].removeprefix("node-") for b in self.brokers}
        out = []
        for ev in self.events:
            kind, p = ev.fault.kind, ev.fault.params
            led = [h for t, h, _ in leads if t <= ev.began]
            if not led or led[-1] not in node_of:
                continue
            node = node_of[led[-1]]
            if kind == "split":
                cut = next(s for s in (p["minority"], p["majority"]) if node in s)
                unreachable = "a" not in cut or "client" not in cut
            elif kind in ("bridge", "one_way"):
                ends = set(p["sides"] if kind == "bridge" else (p["src"], p["dst"]))
                unreachable = node in ends and bool(ends & {"a", "client"})
            elif kind == "isolate":
                unreachable = p["node"] == node
            else:  # a pause, a kill, a power loss or a slow network of the leader's node
                unreachable = ev.node == node
            if unreachable:
                until = (ev.ended or ev.began) + DEFAULT_ROUTE_TTL_S + 2.0
                out.append((ev.began, until, led[-1]))
        return out

    def analyse(self, result: Result, raw: list[dict[str, Any]], verdict: Any) -> None:
        result.ops, result.acknowledged = verdict.ops, verdict.acknowledged
        result.duplicated, result.unexpected = verdict.duplicated, verdict.unexpected
        result.unavailable_s = verdict.unavailable_s
        where: dict[str, tuple[str, int, str, int | None, float]] = {}
        writes: list[Write] = []
        for op in raw:
            if op["outcome"] == ACK:
                for body, (host, offset, mq, qoffset) in zip(op["bodies"], op["offsets"]):
                    ip = host.rpartition(":")[0] if host else ""  # gRPC: the member unknown
                    where[body] = (ip, offset if host else -1, mq, qoffset, op["completed"])
                    if host:
                        writes.append(Write(mq, ip, op["invoked"], op["completed"]))
        txn_ops = [{"door": "txn", "outcome": t.outcome} for t in verdict.notes.get("txns", [])]
        for op in raw + txn_ops:
            if op["outcome"] != ACK:
                key = f"{op.get('door', 'send')} {op['outcome']}"
                result.failures[key] = result.failures.get(key, 0) + 1
        result.grpc_acked = sum(
            len(op["bodies"]) for op in raw if op.get("door") == "grpc" and op["outcome"] == ACK
        )
        txns = verdict.notes.get("txns", [])
        result.txns = len(txns)
        result.txn_errors = verdict.notes.get("txn_errors", {})
        result.txns_committed = sum(1 for t in txns if t.outcome == ACK)
        roles = [Look(*r) for r in verdict.notes.get("roles", [])]
        result.role_changes = len(roles)
        result.roles = [[round(lk.t, 3), lk.member, lk.host, lk.leads, lk.epoch] for lk in roles]
        result.split_roles = split_brains(writes, roles)
        # ASYNC_FLUSH's allowed loss: acknowledged before a power loss of the broker that
        # wrote it, past where the loss cut its CommitLog. A gRPC send's receipt names
        # the broker but not the CommitLog offset, a transaction's neither: those count
        # as allowed when acknowledged before a power loss of their broker (of any
        # broker, for a transaction), and so does a commit read in part then.
        allowed = set()
        single = {b["name"]: b["ip"] for b in self.brokers if sum(
            x["name"] == b["name"] for x in self.brokers) == 1}  # fmt: skip
        txn_of = {b: t for t in txns for b in t.bodies}
        crashed_before = lambda done: any(done <= t for _, _, t in self.crashes)  # noqa: E731
        if self.plan.mode == "ASYNC_FLUSH":
            for body in verdict.lost:
                if body in txn_of:
                    if crashed_before(txn_of[body].completed):
                        allowed.add(body)
                    continue
                ip, offset, mq, _, done = where[body]
                if not ip:  # gRPC: its broker, not its offset
                    ip, offset = single.get(mq.partition(":")[0], ""), 1 << 62
                if any(ip == cip and offset >= cut and done <= t for cip, cut, t in self.crashes):
                    allowed.add(body)
        result.torn = [
            t for t in verdict.notes.get("torn", [])
            if self.plan.mode != "ASYNC_FLUSH"
            or txn_of[t.partition("..")[0]].outcome != ACK
            or not crashed_before(txn_of[t.partition("..")[0]].completed)
        ]  # fmt: skip
        result.allowed_loss = sorted(allowed)
        result.lost = [b for b in verdict.lost if b not in allowed]
        result.lost_where = {  # what a lost message's send was answered with, to look into
            b: list(where[b]) if b in where else ["txn", txn_of[b].completed]
            for b in result.lost[:50]
        }
        result.crashes = [list(c) for c in self.crashes]
        slots: dict[tuple[str, int], set[str]] = defaultdict(set)
        for body, (_, _, mq, qoffset, _) in where.items():
            if body not in allowed and qoffset is not None:  # a gRPC send's is unknown
                slots[(mq, qoffset)].add(body)
        result.split_brain = sorted(
            f"{mq}@{q}: {sorted(b)}" for (mq, q), b in slots.items() if len(b) > 1
        )
        queue_acks = sorted(
            (op["completed"], mq)
            for op in raw
            if op["outcome"] == ACK
            for mq in {o[2] for o in op["offsets"] if o[3] is not None}  # not the gRPC door's
        )
        outages = queue_outages(queue_acks)
        per_queue = {q: sum(b - a for a, b in spans) for q, spans in outages.items()}
        if per_queue:
            result.worst_queue = max(per_queue, key=lambda q: per_queue[q])
            result.worst_queue_s = per_queue[result.worst_queue]
        result.queue_outages = {
            q: [[round(a - result.started, 1), round(b - result.started, 1)] for a, b in spans]
            for q, spans in sorted(outages.items())
            if spans
        }
        result.queue_gaps_s = queue_gaps(queue_acks)
        acks = sorted(op["completed"] for op in raw if op["outcome"] == ACK)
        recover = 0.0
        for ev in self.events:
            if not ev.ended:  # the run failed in it
                continue
            after = next((t for t in acks if t >= ev.ended), None)
            if after is not None:
                recover = max(recover, after - ev.ended)
                ev.detail["first_ack_s"] = round(after - ev.ended, 2)
        result.recover_s = recover
        result.offsets_back, result.offsets_back_allowed = offsets_moved_back(
            verdict.notes.get("committed", []), self.offsets_excused(roles)
        )
        result.events = [
            {
                "fault": ev.fault.describe(),
                "node": ev.node,
                "began_s": round(ev.began - result.started, 1),
                "ended_s": round(ev.ended - result.started, 1) if ev.ended else None,
                **ev.detail,
            }
            for ev in self.events
        ]
