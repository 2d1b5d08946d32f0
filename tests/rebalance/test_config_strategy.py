"""'config' gives every member the configured queues."""

import pytest

from rebalance import MessageQueue, assign, get_strategy


def test_rocketmq_scenario_everyone_gets_the_list() -> None:
    mq_all = [MessageQueue("topic", "brokerName", i) for i in range(4)]
    strategy = get_strategy("config", queues=mq_all)
    shares = assign(strategy, "g", mq_all, ["CID_PREFIX0", "CID_PREFIX1"])
    assert shares == {"CID_PREFIX0": mq_all, "CID_PREFIX1": mq_all}


def test_keeps_the_configured_order_and_ignores_the_groups_queues() -> None:
    configured = [MessageQueue("t", "b", 3), MessageQueue("t", "a", 1)]
    strategy = get_strategy("config", queues=configured)
    assert strategy.allocate("g", "c", [MessageQueue("x", "y", 0)], ["c"]) == configured


def test_a_non_member_gets_nothing() -> None:
    mq = MessageQueue("t", "b", 0)
    assert get_strategy("config", queues=[mq]).allocate("g", "x", [mq], ["c"]) == []


@pytest.mark.parametrize(
    ("queues", "error"),
    [
        ([], ValueError),
        ([MessageQueue("t", "b", 0)] * 2, ValueError),
        (["t/b/0"], TypeError),
        (MessageQueue("t", "b", 0), TypeError),
    ],
)
def test_rejects_bad_queues(queues: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="queues"):
        get_strategy("config", queues=queues)
