"""Every strategy rejects empty or malformed inputs the same way, and gives a
consumer that is not a member nothing, as RocketMQ's
AbstractAllocateMessageQueueStrategy does."""

import pytest

from rebalance import (
    STRATEGY_NAMES,
    AllocateStrategy,
    MessageQueue,
    assign,
    get_strategy,
)

MQ_ALL = [MessageQueue("t", "r@b", i) for i in range(3)]
CID_ALL = ["c1", "c2"]


def build(name: str) -> AllocateStrategy:
    options: dict[str, dict[str, object]] = {
        "machine_room": {"consumer_idcs": {"r"}},
        "machine_room_nearby": {
            "inner": "averagely",
            "broker_room": lambda mq: "r",
            "consumer_room": lambda cid: "r",
        },
        "config": {"queues": MQ_ALL},
    }
    return get_strategy(name, **options.get(name, {}))


@pytest.fixture(params=STRATEGY_NAMES)
def strategy(request: pytest.FixtureRequest) -> AllocateStrategy:
    return build(request.param)


def test_empty_current_id(strategy: AllocateStrategy) -> None:
    with pytest.raises(ValueError, match="current_cid is empty"):
        strategy.allocate("g", "", MQ_ALL, CID_ALL)


def test_empty_queue_list(strategy: AllocateStrategy) -> None:
    with pytest.raises(ValueError, match="mq_all is empty"):
        strategy.allocate("g", "c1", [], CID_ALL)
    with pytest.raises(ValueError, match="mq_all is empty"):
        assign(strategy, "g", [], CID_ALL)


def test_empty_consumer_list(strategy: AllocateStrategy) -> None:
    with pytest.raises(ValueError, match="cid_all is empty"):
        strategy.allocate("g", "c1", MQ_ALL, [])
    with pytest.raises(ValueError, match="cid_all is empty"):
        assign(strategy, "g", MQ_ALL, [])


def test_current_id_not_a_member_gets_nothing(strategy: AllocateStrategy) -> None:
    assert strategy.allocate("g", "c9", MQ_ALL, CID_ALL) == []


def test_duplicate_consumer_ids(strategy: AllocateStrategy) -> None:
    with pytest.raises(ValueError, match=r"duplicate consumer ids: \['c1'\]"):
        strategy.allocate("g", "c1", MQ_ALL, ["c1", "c2", "c1"])


def test_empty_consumer_id_in_the_list(strategy: AllocateStrategy) -> None:
    with pytest.raises(ValueError, match="empty consumer id"):
        strategy.allocate("g", "c1", MQ_ALL, ["c1", ""])


def test_duplicate_queues_count_once(strategy: AllocateStrategy) -> None:
    assert strategy.allocate("g", "c1", MQ_ALL * 2, CID_ALL) == strategy.allocate(
        "g", "c1", MQ_ALL, CID_ALL
    )


@pytest.mark.parametrize(
    ("current_cid", "mq_all", "cid_all", "match"),
    [
        (None, MQ_ALL, CID_ALL, "current_cid"),
        ("c1", MQ_ALL, "c1", "cid_all"),
        ("c1", MQ_ALL, ["c1", 2], "cid_all"),
        ("c1", MQ_ALL[0], CID_ALL, "mq_all"),
        ("c1", ["t/r@b/0"], CID_ALL, "mq_all"),
    ],
)
def test_wrong_types(
    strategy: AllocateStrategy,
    current_cid: object,
    mq_all: object,
    cid_all: object,
    match: str,
) -> None:
    with pytest.raises(TypeError, match=match):
        strategy.allocate("g", current_cid, mq_all, cid_all)  # type: ignore[arg-type]
