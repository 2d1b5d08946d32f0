"""get_strategy builds the built-in strategies by name and checks their options."""

import pytest

from rebalance import STRATEGY_NAMES, AllocateStrategy, MessageQueue, get_strategy

OPTIONS: dict[str, dict[str, object]] = {
    "averagely": {},
    "circle": {},
    "consistent_hash": {},
    "machine_room": {"consumer_idcs": {"room1"}},
    "machine_room_nearby": {
        "inner": "averagely",
        "broker_room": lambda mq: "r",
        "consumer_room": lambda cid: "r",
    },
    "config": {"queues": [MessageQueue("t", "b", 0)]},
}


def test_names_are_the_documented_ones() -> None:
    assert set(STRATEGY_NAMES) == set(OPTIONS)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_builds_each_strategy_with_its_name(name: str) -> None:
    strategy = get_strategy(name, **OPTIONS[name])
    assert isinstance(strategy, AllocateStrategy)
    assert strategy.name == name


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="'AVG'") as raised:
        get_strategy("AVG")
    for name in STRATEGY_NAMES:
        assert name in str(raised.value)


def test_name_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="name"):
        get_strategy(None)  # type: ignore[arg-type]


def test_unknown_option_is_named_with_the_accepted_ones() -> None:
    with pytest.raises(TypeError, match=r"virtual_node.*accepts virtual_nodes"):
        get_strategy("consistent_hash", virtual_node=5)
    with pytest.raises(TypeError, match="accepts no options"):
        get_strategy("averagely", virtual_nodes=5)


def test_missing_option_is_named() -> None:
    with pytest.raises(TypeError, match=r"needs option.*consumer_idcs"):
        get_strategy("machine_room")
    with pytest.raises(TypeError, match=r"needs option.*queues"):
        get_strategy("config")


def test_default_virtual_nodes_is_ten() -> None:
    assert "virtual_nodes=10" in repr(get_strategy("consistent_hash"))
