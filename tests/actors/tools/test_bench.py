"""``raymq bench``: a live line per second and a summary that adds up."""

from __future__ import annotations

from typing import Any

import pytest

from actors.tools.bench import run_bench


def test_bench_reports_each_second_and_a_consistent_summary(make_cluster: Any) -> None:
    cluster = make_cluster(brokers=1)
    cluster.admin.create_topic("BenchT", 4, 4)
    lines: list[str] = []
    summary = run_bench(cluster, "BenchT", seconds=2.5, producers=2, batch=64, report=lines.append)
    assert len(lines) == 3 and all(line.startswith("Send TPS:") for line in lines)
    assert summary.sent > 0 and summary.failed == 0
    # the last batches in flight when time is up count in the summary, not in a line
    assert 0 < sum(int(r["send_tps"]) for r in summary.per_second) <= summary.sent
    assert 0 < summary.consumed <= summary.sent
    assert summary.avg_rt_ms > 0 and summary.max_rt_ms >= summary.avg_rt_ms


def test_bench_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        run_bench(None, "T", seconds=0)  # type: ignore[arg-type]
