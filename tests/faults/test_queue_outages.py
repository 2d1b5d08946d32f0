"""The long runner's per-queue unavailability on made-up histories (no Ray, no
namespaces): a queue passed over while the others take writes counts, the pace of a
round robin over many queues does not."""

from __future__ import annotations

import pytest

from benchmarks.faults.runner import queue_gaps, queue_outages

QUEUES = [f"broker-{b}:{q}" for b in range(3) for q in range(4)]


def round_robin(
    seconds: float, every_s: float, down: tuple[float, float] | None = None
) -> list[tuple[float, str]]:
    """A producer taking the 12 queues in turn, one send every ``every_s``; while
    ``down`` (from, to), broker-0's queues are passed over for the next one up."""
    acks, t, turn = [], 0.0, 0
    while t < seconds:
        q = QUEUES[turn % len(QUEUES)]
        turn += 1
        if down is not None and down[0] <= t < down[1]:
            while q.startswith("broker-0:"):
                q = QUEUES[turn % len(QUEUES)]
                turn += 1
        acks.append((t, q))
        t += every_s
    return acks


def test_a_slow_round_robin_over_many_queues_is_not_unavailability() -> None:
    # 100 ms a send: each queue written every 1.2 s, all the time
    acks = round_robin(300.0, 0.1)
    assert queue_gaps(acks) == pytest.approx(300.0, abs=2.0)  # what was counted before
    assert all(spans == [] for spans in queue_outages(acks).values())


def test_a_queue_passed_over_while_the_others_take_writes_counts_its_whole_gap() -> None:
    acks = round_robin(300.0, 0.1, down=(100.0, 130.0))
    outages = queue_outages(acks)
    for q in QUEUES:
        if q.startswith("broker-0:"):
            [(a, b)] = outages[q]
            assert 99.0 <= a <= 100.0 and 130.0 <= b <= 131.2
        else:
            assert outages[q] == []


def test_a_queue_passed_over_until_the_end_counts_until_the_last_write() -> None:
    acks = round_robin(60.0, 0.1, down=(50.0, 1e9))
    [(a, b)] = queue_outages(acks)["broker-0:0"]
    assert 48.8 <= a <= 50.0 and b == acks[-1][0]


def test_the_whole_topic_stalled_is_not_one_queue_passed_over() -> None:
    acks = round_robin(20.0, 0.05)
    acks += [(t + 30.0, q) for t, q in round_robin(20.0, 0.05)]  # nothing from 20 s to 30 s
    assert all(spans == [] for spans in queue_outages(acks).values())
    assert queue_outages([]) == {}
