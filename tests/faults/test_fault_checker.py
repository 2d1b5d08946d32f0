"""The fault checker's verdicts on made-up histories (no Ray, no namespaces): torn
transactions and split brains against the brokers' role history."""

from __future__ import annotations

from checker import (
    ABORTED,
    ACK,
    Look,
    Op,
    Write,
    offsets_moved_back,
    split_brains,
    torn_transactions,
)


def txn(first: int, outcome: str, n: int = 3) -> Op:
    return Op(tuple(f"t-{first + i}" for i in range(n)), 0.0, 1.0, outcome)


def test_a_transaction_is_read_whole_or_not_at_all_as_its_outcome_says() -> None:
    txns = [
        txn(0, ACK),  # committed, read whole: fine
        txn(10, ACK),  # committed, one body missing: torn
        txn(20, ABORTED),  # aborted, nothing read: fine
        txn(30, ABORTED),  # aborted, one read: torn
        txn(40, "TimeoutError"),  # unknown end, nothing read: fine
        txn(50, "TimeoutError"),  # unknown end, whole: fine
        txn(60, "TimeoutError"),  # unknown end, in part: torn
    ]
    read = ["t-0", "t-1", "t-2", "t-10", "t-11", "t-30", "t-50", "t-51", "t-52", "t-61"]
    torn = torn_transactions(txns, read)
    assert [t.split("..")[0] for t in torn] == ["t-10", "t-30", "t-60"]
    assert "2 of 3 read" in torn[0]


def writes(host: str, times: list[float], queue: str = "broker-a:0") -> list[Write]:
    return [Write(queue, host, t, t + 0.01) for t in times]


def test_a_failover_and_a_failback_in_new_epochs_are_no_split_brain() -> None:
    history = [
        Look(0.0, "broker-a-0", "10.0.0.1", True, 1),
        Look(0.0, "broker-a-1", "10.0.0.2", False, 1),
        Look(5.0, "broker-a-1", "10.0.0.2", True, 2),
        Look(9.0, "broker-a-0", "10.0.0.1", True, 3),
    ]
    w = writes("10.0.0.1", [1, 2, 3]) + writes("10.0.0.2", [5, 6, 7]) + writes("10.0.0.1", [9])
    assert split_brains(w, history) == []


def test_two_hosts_taking_one_queues_writes_at_once_is_a_split_brain() -> None:
    history = [
        Look(0.0, "broker-a-0", "10.0.0.1", True, 1),
        Look(5.0, "broker-a-1", "10.0.0.2", True, 2),
    ]
    # the old master goes on acknowledging in its old epoch after the new one took over
    w = writes("10.0.0.1", [1, 2, 6.5]) + writes("10.0.0.2", [5, 6, 7])
    found = split_brains(w, history)
    assert len(found) == 1 and "10.0.0.1 (epoch 1)" in found[0] and "10.0.0.2" in found[0]
    # other queues, or one host alone, are not
    assert (
        split_brains(writes("10.0.0.1", [1, 6.5]) + writes("10.0.0.2", [5], "b:1"), history) == []
    )


def test_a_write_belongs_to_the_stretch_its_host_led_in_not_the_nearest_change() -> None:
    """The role history records changes, sampled: a host that led (epoch 3), stepped
    down, and leads again (epoch 5) after another (epoch 4) did, has its writes just
    before stepping down in epoch 3, however near its look of epoch 5 is; and its first
    writes of epoch 5, answered a moment before the sampled look saw it lead, in 5."""
    history = [
        Look(10.0, "broker-a-0", "10.0.0.1", True, 3),
        Look(50.0, "broker-a-0", "10.0.0.1", False, 3),
        Look(50.5, "broker-a-1", "10.0.0.2", True, 4),
        Look(59.9, "broker-a-1", "10.0.0.2", False, 4),
        Look(60.3, "broker-a-0", "10.0.0.1", True, 5),
    ]
    w = (
        writes("10.0.0.1", [11, 30, 49.5])
        + writes("10.0.0.2", [51, 55, 59.5])
        + writes("10.0.0.1", [60.1, 65, 70])  # the first a moment before its look
    )
    assert split_brains(w, history) == []
    # the old leader acknowledging in epoch 3 while epoch 4 leads is one
    found = split_brains(w + writes("10.0.0.1", [52]), history)
    assert len(found) == 1 and "10.0.0.1 (epoch 3)" in found[0] and "(epoch 4)" in found[0]


