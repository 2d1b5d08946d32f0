"""``raymq bench``, run in-process against the test Ray cluster: a line per second
while it runs and a summary after, or with ``--json`` one JSON document only."""

from __future__ import annotations

import json
from typing import Any

import pytest

from actors.tools.cli import main


def test_bench_prints_a_line_per_second_and_a_summary(
    make_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = make_cluster(brokers=1).namespace
    argv = ["bench", "--topic", "CliBench", "--queues", "2", "--namespace", ns]

    assert main([*argv, "--duration", "2.5", "--producers", "2", "--batch", "16"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    live = [line for line in lines if line.startswith("Send TPS:")]
    assert len(live) == 3 + 1  # one per second (the last one partial) and the summary's
    for line in live[:3]:
        for field in ("Max RT(ms):", "Average RT(ms):", "Send Failed: 0", "Consume TPS:"):
            assert field in line, line
    summary = lines[lines.index(live[2]) + 1]
    assert summary.startswith("Summary: ") and "failed 0" in summary and "consumed" in summary
    assert "created topic CliBench (2 queues)" in captured.err

    assert main([*argv, "--duration", "1.5", "--no-consume", "--body-size", "64", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)  # nothing but the JSON document
    assert doc["topic"] == "CliBench" and doc["body_size"] == 64 and doc["consume"] is False
    assert doc["sent"] > 0 and doc["failed"] == 0 and doc["consumed"] == 0
    assert doc["send_tps"] > 0 and doc["max_rt_ms"] >= doc["avg_rt_ms"] > 0
    assert doc["seconds"] >= 1.5 and len(doc["per_second"]) == 2
    assert set(doc["per_second"][0]) == {
        "send_tps",
        "max_rt_ms",
        "avg_rt_ms",
        "send_failed",
        "consume_tps",
    }


def test_bench_refuses_a_nonsense_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--duration", "0", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == {
        "error": "ValueError",
        "message": "--duration=0.0: must be > 0",
    }
