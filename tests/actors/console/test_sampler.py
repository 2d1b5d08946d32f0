"""The console's sampler on its own (no Ray): rates over the window, a topic created
between samples counted from 0, a broker restart (a new incarnation) counting nothing
rather than going negative, and a bounded ring."""

from __future__ import annotations

from typing import Any

from actors.console.sampler import Sampler


def counters(
    incarnation: str,
    put: int,
    get: int,
    timed: int,
    micros: int,
    topics: dict[str, list[int]],
    gets: dict[str, int],
    lags: dict[str, int],
) -> dict[str, Any]:
    """What ``Broker.counters`` answers (the fields the sampler reads)."""
    return {
        "incarnation": incarnation,
        "put_msgs": put,
        "get_msgs": get,
        "put_timed": timed,
        "put_micros": micros,
        "topics": topics,
        "groups": {g: {"T": [0, lag]} for g, lag in lags.items()},
        "group_gets": gets,
    }


def test_rates_come_from_the_window_and_a_new_topic_counts_from_zero() -> None:
    s = Sampler(interval_s=1.0, kept=10, window_s=2.0)
    assert s.broker_rates() == {} and s.series()["put_tps"] == {}  # one sample: no rate
    s.add({"a": counters("i1", 0, 0, 0, 0, {}, {}, {"g": 5})}, at=100.0)
    s.add({"a": counters("i1", 10, 0, 1, 2000, {"T": [10, 10]}, {}, {"g": 15})}, at=101.0)
    s.add({"a": counters("i1", 30, 8, 2, 6000, {"T": [30, 30]}, {"g": 8}, {"g": 27})}, at=102.0)
    # the window reaches back 2 s: from the first sample to the last
    assert s.broker_rates() == {"a": {"put_tps": 15.0, "get_tps": 4.0, "put_ms": 3.0}}
    assert s.topic_rates() == {"T": 15.0}  # created after the first sample: from 0
    assert s.group_rates() == {"g": 4.0}
    series = s.series()
    assert series["put_tps"] == {"a": [(101.0, 10.0), (102.0, 20.0)]}
    assert series["put_ms"] == {"a": [(101.0, 2.0), (102.0, 4.0)]}
    assert series["lag"] == {"g": [(100.0, 5.0), (101.0, 15.0), (102.0, 27.0)]}
    assert series["consume_tps"] == {"g": [(102.0, 8.0)]}  # served nothing before


def test_a_restarted_broker_counts_nothing_across_its_restart_and_the_ring_is_bounded() -> None:
    s = Sampler(interval_s=1.0, kept=3, window_s=10.0)
    s.add({"a": counters("i1", 500, 50, 5, 500, {"T": [500, 9]}, {"g": 50}, {})}, at=1.0)
    s.add({"a": counters("i2", 3, 1, 1, 100, {"T": [3, 3]}, {"g": 1}, {})}, at=2.0)
    assert s.broker_rates() == {} and s.topic_rates() == {} and s.group_rates() == {}
    assert s.series()["put_tps"] == {}
    s.add({"a": counters("i2", 13, 1, 2, 300, {"T": [13, 13]}, {"g": 1}, {})}, at=3.0)
    s.add({"a": counters("i2", 23, 1, 3, 500, {"T": [23, 23]}, {"g": 1}, {})}, at=4.0)
    assert [x.time for x in s.samples] == [2.0, 3.0, 4.0]  # the oldest one dropped
    assert s.broker_rates()["a"]["put_tps"] == 10.0  # from 2.0 to 4.0: 20 messages
    assert s.topic_rates() == {"T": 10.0}
