"""Rebalance strategies on a real cluster whose brokers live in two machine rooms
(``r1@broker-a``, ``r2@broker-b``), in both modes: coordinated (the group's coordinator
runs the strategy) and uncoordinated (each consumer runs it over the brokers' member
list). Every built-in strategy gives the same answer ``rebalance`` gives for the same
members, and the machine-room strategies consume each message once, in its room."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from raymq_testkit import PUSH_FAST, SMALL_STORE, unique_namespace, wait_until

import actors
from actors import ConsumeStatus, CoordinatorConfig, PushConsumer
from rebalance import STRATEGY_NAMES, MessageQueue, assign, get_strategy
from storage import Message
from storage.errors import InvalidConfigError

ROOMS = {"r1@broker-a": "r1", "r2@broker-b": "r2"}
FAST = {
    **PUSH_FAST,
    "consume_from": "FIRST",
    "coordinator_config": CoordinatorConfig(
        revoke_timeout_s=1.5, route_refresh_s=2.0, fence_timeout_s=2.0
    ),
}
MODES = pytest.mark.parametrize("coordinated", [True, False], ids=["coordinated", "uncoordinated"])


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = actors.start_cluster(
        namespace=unique_namespace("rooms"),
        nameservers=1,
        brokers=list(ROOMS),
        store_root=str(tmp_path_factory.mktemp("rooms")),
        broker_options={
            "store": SMALL_STORE,
            "heartbeat_interval_s": 2.0,
            "channel_expired_s": 4.0,
        },
    )
    yield c
    c.shutdown()


def queues_of(cluster: actors.Cluster, topic: str) -> list[MessageQueue]:
    return sorted(
        MessageQueue(topic, r["broker"], r["queue_id"]) for r in cluster.admin.topic_status(topic)
    )


class Recorder:
    """A listener that counts the messages it saw by body."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: Counter[bytes] = Counter()

    def __call__(self, messages: list[Any]) -> ConsumeStatus:
        with self.lock:
            self.seen.update(m.body for m in messages)
        return ConsumeStatus.SUCCESS


def start(
    cluster: actors.Cluster,
    group: str,
    topic: str,
    rooms: list[str],
    coordinated: bool,
    **options: Any,
) -> tuple[list[PushConsumer], list[Recorder]]:
    recorders = [Recorder() for _ in rooms]
    consumers = []
    try:
        for room, rec in zip(rooms, recorders):
            consumer = PushConsumer(
                group,
                topic,
                listener=rec,
                namespace=cluster.namespace,
                coordinated=coordinated,
                machine_room=room,
                **{**FAST, **options},
            )
            consumers.append(consumer.start())
    except BaseException:
        for c in consumers:
            c.shutdown()
        raise
    return consumers, recorders


def owned(consumers: list[PushConsumer], topic: str) -> dict[str, list[MessageQueue]]:
    return {c.client_id: c.assigned_queues(topic) for c in consumers}


def send_everywhere(cluster: actors.Cluster, topic: str, n: int) -> dict[bytes, str]:
    """``n`` messages spread over every queue; body -> the broker that stored it."""
    producer = cluster.producer(f"p-{topic}", max_batch_messages=1)
    try:
        bodies = [b"%s-%04d" % (topic.encode(), i) for i in range(n)]
        results = producer.send_batch([Message(topic, body) for body in bodies])
        return {body: r.message_queue.broker_name for body, r in zip(bodies, results)}
    finally:
        producer.close()


# ---------------------------------------------------------------------- machine rooms (item 1)
@MODES
def test_machine_room_nearby_each_room_s_consumers_take_its_queues_and_consume_each_message_once(
    cluster: actors.Cluster, coordinated: bool
) -> None:
    topic = f"Nearby{'C' if coordinated else 'U'}"
    group = f"g-nearby-{'c' if coordinated else 'u'}"
    cluster.admin.create_topic(topic, 4, 4)  # 4 queues in each room
    queues = queues_of(cluster, topic)
    consumers, recorders = start(
        cluster,
        group,
        topic,
        ["r1", "r1", "r2"],
        coordinated,
        rebalance_strategy="machine_room_nearby",
    )
    room_of = {c.client_id: room for c, room in zip(consumers, ["r1", "r1", "r2"])}
    try:

        def split_by_room() -> bool:
            shares = owned(consumers, topic)
            mine = [q for share in shares.values() for q in share]
            return sorted(mine) == queues and all(
                ROOMS[q.broker_name] == room_of[cid] for cid, share in shares.items() for q in share
            )

        wait_until(split_by_room, what="each room's queues with that room's consumers")
        stored_on = send_everywhere(cluster, topic, 64)
        assert set(stored_on.values()) == set(ROOMS), "messages in both rooms"
        wait_until(
            lambda: sum(sum(r.seen.values()) for r in recorders) >= len(stored_on),
            what="every message",
        )
        seen = Counter[bytes]()
        for consumer, rec in zip(consumers, recorders):
            seen.update(rec.seen)
            for body in rec.seen:
                assert ROOMS[stored_on[body]] == room_of[consumer.client_id], "consumed in its room"
        assert seen == Counter(stored_on.keys()), "every message consumed once"
    finally:
        for c in consumers:
            c.shutdown()


