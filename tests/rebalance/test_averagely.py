"""'averagely' gives each consumer one contiguous block, the first n % c one more."""

from rebalance import MessageQueue, assign, get_strategy


def queues(count: int) -> list[MessageQueue]:
    return [MessageQueue("topic", "brokerName", i) for i in range(count)]


def consumers(count: int) -> list[str]:
    return [f"CID_PREFIX{i}" for i in range(count)]


def ids(share: list[MessageQueue]) -> list[int]:
    return [mq.queue_id for mq in share]


def test_rocketmq_scenario_ten_queues_four_consumers() -> None:
    strategy = get_strategy("averagely")
    shares = [strategy.allocate("", cid, queues(10), consumers(4)) for cid in consumers(4)]
    assert [len(share) for share in shares] == [3, 3, 2, 2]
    assert [ids(share) for share in shares] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]


def test_fewer_queues_than_consumers_leaves_the_last_consumers_idle() -> None:
    shares = assign("averagely", "g", queues(2), consumers(4))
    assert {cid: ids(share) for cid, share in shares.items()} == {
        "CID_PREFIX0": [0],
        "CID_PREFIX1": [1],
        "CID_PREFIX2": [],
        "CID_PREFIX3": [],
    }


def test_blocks_follow_the_sorted_order_not_the_given_order() -> None:
    given = list(reversed(queues(5)))
    shares = assign("averagely", "g", given, ["b", "a"])
    assert {cid: ids(share) for cid, share in shares.items()} == {
        "a": [0, 1, 2],
        "b": [3, 4],
    }


def test_consumer_ids_sort_as_java_strings() -> None:
    # RocketMQ 5's own output for these inputs: U+10000 sorts before U+FF5A.
    shares = assign("averagely", "g", queues(3), ["\uff5a", "\U00010000"])
    assert {cid: ids(share) for cid, share in shares.items()} == {
        "\U00010000": [0, 1],
        "\uff5a": [2],
    }
