"""assign() gives every member exactly what its own allocate() would."""

from collections.abc import Iterable

import pytest

from rebalance import MessageQueue, assign, get_strategy

MQ_ALL = [MessageQueue("t", broker, i) for broker in ("a", "b") for i in range(4)]


def test_by_name_and_by_object_agree_and_keys_are_sorted() -> None:
    by_name = assign("circle", "g", MQ_ALL, ["c3", "c1", "c2"])
    assert list(by_name) == ["c1", "c2", "c3"]
    assert by_name == assign(get_strategy("circle"), "g", MQ_ALL, ["c1", "c2", "c3"])


@pytest.mark.parametrize("name", ["averagely", "circle", "consistent_hash"])
def test_each_share_is_the_members_own_allocation(name: str) -> None:
    strategy = get_strategy(name)
    cid_all = ["x", "y", "z"]
    shares = assign(strategy, "g", MQ_ALL, cid_all)
    assert shares == {cid: strategy.allocate("g", cid, MQ_ALL, cid_all) for cid in cid_all}


class FirstMemberTakesAll:
    """A user-written strategy: only needs ``name`` and ``allocate``."""

    name = "first_takes_all"

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Iterable[MessageQueue],
        cid_all: Iterable[str],
    ) -> list[MessageQueue]:
        return list(mq_all) if current_cid == min(cid_all) else []


def test_accepts_any_object_with_name_and_allocate() -> None:
    shares = assign(FirstMemberTakesAll(), "g", reversed(MQ_ALL), ["b", "a"])
    assert shares == {"a": sorted(MQ_ALL), "b": []}


def test_rejects_what_is_not_a_strategy() -> None:
    with pytest.raises(TypeError, match="strategy"):
        assign(42, "g", MQ_ALL, ["a"])  # type: ignore[arg-type]


def test_needs_options_strategies_as_objects() -> None:
    with pytest.raises(TypeError, match="needs option"):
        assign("machine_room", "g", MQ_ALL, ["a"])
