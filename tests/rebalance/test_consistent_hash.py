"""'consistent_hash' routes each queue to the next consumer point on an MD5 ring."""

import hashlib

import pytest

from rebalance import MessageQueue, assign, get_strategy
from rebalance._hash import md5_hash


def queues(count: int) -> list[MessageQueue]:
    return [MessageQueue("topic_test", "brokerName", i) for i in range(count)]


def consumers(count: int) -> list[str]:
    return [f"CID-{i}" for i in range(count)]


def ring_position(text: str) -> int:
    """RocketMQ's MD5Hash, restated: first four digest bytes, unsigned big-endian."""
    digest = hashlib.md5(text.encode("utf-8")).digest()
    return (digest[0] << 24) | (digest[1] << 16) | (digest[2] << 8) | digest[3]


def expected_owner(mq: MessageQueue, cid_all: list[str], virtual_nodes: int) -> str:
    points = sorted(
        (ring_position(f"{cid}-{i}"), cid) for cid in cid_all for i in range(virtual_nodes)
    )
    key = ring_position(
        f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"
    )
    return next((cid for position, cid in points if position >= key), points[0][1])


def owners(shares: dict[str, list[MessageQueue]]) -> dict[MessageQueue, str]:
    return {mq: cid for cid, share in shares.items() for mq in share}


@pytest.mark.parametrize(("queue_count", "consumer_count"), [(10, 4), (20, 10)])
@pytest.mark.parametrize("virtual_nodes", [1, 3, 10])
def test_owner_is_the_next_point_on_the_md5_ring(
    queue_count: int, consumer_count: int, virtual_nodes: int
) -> None:
    mq_all, cid_all = queues(queue_count), consumers(consumer_count)
    strategy = get_strategy("consistent_hash", virtual_nodes=virtual_nodes)
    for mq, cid in owners(assign(strategy, "g", mq_all, cid_all)).items():
        assert cid == expected_owner(mq, cid_all, virtual_nodes)


def test_owners_equal_rocketmq_5() -> None:
    # Printed by RocketMQ 5's AllocateMessageQueueConsistentHash (default 10
    # virtual nodes) for these inputs.
    shares = assign("consistent_hash", "g", queues(10), consumers(4))
    assert {cid: [mq.queue_id for mq in share] for cid, share in shares.items()} == {
        "CID-0": [1],
        "CID-1": [],
        "CID-2": [0, 3, 4, 5, 8],
        "CID-3": [2, 6, 7, 9],
    }


def test_a_digest_with_the_high_bit_set_stays_unsigned() -> None:
    key = next(f"k{i}" for i in range(1000) if hashlib.md5(f"k{i}".encode()).digest()[0] >= 0x80)
    assert md5_hash(key) == ring_position(key) >= 2**31


@pytest.mark.parametrize(("queue_count", "consumer_count"), [(20, 10), (10, 20)])
def test_rocketmq_scenario_remove_then_add_a_consumer(
    queue_count: int, consumer_count: int
) -> None:
    strategy = get_strategy("consistent_hash", virtual_nodes=3)
    mq_all, cid_all = queues(queue_count), consumers(consumer_count)
    before = owners(assign(strategy, "testConsumerGroup", mq_all, cid_all))
    assert set(before) == set(mq_all)

    removed = cid_all[0]
    after_remove = owners(assign(strategy, "testConsumerGroup", mq_all, cid_all[1:]))
    assert set(after_remove) == set(mq_all)
    for mq, cid in before.items():
        if cid != removed:
            assert after_remove[mq] == cid, f"{mq} moved though {cid} stayed"

    added = "CID-NEW"
    after_add = owners(assign(strategy, "testConsumerGroup", mq_all, [*cid_all[1:], added]))
    assert set(after_add) == set(mq_all)
    for mq, cid in after_add.items():
        if cid != added:
            assert cid == after_remove[mq], f"{mq} moved to {cid}, not to {added}"


def test_allocate_matches_assign() -> None:
    strategy = get_strategy("consistent_hash")
    mq_all, cid_all = queues(30), consumers(7)
    shares = assign(strategy, "g", mq_all, cid_all)
    for cid in cid_all:
        assert strategy.allocate("g", cid, mq_all, cid_all) == shares[cid]


@pytest.mark.parametrize(
    ("virtual_nodes", "error"), [(0, ValueError), (-1, ValueError), ("10", TypeError)]
)
def test_rejects_bad_virtual_nodes(virtual_nodes: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="virtual_nodes"):
        get_strategy("consistent_hash", virtual_nodes=virtual_nodes)
