"""'circle' deals the sorted queues round robin to the sorted consumers."""

from rebalance import MessageQueue, get_strategy


def test_rocketmq_scenario_ten_queues_four_consumers() -> None:
    mq_all = [MessageQueue("topic", "brokerName", i) for i in range(10)]
    cid_all = [f"CID_PREFIX{i}" for i in range(4)]
    strategy = get_strategy("circle")

    assert strategy.allocate("", "CID_PREFIX", mq_all, cid_all) == []
    shares = {
        cid: [mq.queue_id for mq in strategy.allocate("", cid, mq_all, cid_all)] for cid in cid_all
    }
    assert shares == {
        "CID_PREFIX0": [0, 4, 8],
        "CID_PREFIX1": [1, 5, 9],
        "CID_PREFIX2": [2, 6],
        "CID_PREFIX3": [3, 7],
    }


def test_neighbouring_queues_of_several_brokers_go_to_different_consumers() -> None:
    mq_all = [MessageQueue("t", broker, i) for broker in ("a", "b") for i in range(2)]
    strategy = get_strategy("circle")
    assert strategy.allocate("g", "c1", mq_all, ["c2", "c1"]) == [
        MessageQueue("t", "a", 0),
        MessageQueue("t", "b", 0),
    ]
