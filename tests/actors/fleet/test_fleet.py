"""Consumer fleets against a real 2-broker cluster: growing with a backlog to the maximum,
draining it, shrinking back; sizing by hand; replacing a crashed member; the sizing
policy on its own."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
from raymq_testkit import start_push_cluster, wait_until

import actors
from actors import ConsumerFleet, ConsumeStatus, FleetConfig
from actors.fleet.controller import ScalePolicy
from storage import Message
from storage.errors import InvalidConfigError, RayMQError

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # listener and sink below

MEMBER = {
    "rebalance_interval_s": 0.3,
    "heartbeat_interval_s": 0.3,
    "persist_offset_interval_s": 0.2,
    "pull_suspend_s": 2.0,
    "pull_retry_delay_s": 0.2,
    "shutdown_timeout_s": 10.0,
    "consume_from": "FIRST",
}


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = start_push_cluster("fleet", str(tmp_path_factory.mktemp("fleet")))
    yield c
    c.shutdown()


@ray.remote(num_cpus=0)
class Sink:
    """Counts, per message number, how often any member's listener saw it."""

    def __init__(self, n: int) -> None:
        self.seen = np.zeros(n, dtype=np.int32)

    def add(self, numbers: np.ndarray) -> None:
        np.add.at(self.seen, numbers, 1)

    def counts(self) -> tuple[int, int]:
        """(distinct messages seen, deliveries in all)."""
        return int(np.count_nonzero(self.seen)), int(self.seen.sum())


class Listener:
    """Reports the numbers in the bodies to the sink and simulates a little work."""

    def __init__(self, sink: Any, work_s: float) -> None:
        self.sink, self.work_s = sink, work_s

    def __call__(self, messages: list[Any]) -> ConsumeStatus:
        self.sink.add.remote(np.fromiter((int(m.body) for m in messages), np.int64))
        time.sleep(self.work_s)  # a little work per batch
        return ConsumeStatus.SUCCESS


def produce(cluster: actors.Cluster, topic: str, n: int, chunk: int = 25_000) -> None:
    producer = cluster.producer(f"p-{topic}", max_batch_messages=chunk)
    try:
        for start in range(0, n, chunk):
            producer.send_batch([Message(topic, b"%08d" % i) for i in range(start, start + chunk)])
    finally:
        producer.close()


def sizes(fleet: ConsumerFleet) -> tuple[int, int]:
    st = fleet.status()
    return st["running"], st["size"]


def test_a_fleet_grows_with_a_backlog_drains_it_and_shrinks_back(cluster: actors.Cluster) -> None:
    topic, group, n = "FleetBacklog", "g-fleet-backlog", 200_000
    cluster.admin.create_topic(topic, 4, 4)  # 8 queues
    produce(cluster, topic, n)
    sink = Sink.remote(n)
    fleet = ConsumerFleet(
        group,
        topic,
        Listener(sink, work_s=0.01),
        namespace=cluster.namespace,
        min_consumers=1,
        max_consumers=4,
        target_lag_per_consumer=20_000,
        scale_up_window_s=1.0,
        scale_down_window_s=1.5,
        interval_s=0.25,
        num_cpus=0.5,
        consumer_options={
            **MEMBER,
            "consume_threads": 2,
            "consume_batch_size": 64,
            "pull_batch_size": 256,
        },
    )
    try:
        started = time.monotonic()
        wait_until(lambda: sizes(fleet) == (4, 4), timeout_s=30, what="the fleet at its max")
        grew_after = time.monotonic() - started
        st = fleet.status()
        assert st["lag"] > 0 and sorted(st["assignment"]) == sorted(
            m["name"] for m in st["members"]
        )
        wait_until(
            lambda: ray.get(sink.counts.remote())[0] == n, timeout_s=60, what="the backlog drained"
        )
        wait_until(lambda: sizes(fleet) == (1, 1), timeout_s=30, what="the fleet back at min")
        # it may shrink while some lag remains (below the target): the last commits and
        # the controller's next lag reading come within a few intervals
        st = wait_until(
            lambda: (s := fleet.status())["lag"] == 0 and s, what="lag 0 in the fleet's status"
        )
        assert st["autoscale"] and st["target_size"] == 1
        kinds = [e["detail"] for e in st["events"] if e["kind"] == "autoscale"]
        assert any("1 -> 4" in k or "-> 4" in k for k in kinds), kinds
        assert any(k.split(" (")[0].endswith("-> 1") for k in kinds), kinds
        wait_until(
            lambda: [len(m["queues"]) for m in fleet.status()["members"]] == [8],
            what="the one left owning every queue",
        )
    finally:
        final = fleet.shutdown()
    distinct, deliveries = ray.get(sink.counts.remote())
    assert distinct == n, "every message consumed, none lost"
    assert deliveries >= n
    assert final["members"] == []
    assert sum(r["lag"] for r in cluster.admin.consumer_lag(group, topic)) == 0
    with pytest.raises(ValueError):
        ray.get_actor(actors.fleet_actor_name(group), namespace=cluster.namespace)
    print(f"grew to 4 after {grew_after:.1f}s; {deliveries - n} redeliveries")


