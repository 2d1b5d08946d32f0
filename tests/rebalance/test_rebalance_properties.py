"""Properties of every strategy over generated groups: each eligible queue has
exactly one owner, and the result depends only on the sets of queues and ids."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalance import AllocateStrategy, MessageQueue, assign, get_strategy

# "@" and "-" shape machine rooms; é and U+10000 exercise Java's string order.
ALPHABET = "ab@-é\U00010000"
names = st.text(alphabet=ALPHABET, min_size=1, max_size=4)
message_queues = st.builds(MessageQueue, st.sampled_from(["t1", "t2"]), names, st.integers(0, 8))
queue_lists = st.lists(message_queues, min_size=1, max_size=30)
consumer_lists = st.lists(names, min_size=1, max_size=8, unique=True)
fast = settings(max_examples=50, deadline=None)

SPREADING = ["averagely", "circle", "consistent_hash"]


def owners(shares: dict[str, list[MessageQueue]]) -> dict[MessageQueue, str]:
    """Queue -> owner, failing if any queue has two owners."""
    result: dict[MessageQueue, str] = {}
    for cid, share in shares.items():
        assert len(share) == len(set(share)), f"{cid} holds a queue twice"
        for mq in share:
            assert mq not in result, f"{mq} owned by {result[mq]} and {cid}"
            result[mq] = cid
    return result


def check_order_independent(
    strategy: AllocateStrategy,
    mq_all: list[MessageQueue],
    cid_all: list[str],
    data: st.DataObject,
) -> dict[str, list[MessageQueue]]:
    shares = assign(strategy, "g", mq_all, cid_all)
    assert list(shares) == sorted(shares, key=lambda cid: cid.encode("utf-16-be"))
    shuffled_mqs = data.draw(st.permutations(mq_all + mq_all[:3]))
    shuffled_cids = data.draw(st.permutations(cid_all))
    assert assign(strategy, "g", shuffled_mqs, shuffled_cids) == shares
    for cid in cid_all:
        assert strategy.allocate("g", cid, shuffled_mqs, shuffled_cids) == shares[cid]
    return shares


@pytest.mark.parametrize("name", SPREADING)
@fast
@given(mq_all=queue_lists, cid_all=consumer_lists, data=st.data())
def test_spreading_strategies_own_every_queue_once(
    name: str, mq_all: list[MessageQueue], cid_all: list[str], data: st.DataObject
) -> None:
    shares = check_order_independent(get_strategy(name), mq_all, cid_all, data)
    assert set(owners(shares)) == set(mq_all)


@pytest.mark.parametrize("name", ["averagely", "circle"])
@fast
@given(mq_all=queue_lists, cid_all=consumer_lists)
def test_even_strategies_differ_by_at_most_one_queue(
    name: str, mq_all: list[MessageQueue], cid_all: list[str]
) -> None:
    sizes = [len(share) for share in assign(name, "g", mq_all, cid_all).values()]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


@fast
@given(
    mq_all=queue_lists,
    cid_all=consumer_lists,
    virtual_nodes=st.integers(1, 12),
    newcomer=names,
    data=st.data(),
)
def test_consistent_hash_moves_only_what_it_must(
    mq_all: list[MessageQueue],
    cid_all: list[str],
    virtual_nodes: int,
    newcomer: str,
    data: st.DataObject,
) -> None:
    strategy = get_strategy("consistent_hash", virtual_nodes=virtual_nodes)
    before = owners(assign(strategy, "g", mq_all, cid_all))
    if len(cid_all) > 1:
        leaver = data.draw(st.sampled_from(cid_all))
        remaining = [cid for cid in cid_all if cid != leaver]
        after = owners(assign(strategy, "g", mq_all, remaining))
        assert all(after[mq] == cid for mq, cid in before.items() if cid != leaver)
    if newcomer not in cid_all:
        after = owners(assign(strategy, "g", mq_all, [*cid_all, newcomer]))
        assert all(cid in (before[mq], newcomer) for mq, cid in after.items())


def eligible(mq: MessageQueue, rooms: set[str]) -> bool:
    """<room>@<broker> as Java's split reads it: trailing '@'s are dropped."""
    match = re.fullmatch(r"([^@]*)@([^@]+)@*", mq.broker_name)
    return match is not None and match.group(1) in rooms


@fast
@given(
    mq_all=queue_lists,
    cid_all=consumer_lists,
    rooms=st.sets(st.text(alphabet=ALPHABET, max_size=2), min_size=1, max_size=3),
    data=st.data(),
)
def test_machine_room_owns_exactly_the_eligible_queues_once(
    mq_all: list[MessageQueue], cid_all: list[str], rooms: set[str], data: st.DataObject
) -> None:
    strategy = get_strategy("machine_room", consumer_idcs=rooms)
    shares = check_order_independent(strategy, mq_all, cid_all, data)
    assert set(owners(shares)) == {mq for mq in mq_all if eligible(mq, rooms)}


ROOMS = ["r1", "r2", "r3", "r4"]
room_queues = st.lists(
    st.builds(
        MessageQueue,
        st.just("t"),
        st.builds("{}-{}".format, st.sampled_from(ROOMS), names),
        st.integers(0, 5),
    ),
    min_size=1,
    max_size=30,
)
room_consumers = st.lists(
    st.builds("{}-{}".format, st.sampled_from(ROOMS[:3]), names),
    min_size=1,
    max_size=8,
    unique=True,
)


def room_of(name: str) -> str:
    return name.split("-", 1)[0]


@fast
@given(
    inner=st.sampled_from(SPREADING),
    mq_all=room_queues,
    cid_all=room_consumers,
    data=st.data(),
)
def test_machine_room_nearby_keeps_queues_in_rooms_with_consumers(
    inner: str, mq_all: list[MessageQueue], cid_all: list[str], data: st.DataObject
) -> None:
    strategy = get_strategy(
        "machine_room_nearby",
        inner=inner,
        broker_room=lambda mq: room_of(mq.broker_name),
        consumer_room=room_of,
    )
    owner = owners(check_order_independent(strategy, mq_all, cid_all, data))
    assert set(owner) == set(mq_all)
    consumer_rooms = {room_of(cid) for cid in cid_all}
    for mq, cid in owner.items():
        if room_of(mq.broker_name) in consumer_rooms:
            assert room_of(cid) == room_of(mq.broker_name)


@fast
@given(
    configured=st.lists(message_queues, min_size=1, max_size=5, unique=True),
    mq_all=queue_lists,
    cid_all=consumer_lists,
)
def test_config_gives_everyone_the_configured_queues(
    configured: list[MessageQueue], mq_all: list[MessageQueue], cid_all: list[str]
) -> None:
    shares = assign(get_strategy("config", queues=configured), "g", mq_all, cid_all)
    assert shares == {cid: configured for cid in cid_all}