def test_committed_offsets_moving_back_are_violations_unless_a_fault_excuses_them() -> None:
    looks = [
        ("b:0", 10, 1.0),
        ("b:0", 20, 2.0),
        ("b:0", 15, 3.0),  # back, during a failover at 2.5
        ("b:0", 30, 4.0),
        ("b:0", 25, 6.0),  # back, no fault
        ("b:1", 5, 1.0),
        ("b:1", 5, 2.0),  # the same: fine
    ]
    bad, allowed = offsets_moved_back(looks, lambda q, hi, lo: hi < 2.5 <= lo)
    assert allowed == ["b:0: 20 at 2.0 -> 15 at 3.0"]
    assert bad == ["b:0: 30 at 4.0 -> 25 at 6.0"]


def test_the_grpc_doors_copies_are_allowed_where_the_idempotent_producers_are_not() -> None:
    # the official client sends again after a refusal (a slave that did not confirm in
    # time), with the same message id: RocketMQ keeps both copies, and so does RayMQ
    from benchmarks.faults.runner import Result
    from benchmarks.faults.schedule import Plan

    def verdict(idempotent: bool, twice: list[str]) -> list[str]:
        plan = Plan(2, "SYNC_MASTER", idempotent, ["n1", "n2", "n3"], [])
        return Result(plan, duplicated=twice).violations

    assert verdict(True, ["g-00001131", "g-00001132"]) == []
    assert verdict(True, ["g-00001131", "m-00000007"]) == ["1 duplicated by an idempotent producer"]
    assert verdict(False, ["m-00000007"]) == []


def test_offsets_read_back_lower_while_a_leader_stepped_down_and_none_was_seen_are_excused() -> (
    None
):
    # seed 3 (Raft): the leader stopped leading at 1.3 s, offsets were read lower at 5 s
    # from a member that had not copied the latest commits, and the next leader was seen
    # only at 7.9 s: a failover under way, which the guarantees allow
    from benchmarks.faults.runner import Run
    from benchmarks.faults.schedule import Plan

    run = Run(Plan(3, "RAFT", True, ["n1", "n2", "n3"], []))
    run.brokers = [
        {"name": "broker-a", "ip": f"10.0.0.{i}", "node": f"node-n{i}"} for i in (1, 2, 3)
    ]
    roles = [
        Look(0.0, "broker-a-1", "10.0.0.2", True, 2),
        Look(1.3, "broker-a-1", "10.0.0.2", False, 2),
        Look(7.9, "broker-a-0", "10.0.0.1", True, 3),
    ]
    excused = run.offsets_excused(roles)
    assert excused("broker-a:2", 0.3, 5.0)
    steady = run.offsets_excused(roles[:1])
    assert not steady("broker-a:2", 0.3, 5.0)


def test_offsets_read_back_lower_while_the_client_was_cut_off_from_the_master_are_excused() -> None:
    # seed 6 (SYNC_MASTER): a split put the master's node n1 away from the client and the
    # head at 7 s; at 15 s the client read the committed offsets from the slave on n2,
    # whose copy of the master's table was a sync behind; no member changed roles
    from benchmarks.faults.runner import Event, Run
    from benchmarks.faults.schedule import Fault, Plan

    split = Fault("split", 7.0, 12.0, {"minority": ["n1", "n3"], "majority": ["a", "client", "n2"]})
    run = Run(Plan(6, "SYNC_MASTER", False, ["n1", "n2", "n3"], [split]))
    run.brokers = [
        {"name": "broker-a", "ip": f"10.0.0.{i}", "node": f"node-n{i}"} for i in (1, 2, 3)
    ]
    roles = [Look(0.0, "broker-a-0", "10.0.0.1", True, 0)]
    run.events = [Event(split, 7.0, 19.0)]
    excused = run.offsets_excused(roles)
    assert excused("broker-a:0", 6.9, 15.0)
    assert not excused("broker-a:0", 1.0, 5.0)  # before the split: a violation
    # a split that leaves the master with the client and the head excuses nothing
    kept = Fault("split", 7.0, 12.0, {"minority": ["n2", "n3"], "majority": ["a", "client", "n1"]})
    run.events = [Event(kept, 7.0, 19.0)]
    assert not run.offsets_excused(roles)("broker-a:0", 6.9, 15.0)