@MODES
def test_machine_room_consumes_the_listed_rooms_queues_once_and_no_other(
    cluster: actors.Cluster, coordinated: bool
) -> None:
    topic = f"Rooms{'C' if coordinated else 'U'}"
    group = f"g-rooms-{'c' if coordinated else 'u'}"
    cluster.admin.create_topic(topic, 4, 4)
    r1_queues = [q for q in queues_of(cluster, topic) if q.broker_name == "r1@broker-a"]
    # both consumers in r1: the group consumes room r1 (RocketMQ's consumeridcs)
    consumers, recorders = start(
        cluster, group, topic, ["r1", "r1"], coordinated, rebalance_strategy="machine_room"
    )
    try:
        wait_until(
            lambda: (
                sorted(q for share in owned(consumers, topic).values() for q in share) == r1_queues
            ),
            what="room r1's queues shared by the group",
        )
        stored_on = send_everywhere(cluster, topic, 40)
        in_r1 = Counter(body for body, broker in stored_on.items() if ROOMS[broker] == "r1")
        assert 0 < len(in_r1) < len(stored_on)
        wait_until(
            lambda: sum(sum(r.seen.values()) for r in recorders) >= len(in_r1),
            what="every message of room r1",
        )
        seen = Counter[bytes]()
        for rec in recorders:
            seen.update(rec.seen)
        assert seen == in_r1, "room r1's messages once each, room r2's not at all"
        assert all(share for share in owned(consumers, topic).values()), "both take a part"
    finally:
        for c in consumers:
            c.shutdown()


# ---------------------------------------------------------------------- every strategy (item 3)
def expected_shares(
    name: str,
    group: str,
    queues: list[MessageQueue],
    rooms: dict[str, str],
    listed: dict[str, list[MessageQueue]],
) -> dict[str, list[MessageQueue]]:
    """What ``rebalance`` gives these members, computed here from RocketMQ's rules."""
    cids = list(rooms)
    if name == "config":
        return {cid: sorted(listed[cid]) for cid in cids}
    if name == "machine_room":
        strategy = get_strategy(name, consumer_idcs=set(rooms.values()))
    elif name == "machine_room_nearby":
        strategy = get_strategy(
            name,
            inner="averagely",
            broker_room=lambda mq: ROOMS[mq.broker_name],
            consumer_room=rooms.__getitem__,
        )
    elif name == "consistent_hash":
        strategy = get_strategy(name, virtual_nodes=5)
    else:
        strategy = get_strategy(name)
    return {cid: sorted(share) for cid, share in assign(strategy, group, queues, cids).items()}


@MODES
@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_every_strategy_gives_its_own_answer(
    cluster: actors.Cluster, name: str, coordinated: bool
) -> None:
    topic = "EveryStrategy"
    group = f"g-{name.replace('_', '-')}-{'c' if coordinated else 'u'}"
    cluster.admin.create_topic(topic, 3, 3)  # 6 queues, 3 in each room
    queues = queues_of(cluster, topic)
    member_rooms = ["r1", "r2", "r1"]
    listed = [queues[i::3] for i in range(3)]  # 'config': each member its own queues
    consumers: list[PushConsumer] = []
    try:
        for i, room in enumerate(member_rooms):
            options: dict[str, Any] = {}
            if name == "config":
                options = {"queues": listed[i]}
            elif name == "consistent_hash":
                options = {"virtual_nodes": 5}
            more, _ = start(
                cluster,
                group,
                topic,
                [room],
                coordinated,
                rebalance_strategy=name,
                rebalance_options=options,
            )
            consumers += more
        rooms = {c.client_id: room for c, room in zip(consumers, member_rooms)}
        expected = expected_shares(
            name, group, queues, rooms, {c.client_id: q for c, q in zip(consumers, listed)}
        )
        assert any(expected.values()) and len(set(map(tuple, expected.values()))) > 1
        wait_until(
            lambda: owned(consumers, topic) == expected,
            timeout_s=30,
            what=f"{name}'s assignment ({'coordinated' if coordinated else 'uncoordinated'})",
        )
    finally:
        for c in consumers:
            c.shutdown()


def test_config_in_a_coordinated_group_refuses_two_members_listing_one_queue(
    cluster: actors.Cluster,
) -> None:
    topic = "EveryStrategy"
    cluster.admin.create_topic(topic, 3, 3)
    queues = queues_of(cluster, topic)
    first, _ = start(
        cluster,
        "g-config-overlap",
        topic,
        ["r1"],
        True,
        rebalance_strategy="config",
        rebalance_options={"queues": queues[:2]},
    )
    try:
        with pytest.raises(InvalidConfigError, match="one owner") as info:
            start(
                cluster,
                "g-config-overlap",
                topic,
                ["r1"],
                True,
                rebalance_strategy="config",
                rebalance_options={"queues": queues[1:3]},
            )
        assert "coordinated=False" in str(info.value)
    finally:
        for c in first:
            c.shutdown()
