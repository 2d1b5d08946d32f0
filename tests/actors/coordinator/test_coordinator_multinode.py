"""The consumer-group coordinator across nodes of a multi-node Ray cluster: brokers on
the head, four push consumers hosted in fleet-member actors on two worker nodes, sends
going on. One consumer node leaves: the coordinator drops its consumers as soon as Ray
reports their actors dead (well before their session timeout), fences their queues and
hands them to the survivors; every queue has one owner at a time and nothing is lost."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from raymq_testkit import stored_ends, wait_until
from test_coordinator import DeliveryLog, Load, owners_one_at_a_time, recording

import actors
from actors import CoordinatorConfig
from actors.coordinator.host import find_coordinator
from actors.fleet.member import MEMBER_MAX_CONCURRENCY, FleetMember, MemberSpec
from actors.protocol.rpc import get
from rebalance import MessageQueue

TOPIC, GROUP = "CoordNodes", "g-coord-nodes"
SESSION_TIMEOUT_S = 60.0  # long: a takeover must come from Ray's word, not from silence
CONSUMER = {
    "heartbeat_interval_s": 1.0,
    "session_timeout_s": SESSION_TIMEOUT_S,
    "persist_offset_interval_s": 0.2,
    "pull_suspend_s": 2.0,
    "pull_retry_delay_s": 0.2,
    "consume_from": "FIRST",
    "consume_threads": 2,
    "consume_batch_size": 16,
    "pull_batch_size": 32,
    "shutdown_timeout_s": 10.0,
    "coordinator_config": CoordinatorConfig(
        revoke_timeout_s=15.0, route_refresh_s=5.0, fence_timeout_s=2.0
    ),
}


def start_member(name: str, node_id: str, dlog: Any, namespace: str) -> tuple[Any, str]:
    """A fleet-member actor pinned to ``node_id`` whose consumer records as ``name``;
    returns its handle and client id."""
    handle = (
        ray.remote(FleetMember)
        .options(
            num_cpus=0,
            max_concurrency=MEMBER_MAX_CONCURRENCY,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )
        .remote(MemberSpec(GROUP, TOPIC, "*", recording(name, dlog), namespace, None, CONSUMER))
    )
    return handle, get(handle.start.remote(), 60)


def label(mq: MessageQueue) -> str:
    return f"{mq.topic}:{mq.broker_name}:{mq.queue_id}"


def test_a_consumer_node_leaving_hands_its_queues_to_the_survivors_at_once(
    ray_cluster: Any, make_cluster: Any
) -> None:
    started = time.monotonic()
    node_x = ray_cluster.add_node(num_cpus=1, resources={"coord-node-x": 1})
    node_y = ray_cluster.add_node(num_cpus=1, resources={"coord-node-y": 1})
    members: dict[str, tuple[Any, str]] = {}
    load: Load | None = None
    try:
        ray_cluster.wait_for_nodes()
        head = ray.get_runtime_context().get_node_id()
        cluster = make_cluster(
            nameservers=1, brokers=2, topics=[actors.TopicConfig(TOPIC, 8, 8)]
        )  # 16 queues, every broker on the head
        queues = sorted(
            MessageQueue(TOPIC, r["broker"], r["queue_id"])
            for r in cluster.admin.topic_status(TOPIC)
        )
        assert len(queues) == 16
        host_of = {
            name: get(cluster.broker(name).status.remote(), 30)["addr"]
            for name in ("broker-a", "broker-b")
        }
        dlog = DeliveryLog.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)
        ).remote()

        # the first member, on the node that will leave, creates the coordinator
        members["x1"] = start_member("x1", node_x.node_id, dlog, cluster.namespace)
        coord = find_coordinator(GROUP, cluster.namespace)
        assert coord is not None, "the first member made no coordinator"
        assert get(coord.status.remote(), 30)["node_id"] == head, "the coordinator left the head"
        for name, node in (("x2", node_x), ("y1", node_y), ("y2", node_y)):
            members[name] = start_member(name, node.node_id, dlog, cluster.namespace)
        cid = {name: c for name, (_, c) in members.items()}

        def settled(names: list[str]) -> bool:
            s = get(coord.status.remote(), 30)
            owners = {q: o for q, (o, _) in s["assignment"].items()}
            if sorted(s["members"]) != sorted(cid[n] for n in names):
                return False
            if owners != s["target"] or s["pending_revokes"] or s["pending_fences"]:
                return False
            if not all(q in owners for q in queues):
                return False
            for n in names:
                held = get(members[n][0].status.remote(), 30)["assigned"]
                if sorted(held) != sorted(label(q) for q, o in owners.items() if o == cid[n]):
                    return False
            return True

        wait_until(lambda: settled(["x1", "x2", "y1", "y2"]), timeout_s=30, what="4 members")
        st = get(coord.status.remote(), 30)
        assert {m["session_timeout_s"] for m in st["members"].values()} == {SESSION_TIMEOUT_S}
        assert all(m["watched"] for m in st["members"].values())

        load = Load(cluster, TOPIC, per_queue=2)

        def consumed_by(names: set[str], at_least: int) -> bool:
            count: dict[str, int] = defaultdict(int)
            for who, *_ in get(dlog.all.remote(), 30):
                count[who] += 1
            return all(count[n] >= at_least for n in names)

        wait_until(lambda: consumed_by({"x1", "x2", "y1", "y2"}, 50), what="all 4 consuming")

        # node x leaves under load; what its consumers committed is the redelivery floor
        doomed = {cid["x1"], cid["x2"]}
        owned_by_x = {
            q
            for q, (o, _) in get(coord.status.remote(), 30)["assignment"].items()
            if o in doomed and q.topic == TOPIC
        }
        assert len(owned_by_x) == 8
        broker = {name: cluster.broker(name) for name in host_of}
        floor = {
            (host_of[q.broker_name], q.queue_id): get(
                broker[q.broker_name].query_offset.remote(GROUP, TOPIC, q.queue_id), 30
            )
            for q in owned_by_x
        }
        sent_before = load.sent
        removed = time.monotonic()  # one host: the coordinator's log times compare
        ray_cluster.remove_node(node_x)
        remove_call_s = time.monotonic() - removed
        for name in ("x1", "x2"):
            members.pop(name)
        wait_until(lambda: settled(["y1", "y2"]), timeout_s=30, what="the survivors' takeover")
        takeover_s = time.monotonic() - removed
        assert takeover_s < SESSION_TIMEOUT_S / 4, f"takeover took {takeover_s:.1f}s"

        sent_by_takeover = load.sent
        wait_until(lambda: load.sent > sent_by_takeover + 320, what="sends after the takeover")
        sent = load.finish()
        load = None
        tops = stored_ends(cluster, TOPIC, host_of)
        assert sum(tops.values()) == sent
        wait_until(
            lambda: get(dlog.missing.remote(tops), 30) == 0,
            timeout_s=30,
            interval_s=0.2,
            what="every message delivered",
        )
        wait_until(
            lambda: sum(r["lag"] for r in cluster.admin.consumer_lag(GROUP, TOPIC)) == 0,
            what="every offset committed by the survivors",
        )
        log = get(coord.status.remote(), 30)["log"]
        rows = get(dlog.all.remote(), 30)
    finally:
        if load is not None:
            load.finish()
        for handle, _ in members.values():
            with contextlib.suppress(Exception):
                get(handle.shutdown.remote(), 30)
            ray.kill(handle, no_restart=True)
        for node in (node_x, node_y):
            if node in ray_cluster.worker_nodes:
                ray_cluster.remove_node(node)

    # the doomed members were dropped on Ray's word, and their queues fenced, then moved
    gone = [ev for ev in log if ev.from_id in doomed and ev.event in ("dead", "expired", "leave")]
    assert sorted((ev.from_id, ev.event) for ev in gone) == sorted((c, "dead") for c in doomed)
    seen_dead_s = max(ev.time for ev in gone) - removed
    fenced = {ev.queue for ev in log if ev.event == "fence" and ev.from_id in doomed}
    assert {q for q in fenced if q.topic == TOPIC} == owned_by_x
    after = [ev for ev in log if ev.time >= removed]
    assert {ev.from_id for ev in after if ev.event == "fence"} <= doomed  # survivors confirm
    moved = [ev for ev in after if ev.event == "assign" and ev.queue in owned_by_x]
    assert {ev.queue for ev in moved} == owned_by_x
    assert {ev.to_id for ev in after if ev.event == "assign"} <= {cid["y1"], cid["y2"]}
    assigned_s = max(ev.time for ev in moved) - removed

    # one owner per queue at every instant, and every queue owned by a survivor at the end
    final = owners_one_at_a_time(log)
    assert {q for q in final if q.topic == TOPIC} == set(queues)
    assert set(final.values()) <= {cid["y1"], cid["y2"]}

    deliveries: dict[tuple[str, int, int], list[str]] = defaultdict(list)
    for who, _, h, q, o in rows:
        deliveries[(h, q, o)].append(who)
    assert len(deliveries) == sent, "nothing lost"
    dups = {k: who for k, who in deliveries.items() if len(who) > 1}
    for (h, q, o), who in dups.items():
        assert len(who) == 2 and sum(w in ("x1", "x2") for w in who) == 1, f"{(h, q, o)}: {who}"
        assert (h, q) in floor, f"{(h, q, o)} redelivered on a queue node x did not own"
        assert o >= floor[(h, q)], f"{(h, q, o)} was committed before node x left"
    print(
        f"\n{sent} messages ({sent_before} before node x left, {sent - sent_by_takeover} after "
        f"the takeover), {len(dups)} redelivered (node x's uncommitted); remove_node took "
        f"{remove_call_s:.1f}s; the coordinator saw both consumers dead after "
        f"{seen_dead_s:.2f}s, assigned their 8 queues by {assigned_s:.2f}s, survivors held "
        f"them at {takeover_s:.2f}s (session timeout {SESSION_TIMEOUT_S:.0f}s); "
        f"scenario took {time.monotonic() - started:.1f}s"
    )
