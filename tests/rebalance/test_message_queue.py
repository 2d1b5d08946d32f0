"""MessageQueue is a frozen value ordered as RocketMQ orders queues."""

import dataclasses

import pytest

from rebalance import MessageQueue


def test_equal_fields_are_the_same_queue() -> None:
    assert MessageQueue("t", "b", 1) == MessageQueue("t", "b", 1)
    assert len({MessageQueue("t", "b", 1), MessageQueue("t", "b", 1)}) == 1


def test_is_frozen() -> None:
    mq = MessageQueue("t", "b", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mq.queue_id = 2  # type: ignore[misc]


def test_orders_by_topic_then_broker_then_queue_id() -> None:
    queues = [
        MessageQueue("b", "a", 0),
        MessageQueue("a", "b", 0),
        MessageQueue("a", "a", 10),
        MessageQueue("a", "a", 2),
    ]
    assert sorted(queues) == [
        MessageQueue("a", "a", 2),
        MessageQueue("a", "a", 10),
        MessageQueue("a", "b", 0),
        MessageQueue("b", "a", 0),
    ]
    assert MessageQueue("a", "a", 2) <= MessageQueue("a", "a", 2)
    assert MessageQueue("a", "b", 0) > MessageQueue("a", "a", 9)


def test_names_compare_as_java_strings() -> None:
    # Java compares UTF-16 code units: a surrogate pair (U+10000) sorts before
    # U+FF5A, the reverse of Python's code point order.
    assert MessageQueue("t", "\U00010000", 0) < MessageQueue("t", "\uff5a", 0)


@pytest.mark.parametrize(
    ("args", "error", "field"),
    [
        (("", "b", 0), ValueError, "topic"),
        (("t", "", 0), ValueError, "broker_name"),
        (("t", "b", -1), ValueError, "queue_id"),
        ((1, "b", 0), TypeError, "topic"),
        (("t", None, 0), TypeError, "broker_name"),
        (("t", "b", "0"), TypeError, "queue_id"),
        (("t", "b", True), TypeError, "queue_id"),
    ],
)
def test_rejects_bad_fields_naming_them(
    args: tuple[object, object, object], error: type[Exception], field: str
) -> None:
    with pytest.raises(error, match=field):
        MessageQueue(*args)  # type: ignore[arg-type]