def test_a_fleet_sized_by_hand_reports_its_members_and_replaces_a_crashed_one(
    cluster: actors.Cluster,
) -> None:
    topic, group = "FleetByHand", "g-fleet-hand"
    cluster.admin.create_topic(topic, 4, 4)
    sink = Sink.remote(1)
    fleet = ConsumerFleet(
        group,
        topic,
        Listener(sink, work_s=0.0),
        namespace=cluster.namespace,
        min_consumers=1,
        max_consumers=3,
        interval_s=0.2,
        num_cpus=0,
        consumer_options=MEMBER,
    )
    try:
        fleet.wait_stable(1, timeout_s=30)
        with pytest.raises(RayMQError, match="already runs"):
            ConsumerFleet(group, topic, Listener(sink, 0.0), namespace=cluster.namespace)
        with pytest.raises(InvalidConfigError, match="max_consumers=3"):
            fleet.scale(4)
        assert fleet.scale(3) == 3
        queues = {f"{topic}:{b}:{q}" for b in ("broker-a", "broker-b") for q in range(4)}

        def split_of(count: int) -> bool:
            st = fleet.status()
            owned = [q for qs in st["assignment"].values() for q in qs]
            return (
                len(st["assignment"]) == count
                and sorted(owned) == sorted(queues)
                and all(qs for qs in st["assignment"].values())
            )

        wait_until(lambda: split_of(3), what="three members splitting the 8 queues")
        st = ConsumerFleet.attach(group, cluster.namespace).status()  # from any program
        assert st["autoscale"] is False and st["target_size"] == 3 and st["running"] == 3
        assert {"lag", "lag_per_consumer", "consume_rate", "events", "members"} <= set(st)
        for m in st["members"]:
            assert m["state"] == "RUNNING" and m["client_id"] and "consume_rate" in m
        # each member froze what it held at start out of the collector's full walks
        for name in st["assignment"]:
            member = ray.get(ray.get_actor(name, namespace=cluster.namespace).status.remote())
            assert member["gc_frozen_objects"] > 10_000, member
            # and runs at nice 0 (FleetConfig.process_nice), whatever its Ray's workers
            # start at (tests/actors/broker/test_priority.py shows a broker's on Ray's 15)
            assert member["process_nice"] == 0, member
        # a member crashes: the fleet replaces it, the size it was given stays
        victim = st["members"][0]["name"]
        ray.kill(ray.get_actor(victim, namespace=cluster.namespace), no_restart=True)
        wait_until(
            lambda: any(e["kind"] == "lost" for e in fleet.status()["events"]),
            what="the loss noticed",
        )
        # the assignment may still name the victim for a moment after the loss is noticed
        wait_until(
            lambda: split_of(3) and victim not in fleet.status()["assignment"],
            what="a replacement taking its queues",
        )
        assert fleet.scale(1) == 1
        wait_until(lambda: split_of(1), what="one member owning all")
        fleet.autoscale(True)
        assert fleet.status()["autoscale"] is True
    finally:
        fleet.shutdown()
    # the members left; the crashed one's broker session expires on its own
    wait_until(lambda: cluster.admin.consumer_list(group) == [], what="an empty group")


