"""Where a broker actor runs, and how it is started there: pinned to one Ray node (its
store is that node's local disk), detached and named ``<broker name>-<broker id>``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.broker.broker import Broker
from actors.config.broker import BrokerConfig
from actors.protocol import rpc as _rpc
from storage.errors import InvalidConfigError

ACTOR_MAX_CONCURRENCY = 1000
# A broker's replies (pulls: 4 queues x 256 records of 100 B are ~250 KB) travel
# inline in Ray's reply up to this size, not through the object store: Ray's
# default cut is 100 KiB, and an async method returning 245 KB took 3.1-3.3 ms
# a call through the store against 2.1-2.5 ms inline (1 MB: no difference).
# Ray reads the setting from the worker's environment when the worker starts.
BROKER_INLINE_REPLY_BYTES = 1 << 20
BROKER_RUNTIME_ENV = {
    "env_vars": {"RAY_max_direct_call_object_size": str(BROKER_INLINE_REPLY_BYTES)}
}


def resolve_node(node: str | None, nodes: Sequence[dict[str, Any]] | None = None) -> str:
    """A Ray node id from an id, an IP address, a node name or a custom resource only
    that node has; ``None`` is the caller's node. ``nodes``: ``ray.nodes()`` if known."""
    if node is None:
        return ray.get_runtime_context().get_node_id()
    alive = [n for n in (ray.nodes() if nodes is None else nodes) if n.get("Alive")]
    for n in alive:
        if node == n["NodeID"]:
            return str(n["NodeID"])
    for key in ("NodeManagerAddress", "NodeName"):
        hits = [n["NodeID"] for n in alive if n.get(key) == node]
        if len(hits) == 1:
            return str(hits[0])
    hits = [n["NodeID"] for n in alive if node in n.get("Resources", {})]
    if len(hits) == 1:
        return str(hits[0])
    raise InvalidConfigError(
        f"node={node!r}: no single live Ray node has that id, address, name or resource "
        f"({len(alive)} live nodes)"
    )


def start_broker_actor(config: BrokerConfig, node_id: str, max_restarts: int) -> Any:
    """The broker's actor, started on ``node_id`` (not waited for: ping it)."""
    return _rpc.service_actor(
        Broker,
        config.actor_name,
        config.namespace,
        max_concurrency=ACTOR_MAX_CONCURRENCY,
        max_restarts=max_restarts,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        runtime_env=BROKER_RUNTIME_ENV,
    ).remote(config)
