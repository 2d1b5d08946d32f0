"""'machine_room' shares only the queues of brokers <room>@<broker> in listed rooms."""

import pytest

from rebalance import MessageQueue, assign, get_strategy, room_of_broker


def rocketmq_test_queues() -> list[MessageQueue]:
    """RocketMQ's test set-up: queues 0-4 on room1@broker-a, 5-9 on room2@broker-b."""
    return [
        MessageQueue("topic", "room1@broker-a" if i < 5 else "room2@broker-b", i) for i in range(10)
    ]


def test_rocketmq_scenario_two_consumers_in_room1() -> None:
    strategy = get_strategy("machine_room", consumer_idcs={"room1"})
    cid_all = ["CID_PREFIX0", "CID_PREFIX1"]
    shares = {
        cid: [mq.queue_id for mq in strategy.allocate("", cid, rocketmq_test_queues(), cid_all)]
        for cid in cid_all
    }
    # Blocks of e // c eligible queues, then the left-over queue to the first.
    assert shares == {"CID_PREFIX0": [0, 1, 4], "CID_PREFIX1": [2, 3]}


def test_left_over_queues_go_one_each_to_the_first_consumers() -> None:
    mq_all = [MessageQueue("t", "r@b", i) for i in range(11)]
    shares = assign(get_strategy("machine_room", consumer_idcs=["r"]), "g", mq_all, ["a", "b", "c"])
    assert {cid: [mq.queue_id for mq in share] for cid, share in shares.items()} == {
        "a": [0, 1, 2, 9],
        "b": [3, 4, 5, 10],
        "c": [6, 7, 8],
    }


@pytest.mark.parametrize(
    ("broker_name", "eligible"),
    [
        ("room1@broker", True),
        ("room2@broker", False),
        ("room1", False),  # no room part
        ("room1@a@b", False),  # three parts
        ("room1@broker@", True),  # Java's split drops the trailing empty part
        ("room1@", False),
    ],
)
def test_eligibility_follows_java_split(broker_name: str, eligible: bool) -> None:
    strategy = get_strategy("machine_room", consumer_idcs={"room1"})
    mq = MessageQueue("t", broker_name, 0)
    assert (strategy.allocate("g", "c", [mq], ["c"]) == [mq]) is eligible


def test_no_eligible_queue_gives_everyone_nothing() -> None:
    strategy = get_strategy("machine_room", consumer_idcs={"room9"})
    assert assign(strategy, "g", rocketmq_test_queues(), ["a", "b"]) == {
        "a": [],
        "b": [],
    }


@pytest.mark.parametrize(
    ("consumer_idcs", "error"),
    [("room1", TypeError), ([1], TypeError), (set(), ValueError), (None, TypeError)],
)
def test_rejects_bad_consumer_idcs(consumer_idcs: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="consumer_idcs"):
        get_strategy("machine_room", consumer_idcs=consumer_idcs)


@pytest.mark.parametrize(
    ("broker_name", "room"),
    [("room1@broker", "room1"), ("broker", None), ("room1@a@b", None), ("room1@broker@", "room1")],
)
def test_room_of_broker_reads_names_as_the_strategy_does(
    broker_name: str, room: str | None
) -> None:
    assert room_of_broker(broker_name) == room
