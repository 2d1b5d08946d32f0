"""The coordinator's bookkeeping without Ray: machine rooms, revoke deadlines, fencing
order and growing tokens, on a hand-driven clock; and which host coordinates a group."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from actors.coordinator.state import GroupState, StrategySpec
from actors.protocol.names import coordinator_actor_name, coordinator_host_names
from rebalance import MessageQueue, assign, get_strategy
from storage.errors import InvalidConfigError

AVG = StrategySpec("averagely")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fresh(queues: list[MessageQueue], revoke_timeout_s: float = 1.0) -> tuple[GroupState, Clock]:
    clock = Clock()
    state = GroupState("g", epoch=7, revoke_timeout_s=revoke_timeout_s, clock=clock)
    state.set_queues({queues[0].topic: queues})
    return state, clock


def settle_fences(state: GroupState) -> None:
    state.fence_done(state.pending_fences())


def test_machine_room_nearby_uses_each_member_s_room() -> None:
    queues = [
        MessageQueue("T", f"{room}@b{room}", q) for room in ("r1", "r2", "r3") for q in range(4)
    ]
    state, _ = fresh(queues)
    spec = StrategySpec("machine_room_nearby", {"inner": "averagely"})
    rooms = {"c1": "r1", "c2": "r1", "c3": "r2"}
    for cid, room in rooms.items():
        state.join(cid, ["T"], spec, room=room)
    with pytest.raises(InvalidConfigError, match="machine_room"):
        state.join("c4", ["T"], spec)  # no room
    state.rebalance()
    settle_fences(state)
    expected = assign(
        get_strategy(
            "machine_room_nearby",
            inner="averagely",
            broker_room=lambda mq: mq.broker_name.partition("@")[0],
            consumer_room=rooms.__getitem__,
        ),
        "g",
        queues,
        list(rooms),
    )
    assert {cid: sorted(state.view(cid).owned) for cid in rooms} == {
        cid: sorted(qs) for cid, qs in expected.items()
    }
    # the r3 queues have no consumer in their room: shared by all
    assert {q.broker_name for q in state.view("c3").owned} == {"r2@br2", "r3@br3"}


def test_machine_room_takes_the_members_rooms_as_its_consumer_idcs() -> None:
    queues = [MessageQueue("T", f"{room}@b", q) for room in ("r1", "r2") for q in range(2)]
    state, _ = fresh(queues)
    state.join("c1", ["T"], StrategySpec("machine_room"), room="r1")
    state.rebalance()
    settle_fences(state)
    assert sorted(state.view("c1").owned) == [q for q in queues if q.broker_name == "r1@b"]


def test_a_silent_owner_is_fenced_after_the_revoke_timeout_and_tokens_grow() -> None:
    queues = [MessageQueue("T", "b", q) for q in range(4)]
    state, clock = fresh(queues, revoke_timeout_s=2.0)
    state.join("a", ["T"], AVG)
    state.rebalance()
    assert state.pending_fences() and not state.view("a").owned  # first owners: fenced first
    settle_fences(state)
    first = state.view("a").owned
    assert len(first) == 4 and set(first.values()) == {(7, 1)}
    state.join("b", ["T"], AVG)
    state.rebalance()
    revoking = state.view("a").revoke
    assert len(revoking) == 2 and not state.view("b").owned
    clock.now = 1.9
    state.reconcile()
    assert not state.to_fence
    clock.now = 2.0
    state.reconcile()
    assert set(state.to_fence) == set(revoking) and not state.view("a").revoke
    fences = state.pending_fences()
    settle_fences(state)
    owned_b = state.view("b").owned
    assert set(owned_b) == set(revoking)
    assert all(owned_b[q] >= fences[q] > first[q] for q in owned_b)
    events = [(e.event, e.queue) for e in state.log if e.queue in revoking]
    for q in revoking:
        mine = [ev for ev, queue in events if queue == q]
        assert mine[-3:] == ["revoke", "fence", "assign"]


def test_a_dead_owner_s_queues_are_fenced_before_they_move_and_a_leaver_s_are_not() -> None:
    queues = [MessageQueue("T", "b", q) for q in range(4)]
    state, _ = fresh(queues)
    for cid in ("a", "b", "c"):
        state.join(cid, ["T"], AVG)
    state.rebalance()
    settle_fences(state)
    of_b = set(state.view("b").owned)
    of_c = set(state.view("c").owned)
    state.remove("b", "dead")
    state.remove("c", "leave", released=of_c)
    state.rebalance()
    assert set(state.to_fence) == of_b
    assert of_c <= set(state.view("a").owned)  # released: handed on at once
    settle_fences(state)
    assert set(state.view("a").owned) == set(queues)
    assert not state.view("b").member
    assert state.strategy == AVG
    state.remove("a", "leave", released=queues)
    assert state.strategy is None  # an empty group may change its strategy


def config(queues: list[MessageQueue]) -> StrategySpec:
    return StrategySpec("config", {"queues": queues})


def test_config_gives_each_member_the_queues_it_lists_and_refuses_a_queue_listed_twice() -> None:
    queues = [MessageQueue("T", "b", q) for q in range(4)]
    retry = [MessageQueue("%RETRY%g", "b", 0), MessageQueue("%RETRY%g", "b", 1)]
    state, _ = fresh(queues)
    state.set_queues({"%RETRY%g": retry})
    state.join("a", ["T", "%RETRY%g"], config(queues[:1]))
    state.join("b", ["T", "%RETRY%g"], config(queues[2:]))
    with pytest.raises(InvalidConfigError, match="one owner.*coordinated=False"):
        state.join("c", ["T"], config(queues[1:3]))  # queue 2 is b's
    state.rebalance()
    settle_fences(state)
    assert set(state.view("a").owned) == {queues[0], retry[0]}
    assert set(state.view("b").owned) == {*queues[2:], retry[1]}  # retry: averagely
    assert queues[1] not in state.owners, "a queue nobody lists is nobody's"
    with pytest.raises(InvalidConfigError, match="queues"):
        state.join("d", ["T"], StrategySpec("config"))


def test_a_reset_gives_every_owner_its_queues_again_above_the_reset_fence() -> None:
    queues = [MessageQueue("T", "b", q) for q in range(4)]
    state, _ = fresh(queues)
    for cid in ("a", "b"):
        state.join(cid, ["T"], AVG)
    state.rebalance()
    settle_fences(state)
    before = {cid: state.view(cid).owned for cid in ("a", "b")}
    versions = {cid: state.members[cid].version for cid in ("a", "b")}

    fence = state.begin_reset("T")
    assert all(fence > tok for owned in before.values() for tok in owned.values())
    state.join("c", ["T"], AVG)  # a member joining mid-reset is given nothing of T yet
    state.rebalance()
    for cid in ("a", "b"):
        for q in state.view(cid).revoke:
            state.confirm(cid, [q])
    state.reconcile()
    assert not state.view("c").owned, "no queue of a topic being reset is handed out"

    told = state.end_reset("T", queues)
    assert told == sorted(cid for cid in ("a", "b") if state.view(cid).owned)
    for cid in told:
        after = state.view(cid).owned
        assert all(tok >= fence and tok != before[cid].get(q) for q, tok in after.items())
        assert state.members[cid].version > versions[cid]
    assert all(state.fences[q] >= fence for q in queues)
    settle_fences(state)
    assert set(state.owners) == set(queues)
    assert [e.event for e in state.log if e.event == "reset" and e.queue is not None]


def test_a_group_s_coordinator_host_is_named_alike_in_every_process() -> None:
    """Every process maps a group to the same coordinator host (not by ``hash``, which
    differs between processes), one of the namespace's host names."""
    groups = ["billing", "g-1", "订单", "x" * 200]
    code = (
        "from actors.protocol.names import coordinator_actor_name as n\n"
        f"print([n(g) for g in {groups!r}])\n"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert seen == {str([coordinator_actor_name(g) for g in groups])}
    assert {coordinator_actor_name(g) for g in groups} <= set(coordinator_host_names())
    assert coordinator_host_names() == ["coordinators-0"]
