"""A seed's fault schedule: the mode it runs, whether the producer is idempotent, and the
faults one after another, each drawn from ``random.Random(seed)`` alone, so
``--seed 7 --only-seed`` injects the same faults at the same moments again.

Nodes: ``a`` (Ray head: the GCS, the NameServer, the keeper), ``n1`` .. ``nN`` (the
brokers' nodes) and ``client`` (the workload). A fault names nodes by these names, and a
role (``leader``: whichever member acknowledged the latest send; ``follower``: any other
member) that the runner resolves when the fault begins.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

MODES = ("ASYNC_FLUSH", "SYNC_FLUSH", "SYNC_MASTER", "RAFT")

KINDS = (
    "isolate",  # one node cut off from every other node
    "split",  # a majority and a minority of the nodes, each side whole
    "bridge",  # two broker nodes cut from each other, every other node sees both
    "one_way",  # what one node sends to another is dropped, not the way back
    "netem",  # one node's packets delayed (and some dropped)
    "pause_broker",  # SIGSTOP of a broker process, SIGCONT at the end
    "pause_node",  # SIGSTOP of every process of a node (raylet included)
    "kill_broker",  # SIGKILL of a broker process, started again at the end
    "power_loss",  # SIGKILL of every process of a node, its unflushed writes lost
    "bad_replica",  # a power loss, then a flipped bit or a truncation in its log
)
REPLICATED = ("SYNC_MASTER", "RAFT")


@dataclass
class Fault:
    kind: str
    start_s: float  # from the end of the warm-up
    duration_s: float
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        args = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.kind}({args}) at {self.start_s:.0f}s for {self.duration_s:.0f}s"


@dataclass
class Plan:
    seed: int
    mode: str
    idempotent: bool
    broker_nodes: list[str]
    faults: list[Fault]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def broker_nodes(count: int) -> list[str]:
    return [f"n{i + 1}" for i in range(count)]


def draw(seed: int, minutes: float, nodes: int, modes: tuple[str, ...] = MODES) -> Plan:
    """The plan of ``seed``: the mode cycles with the seed (so 4 consecutive seeds cover
    every mode), idempotence alternates every len(modes) seeds; the faults fill
    ``minutes`` with a quiet gap after each."""
    if nodes < 3:
        raise ValueError(f"--nodes {nodes}: at least 3 broker nodes (a Raft group of 3)")
    rng = random.Random(seed)
    mode = modes[seed % len(modes)]
    idempotent = (seed // len(modes)) % 2 == 0
    members = broker_nodes(nodes if mode != "RAFT" or nodes % 2 else nodes - 1)
    everyone = ["a", *members, "client"]
    kinds = [k for k in KINDS if k != "bad_replica" or mode in REPLICATED]
    faults: list[Fault] = []
    t = rng.uniform(3.0, 8.0)
    total = minutes * 60.0
    while True:
        kind = rng.choice(kinds)
        duration = rng.uniform(4.0, 20.0)
        if t + duration > total:
            break
        params: dict[str, Any] = {}
        if kind == "isolate":
            params["node"] = rng.choice(members)
        elif kind == "split":
            shuffled = rng.sample(everyone, len(everyone))
            cut = rng.randrange(1, (len(shuffled) + 1) // 2)
            params["minority"], params["majority"] = _with_head(
                shuffled[:cut], shuffled[cut:], members
            )
        elif kind == "bridge":
            params["sides"] = sorted(rng.sample(members, 2))
        elif kind == "one_way":
            src, dst = rng.sample(["a", *members], 2)
            params.update(src=src, dst=dst)
        elif kind == "netem":
            params.update(
                node=rng.choice(members),
                delay_ms=rng.choice((20, 100, 300)),
                jitter_ms=rng.choice((0, 20, 50)),
                loss_pct=rng.choice((0.0, 1.0, 5.0, 20.0)),
            )
        elif kind in ("pause_broker", "pause_node", "kill_broker"):
            params["target"] = rng.choice(("leader", "follower") if mode in REPLICATED else members)
        elif kind == "power_loss":
            params["target"] = rng.choice(("leader", "follower") if mode in REPLICATED else members)
            params["tail"] = rng.choice(("flushed", "flushed", "between"))
        elif kind == "bad_replica":
            params["target"] = "follower"
            params["damage"] = rng.choice(("flip", "truncate"))
            params["log"] = rng.choice(("commitlog", "raft") if mode == "RAFT" else ("commitlog",))
        params["draw"] = rng.randrange(1 << 30)  # the fault's own choices (a byte, a cut)
        faults.append(Fault(kind, round(t, 1), round(duration, 1), params))
        t += duration + rng.uniform(5.0, 15.0)
    return Plan(seed, mode, idempotent, members, faults)


def _with_head(minority: list[str], majority: list[str], members: list[str]) -> tuple[list, list]:
    """A split's sides with the client on the head's side: the client is a Ray driver,
    and Ray ends a driver whose node it cannot reach for seconds, the history with it.
    A side left empty takes the first broker node of the other side."""
    sides = [set(minority), set(majority)]
    head, other = (sides[0], sides[1]) if "a" in sides[0] else (sides[1], sides[0])
    if "client" in other:
        other.discard("client")
        head.add("client")
        if not other:
            moved = next(n for n in members if n in head)
            head.discard(moved)
            other.add(moved)
    small, large = sorted((sorted(x) for x in sides), key=len)
    return small, large
