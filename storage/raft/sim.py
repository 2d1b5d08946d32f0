"""A deterministic simulated network of RaftNodes, with Raft's safety invariants checked.

``SimCluster`` plays the actor shell for N nodes: it ticks them, carries their
messages through a network that drops, duplicates, delays (1..``max_delay``
ticks, so messages also overtake each other) and partitions (symmetric,
one-way, or random links), crashes and restarts nodes (persistent state kept:
the log and the last ``HardState`` a ``Ready`` handed out; volatile state lost,
and the durable applied index may lag), tells survivors of a crash as Ray's
death notices would, and lets clients propose batches all along. One seeded
``random.Random`` drives everything, so a run is a pure function of its seed
and parameters, and a failing seed replays exactly.

After every step ``SafetyChecker`` (``invariants.py``) checks Raft's safety
invariants; ``check_liveness`` then heals everything and demands a leader and
a new commit on every node within a bound.

``ticks_to_new_leader`` measures a failover (leader crash to a new leader) for
benchmarks, with or without death notices.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from dataclasses import dataclass

from .config import RaftConfig
from .errors import NotLeaderError, RaftError
from .invariants import SafetyChecker, SafetyViolation, SimLog
from .messages import Message, NodeId
from .node import RaftNode
from .ready import HardState, Proposal, Role


class LivenessFailure(AssertionError):
    """A healed simulated cluster did not elect a leader and commit in time."""


@dataclass(frozen=True)
class Faults:
    """Per-tick probabilities of what goes wrong (and how often clients write)."""

    drop: float = 0.0
    duplicate: float = 0.0
    max_delay: int = 1
    """Messages arrive 1..max_delay ticks after they are sent."""
    crash: float = 0.0
    """Chance per tick that one alive node crashes."""
    restart: float = 0.0
    """Chance per tick that a given dead node restarts."""
    partition: float = 0.0
    """Chance per tick that a new partition replaces the current links."""
    heal: float = 0.0
    """Chance per tick that all links heal."""
    death_notice: float = 1.0
    """Chance that a survivor is told of a crash (within max_delay ticks)."""
    propose: float = 0.0
    """Chance per tick that a client proposes a batch."""
    transfer: float = 0.0
    """Chance per tick that the leader is asked to hand over to a random peer."""

    @classmethod
    def random(cls, rng: random.Random) -> Faults:
        """A random mix of faults, from a calm network to a very hostile one."""
        return cls(
            drop=rng.choice([0.0, 0.02, 0.1, 0.3]),
            duplicate=rng.choice([0.0, 0.05, 0.2]),
            max_delay=rng.choice([1, 2, 4, 8]),
            crash=rng.choice([0.0, 0.01, 0.03]),
            restart=rng.choice([0.05, 0.2]),
            partition=rng.choice([0.0, 0.01, 0.04]),
            heal=rng.choice([0.02, 0.1]),
            death_notice=rng.choice([0.0, 0.5, 1.0]),
            propose=rng.choice([0.2, 0.6, 1.0]),
            transfer=rng.choice([0.0, 0.0, 0.01]),
        )


class SimCluster:
    """N RaftNodes on a simulated network, driven one tick at a time by one seed."""

    def __init__(
        self,
        size: int = 3,
        seed: int = 0,
        *,
        faults: Faults | None = None,
        config: RaftConfig | None = None,
    ) -> None:
        self.seed = seed
        self.faults = faults if faults is not None else Faults()
        self.config = config if config is not None else RaftConfig()
        self.rng = random.Random(seed)
        self.ids: tuple[NodeId, ...] = tuple(f"n{i}" for i in range(size))
        self.logs = {i: SimLog() for i in self.ids}
        self.disk = {i: HardState() for i in self.ids}
        self.applied = dict.fromkeys(self.ids, 0)
        """The last index each node reported committed (the shell's applied index)."""
        self.nodes = {i: self._boot(i, 0) for i in self.ids}
        self.alive = set(self.ids)
        self.blocked: set[tuple[NodeId, NodeId]] = set()
        self.now = 0
        self.checker = SafetyChecker(self)
        self._messages: list[tuple[int, int, Message]] = []
        self._notices: list[tuple[int, int, NodeId, NodeId]] = []
        self._seq = itertools.count()
        self._writes = itertools.count()

    # -- running

    def step(self) -> None:
        """One tick: faults, client writes, node ticks, death notices, deliveries, checks."""
        self.now += 1
        self._inject_faults()
        if self.rng.random() < self.faults.propose:
            self.client_write()
        for i in self.ids:
            if i in self.alive:
                self.nodes[i].tick()
                self._drain(i)
        while self._notices and self._notices[0][0] <= self.now:
            _, _, i, dead = heapq.heappop(self._notices)
            if i in self.alive:
                self.nodes[i].on_peer_dead(dead)
                self._drain(i)
        due = []
        while self._messages and self._messages[0][0] <= self.now:
            due.append(heapq.heappop(self._messages)[2])
        self.rng.shuffle(due)
        for msg in due:
            if msg.dst in self.alive and (msg.src, msg.dst) not in self.blocked:
                self.nodes[msg.dst].receive(msg)
                self._drain(msg.dst)
        self.checker.check()

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            try:
                self.step()
            except RaftError as e:
                raise SafetyViolation(f"seed {self.seed}, tick {self.now}: {e}") from e

    def check_liveness(self, max_ticks: int | None = None) -> int:
        """Heal the network, restart every node, then demand that a leader commits a new
        entry on every node within ``max_ticks``; return the ticks it took."""
        cfg = self.config
        hi = cfg.election_timeout_ticks[1]
        max_delay = self.faults.max_delay
        if max_ticks is None:
            # Elections, plus the time to ship the backlog at the configured budgets
            # (entries here are about 10 bytes).
            backlog = max(len(log) for log in self.logs.values()) - min(
                n.commit_index for n in self.nodes.values()
            )
            per_round_trip = cfg.max_inflight * max(
                1, min(cfg.max_append_entries, cfg.max_append_bytes // 16)
            )
            catch_up = -(-backlog // per_round_trip) * 2 * max_delay
            max_ticks = 12 * (hi + 4 * max_delay) + 50 + 2 * catch_up
        self.faults = Faults(max_delay=max_delay, death_notice=self.faults.death_notice)
        self.blocked.clear()
        for i in self.ids:
            if i not in self.alive:
                self.restart(i)
        start = self.now
        proposal: Proposal | None = None
        while self.now - start < max_ticks:
            self.run(1)
            leader = self.leader()
            if leader is not None and (proposal is None or proposal.term < self.nodes[leader].term):
                proposal = self.client_write(leader)
            if proposal is not None and all(
                self.nodes[i].commit_index >= proposal.last_index
                and self.logs[i].term_at(proposal.last_index) == proposal.term
                for i in self.ids
            ):
                return self.now - start
        raise LivenessFailure(
            f"seed {self.seed}: no commit on every node {max_ticks} ticks after healing; "
            f"nodes: {self.describe()}"
        )

    # -- faults and clients

    def crash(self, node_id: NodeId, *, notice_delay: int | None = None) -> None:
        """Kill a node; each survivor may hear of it (``Faults.death_notice``) after
        ``notice_delay`` ticks (random up to ``max_delay`` if None)."""
        self.alive.discard(node_id)
        for i in self.ids:
            if i in self.alive and self.rng.random() < self.faults.death_notice:
                delay = (
                    self.rng.randint(0, self.faults.max_delay)
                    if notice_delay is None
                    else notice_delay
                )
                heapq.heappush(self._notices, (self.now + delay, next(self._seq), i, node_id))

    def restart(self, node_id: NodeId) -> None:
        """Bring a node back from its persistent state; its durable applied index may lag."""
        applied = self.rng.randint(0, self.applied[node_id])
        self.applied[node_id] = applied
        if self.rng.random() < 0.5:
            self.nodes[node_id].restart(applied_index=applied)
        else:
            self.nodes[node_id] = self._boot(node_id, applied)
        self.alive.add(node_id)
        self._drain(node_id)

    def partition(self) -> None:
        """Replace the links with a random partition: two sides, one node cut off one way,
        or random one-way links."""
        ids = list(self.ids)
        self.blocked.clear()
        kind = self.rng.random()
        if kind < 0.5:
            self.rng.shuffle(ids)
            cut = self.rng.randint(1, len(ids) - 1)
            for a in ids[:cut]:
                for b in ids[cut:]:
                    self.blocked.update({(a, b), (b, a)})
        elif kind < 0.75:
            x = self.rng.choice(ids)
            outbound = self.rng.random() < 0.5
            for y in ids:
                if y != x:
                    self.blocked.add((x, y) if outbound else (y, x))
        else:
            for a, b in itertools.permutations(ids, 2):
                if self.rng.random() < 0.3:
                    self.blocked.add((a, b))

    def client_write(self, target: NodeId | None = None) -> Proposal | None:
        """A client proposes a batch of 1-3 unique entries to ``target`` (a random alive node
        by default), following one leader hint."""
        alive = sorted(self.alive)
        if not alive:
            return None
        target = target if target is not None else self.rng.choice(alive)
        batch = [
            f"{self.seed}/{next(self._writes)}".encode() for _ in range(self.rng.randint(1, 3))
        ]
        for _ in range(2):
            try:
                proposal = self.nodes[target].propose(batch)
            except NotLeaderError as e:
                if e.leader_hint is None or e.leader_hint not in self.alive:
                    return None
                target = e.leader_hint
                continue
            self.checker.on_proposed(proposal, batch)
            self._drain(target)
            return proposal
        return None

    # -- views

    def leader(self) -> NodeId | None:
        """The alive leader of the highest term, if any."""
        leaders = [i for i in self.alive if self.nodes[i].role is Role.LEADER]
        return max(leaders, key=lambda i: self.nodes[i].term, default=None)

    def describe(self) -> str:
        return "; ".join(
            f"{n!r}{'' if i in self.alive else ' (dead)'}" for i, n in self.nodes.items()
        )

    # -- the shell

    def _boot(self, node_id: NodeId, applied: int) -> RaftNode:
        return RaftNode(
            node_id,
            self.ids,
            log=self.logs[node_id],
            rng=random.Random(self.rng.getrandbits(64)),
            config=self.config,
            hard_state=self.disk[node_id],
            applied_index=applied,
        )

    def _drain(self, node_id: NodeId) -> None:
        """Handle a node's Ready as the shell must: persist, then send, then apply."""
        node = self.nodes[node_id]
        ready = node.ready()
        if ready.hard_state is not None:
            self.disk[node_id] = ready.hard_state
        if ready.soft_state is not None and ready.soft_state.role is Role.LEADER:
            self.checker.on_leader(node_id, ready.soft_state.term)
        # The in-memory log is the disk: appends and truncations are durable already.
        for msg in ready.messages:
            self._send(msg)
        for index in ready.committed:
            self.checker.on_committed(node, index)
        if ready.committed:
            self.applied[node_id] = ready.committed[-1]

    def _send(self, msg: Message) -> None:
        f = self.faults
        if (msg.src, msg.dst) in self.blocked or self.rng.random() < f.drop:
            return
        copies = 2 if self.rng.random() < f.duplicate else 1
        for _ in range(copies):
            arrival = self.now + 1 + int(self.rng.random() * f.max_delay)
            heapq.heappush(self._messages, (arrival, next(self._seq), msg))

    def _inject_faults(self) -> None:
        f, rng = self.faults, self.rng
        if self.alive and rng.random() < f.crash:
            self.crash(rng.choice(sorted(self.alive)))
        for i in self.ids:
            if i not in self.alive and rng.random() < f.restart:
                self.restart(i)
        if rng.random() < f.partition:
            self.partition()
        elif self.blocked and rng.random() < f.heal:
            self.blocked.clear()
        if rng.random() < f.transfer:
            leader = self.leader()
            if leader is not None:
                self.nodes[leader].transfer_leadership(rng.choice(self.nodes[leader].peers))
                self._drain(leader)


def random_scenario(seed: int, ticks: int = 300) -> SimCluster:
    """Run a seed's random cluster (3, 4 or 5 nodes, random config and faults) for ``ticks``,
    checking safety every tick, then liveness; return the cluster."""
    rng = random.Random(f"scenario-{seed}")
    faults = Faults.random(rng)
    # Raft needs a round trip (up to 2 * max_delay) well inside the election timeout.
    lo = max(5, rng.choice([3, 5, 10]) * faults.max_delay)
    config = RaftConfig(
        election_timeout_ticks=(lo, 2 * lo),
        heartbeat_ticks=rng.randint(1, max(1, lo // 3)),
        pre_vote=rng.random() < 0.8,
        check_quorum=rng.random() < 0.8,
        max_append_bytes=rng.choice([8, 64, 1 << 20]),
        max_append_entries=rng.choice([1, 3, 64]),
        max_inflight=rng.choice([1, 2, 4]),
        noop_on_election=rng.random() < 0.8,
        death_notice_stagger_ticks=rng.choice([0, 1, 2]),
    )
    # Keep clients within what replication can carry (about max_delay + 1 ticks a round
    # trip, entries of about 10 bytes), so the backlog stays bounded.
    per_batch = min(config.max_append_entries, max(1, config.max_append_bytes // 10))
    capacity = config.max_inflight * per_batch / (faults.max_delay + 1)
    faults = dataclasses.replace(faults, propose=min(faults.propose, capacity / 4))
    cluster = SimCluster(rng.choice([3, 3, 4, 5, 5]), seed, faults=faults, config=config)
    cluster.run(ticks)
    cluster.check_liveness()
    return cluster


def ticks_to_new_leader(
    size: int = 3,
    seed: int = 0,
    *,
    death_notice: bool = True,
    config: RaftConfig | None = None,
    max_delay: int = 1,
    max_ticks: int = 10_000,
) -> int:
    """Ticks from a leader's crash (and, with ``death_notice``, the survivors being told at
    once, as Ray's actor death notice would) until a survivor leads a later term.

    Here a tick is as long as a message delay, whereas a real shell's tick
    (~100 ms) dwarfs a Ray call, so by default survivors stagger their
    campaigns by ``max_delay + 1`` ticks, as 1 tick does in a real group.
    """
    if config is None:
        config = RaftConfig(death_notice_stagger_ticks=max_delay + 1)
    cluster = SimCluster(
        size,
        seed,
        faults=Faults(max_delay=max_delay, death_notice=1.0 if death_notice else 0.0),
        config=config,
    )
    settle = 4 * cluster.config.heartbeat_ticks + 2 * max_delay
    while True:
        cluster.run(1)
        leader = cluster.leader()
        if leader is not None and all(cluster.nodes[i].leader_id == leader for i in cluster.ids):
            break
        if cluster.now > max_ticks:
            raise LivenessFailure(f"seed {seed}: no leader in {max_ticks} ticks")
    cluster.run(settle)
    old = cluster.leader()
    assert old is not None
    old_term = cluster.nodes[old].term
    cluster.crash(old, notice_delay=0)
    start = cluster.now
    while cluster.now - start < max_ticks:
        cluster.run(1)
        new = cluster.leader()
        if new is not None and cluster.nodes[new].term > old_term:
            return cluster.now - start
    raise LivenessFailure(f"seed {seed}: no new leader {max_ticks} ticks after the crash")


__all__ = [
    "Faults",
    "LivenessFailure",
    "SafetyChecker",
    "SafetyViolation",
    "SimCluster",
    "SimLog",
    "random_scenario",
    "ticks_to_new_leader",
]
