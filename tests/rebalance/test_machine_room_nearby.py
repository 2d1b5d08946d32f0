"""'machine_room_nearby': consumers take their own room's queues; rooms without
consumers are shared by everyone. Set up as RocketMQ's AllocateMachineRoomNearByTest:
brokers "IDC<k>-brokerName", consumers "IDC<k>-CID-<i>", the room before the dash.
"""

import pytest

from rebalance import AllocateStrategy, MessageQueue, assign, get_strategy


def room_of(name: str) -> str:
    return name.split("-", 1)[0]


def nearby(inner: AllocateStrategy | str = "averagely") -> AllocateStrategy:
    return get_strategy(
        "machine_room_nearby",
        inner=inner,
        broker_room=lambda mq: room_of(mq.broker_name),
        consumer_room=room_of,
    )


def queues(rooms: int, per_room: int) -> list[MessageQueue]:
    return [
        MessageQueue("topic_test", f"IDC{room}-brokerName", i)
        for room in range(1, rooms + 1)
        for i in range(per_room)
    ]


def consumers(rooms: int, per_room: int) -> list[str]:
    return [f"IDC{room}-CID-{i}" for room in range(1, rooms + 1) for i in range(per_room)]


def owners(shares: dict[str, list[MessageQueue]]) -> dict[MessageQueue, str]:
    result: dict[MessageQueue, str] = {}
    for cid, share in shares.items():
        for mq in share:
            assert mq not in result, f"{mq} owned by {result[mq]} and {cid}"
            result[mq] = cid
    return result


@pytest.mark.parametrize("consumers_per_room", [10, 20, 30])
def test_same_rooms_every_queue_stays_in_its_room(consumers_per_room: int) -> None:
    mq_all = queues(5, 20)
    shares = assign(nearby(), "Test-C-G", mq_all, consumers(5, consumers_per_room))
    owner = owners(shares)
    assert set(owner) == set(mq_all)
    for mq, cid in owner.items():
        assert room_of(mq.broker_name) == room_of(cid)


@pytest.mark.parametrize("consumers_per_room", [5, 10, 20])
def test_consumers_in_more_rooms_still_keep_queues_in_their_room(
    consumers_per_room: int,
) -> None:
    mq_all = queues(5, 10)
    cid_all = consumers(6, consumers_per_room)
    shares = assign(nearby(), "Test-C-G", mq_all, cid_all)
    owner = owners(shares)
    assert set(owner) == set(mq_all)
    for mq, cid in owner.items():
        assert room_of(mq.broker_name) == room_of(cid)
    assert all(not share for cid, share in shares.items() if room_of(cid) == "IDC6")


@pytest.mark.parametrize("consumers_per_room", [5, 10, 20])
def test_consumers_in_fewer_rooms_share_the_rooms_without_consumers(
    consumers_per_room: int,
) -> None:
    mq_all = queues(5, 10)
    cid_all = consumers(3, consumers_per_room)
    owner = owners(assign(nearby(), "Test-C-G", mq_all, cid_all))
    assert set(owner) == set(mq_all)
    for mq, cid in owner.items():
        if room_of(mq.broker_name) in {"IDC1", "IDC2", "IDC3"}:
            assert room_of(mq.broker_name) == room_of(cid)
        else:
            # An orphan room's 10 queues split averagely over all the (>= 10)
            # consumers: queue i goes to the i-th consumer id.
            assert cid == sorted(cid_all)[mq.queue_id]


def test_exact_shares_own_room_first_then_orphan_rooms_in_room_order() -> None:
    mq_all = [
        *[MessageQueue("t", "A-b", i) for i in range(3)],
        *[MessageQueue("t", "C-b", i) for i in range(2)],
        *[MessageQueue("t", "B-b", i) for i in range(2)],
    ]
    shares = assign(nearby(), "g", mq_all, ["A-2", "A-1", "D-1"])
    as_text = {
        cid: [f"{mq.broker_name}:{mq.queue_id}" for mq in share] for cid, share in shares.items()
    }
    # A's queues stay in A (averagely over ); B and C have no consumer,
    # so each is split over all three, B before C.
    assert as_text == {
        "A-1": ["A-b:0", "A-b:1", "B-b:0", "C-b:0"],
        "A-2": ["A-b:2", "B-b:1", "C-b:1"],
        "D-1": [],
    }


def test_inner_strategy_by_name_or_object_agree() -> None:
    mq_all, cid_all = queues(3, 7), consumers(2, 3)
    by_name = assign(nearby("circle"), "g", mq_all, cid_all)
    by_object = assign(nearby(get_strategy("circle")), "g", mq_all, cid_all)
    assert by_name == by_object
    assert by_name != assign(nearby("averagely"), "g", mq_all, cid_all)


def test_allocate_matches_assign() -> None:
    strategy = nearby("consistent_hash")
    mq_all, cid_all = queues(4, 9), consumers(2, 3)
    shares = assign(strategy, "g", mq_all, cid_all)
    for cid in cid_all:
        assert strategy.allocate("g", cid, mq_all, cid_all) == shares[cid]


@pytest.mark.parametrize(
    ("broker_room", "error"),
    [(lambda mq: "", ValueError), (lambda mq: None, TypeError)],
)
def test_rejects_a_queue_without_a_room(broker_room: object, error: type[Exception]) -> None:
    strategy = get_strategy(
        "machine_room_nearby",
        inner="averagely",
        broker_room=broker_room,
        consumer_room=room_of,
    )
    with pytest.raises(error, match="broker_room"):
        strategy.allocate("g", "A-1", [MessageQueue("t", "A-b", 0)], ["A-1"])


def test_rejects_a_consumer_without_a_room() -> None:
    strategy = get_strategy(
        "machine_room_nearby",
        inner="averagely",
        broker_room=lambda mq: "A",
        consumer_room=lambda cid: "",
    )
    with pytest.raises(ValueError, match="consumer_room"):
        strategy.allocate("g", "A-1", [MessageQueue("t", "A-b", 0)], ["A-1"])


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        (
            {"inner": 3, "broker_room": room_of, "consumer_room": room_of},
            TypeError,
            "inner",
        ),
        (
            {"inner": "nope", "broker_room": room_of, "consumer_room": room_of},
            ValueError,
            "nope",
        ),
        (
            {"inner": "circle", "broker_room": "A", "consumer_room": room_of},
            TypeError,
            "broker_room",
        ),
        ({"inner": "circle", "broker_room": room_of}, TypeError, "consumer_room"),
    ],
)
def test_rejects_bad_options(
    options: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        get_strategy("machine_room_nearby", **options)