def test_members_no_node_has_room_for_are_pending_until_a_node_with_room_comes(
    cluster: actors.Cluster, ray_cluster: Any
) -> None:
    topic, group = "FleetPending", "g-fleet-pending"
    cluster.admin.create_topic(topic, 2, 2)
    sink = Sink.remote(1)
    room = "fleet_test_room"  # a resource no node of the cluster has
    fleet = ConsumerFleet(
        group,
        topic,
        Listener(sink, work_s=0.0),
        namespace=cluster.namespace,
        min_consumers=1,
        max_consumers=2,
        interval_s=0.2,
        num_cpus=0,
        resources={room: 1},
        consumer_options=MEMBER,
    )
    node = None
    try:
        started = time.monotonic()
        assert fleet.scale(2) == 2  # returns: the members are pending, not an error
        assert time.monotonic() - started < 15
        st = fleet.status()
        assert (st["size"], st["pending"], st["running"]) == (2, 2, 0)
        for m in st["members"]:
            assert m["state"] == "PENDING" and m["node"] is None
            assert f"'{room}': 1.0" in m["waiting_for"] and "no node has" in m["waiting_for"]
        assert any(e["kind"] == "pending" for e in st["events"])
        with pytest.raises(RayMQError, match="waiting_for"):
            fleet.wait_stable(2, timeout_s=0.5)  # waiting for every member to run says why
        node = ray_cluster.add_node(num_cpus=1, resources={room: 2})  # a node with room
        wait_until(
            lambda: sizes(fleet) == (2, 2), timeout_s=90, what="the members up on the new node"
        )
        st = fleet.status()
        assert st["pending"] == 0
        assert {m["node"] for m in st["members"]} == {node.node_id}

        def shared() -> bool:  # the group rebalances once both members have joined
            assignment = fleet.status()["assignment"]
            owned = [q for qs in assignment.values() for q in qs]
            return len(owned) == 4 and all(assignment.values())

        wait_until(shared, timeout_s=30, what="the 4 queues owned, by every member")
    finally:
        fleet.shutdown()
        if node is not None:
            ray_cluster.remove_node(node)


def test_the_sizing_policy_needs_the_lag_to_stay_past_the_target_for_a_window() -> None:
    cfg = FleetConfig(
        min_consumers=1,
        max_consumers=4,
        target_lag_per_consumer=100,
        scale_up_window_s=2.0,
        scale_down_window_s=5.0,
    )
    p = ScalePolicy(cfg)
    assert p.wanted(0, cap=4) == 1 and p.wanted(250, cap=4) == 3 and p.wanted(10**6, cap=2) == 2
    assert p.observe(0.0, 1000, 8, current=1) is None  # above, window not over
    assert p.observe(1.0, 250, 8, current=1) is None
    assert p.observe(2.0, 1000, 8, current=1) == 3  # the smallest wanted meanwhile
    assert p.observe(3.0, 1000, 8, current=3) is None
    assert p.observe(4.0, 100, 8, current=3) is None  # a dip resets the window
    assert p.observe(5.0, 1000, 8, current=3) is None
    assert p.observe(7.0, 1000, 8, current=3) == 4
    assert p.observe(8.0, 0, 8, current=4) is None
    assert p.observe(12.0, 150, 8, current=4) is None
    assert p.observe(13.0, 0, 8, current=4) == 2  # the largest wanted meanwhile
    assert p.observe(14.0, 0, 1, current=2) == 1  # the queues shrank: at once
    with pytest.raises(InvalidConfigError, match="min_consumers"):
        FleetConfig(min_consumers=3, max_consumers=2)
    for bad in ("0", True, 20, -21, 1.5):
        with pytest.raises(InvalidConfigError, match="process_nice"):
            FleetConfig(process_nice=bad)  # type: ignore[arg-type]
    assert FleetConfig(process_nice=None).process_nice is None
