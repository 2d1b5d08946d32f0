"""The examples, run as a user who copies them would: the store on its own (its temp
directory gone afterwards), and the exactly-once billing service crashing in the middle
of its transactions (on the module's cluster: the script itself starts a local Ray)."""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
import ray

import actors

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"raymq_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_store_demo_writes_reads_back_and_leaves_nothing_in_tmp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # its temp dir lands here, to be checked
    assert example("store_demo").main(["--messages", "5000"]) == 0
    out = capsys.readouterr().out
    assert "wrote 5000 messages" in out and "key order-4242 ->" in out
    assert "removed" in out and list(tmp_path.iterdir()) == []


def test_the_exactly_once_example_bills_every_order_once_across_its_crashes(
    one_broker: actors.Cluster, tmp_path: Path
) -> None:
    ex = example("exactly_once")
    ray.cloudpickle.register_pickle_by_value(ex)  # its task runs in a worker process
    result = ex.run(one_broker, 400, 2, 11, str(tmp_path / "txn-log"))
    assert ex.check(result["invoices"], 400) == []
    assert sum(n for n in result["invoices"].values()) == 400
    assert any("crashed" in line for line in result["runs"]), result["runs"]


def test_a_ray_async_actor_consumes_with_async_for(one_broker: actors.Cluster) -> None:
    ex = example("async_actor_consumer")
    ray.cloudpickle.register_pickle_by_value(ex)  # its actor runs in a worker process
    assert ex.run(one_broker, 100) == (100, 5050)


def test_a_ray_serve_deployment_answers_from_the_topic_it_consumes(
    one_broker: actors.Cluster,
) -> None:
    from ray import serve

    ex = example("serve_consumer")
    ray.cloudpickle.register_pickle_by_value(ex)  # its deployment runs in a replica
    offsets = os.path.join(tempfile.gettempdir(), "raymq-serve-offsets-*")
    before = set(glob.glob(offsets))
    try:
        answers = ex.run(one_broker, 20)
    finally:
        serve.shutdown()
    assert answers == {f"o{i}": "shipped" for i in range(20)}
    assert set(glob.glob(offsets)) <= before, "the replica's offsets went with it"


def test_a_gateway_resumes_a_dropped_token_stream_exactly_after_its_offset(
    one_broker: actors.Cluster,
) -> None:
    from ray import serve

    ex = example("lite_token_stream")
    ray.cloudpickle.register_pickle_by_value(ex)  # its deployment runs in a replica
    try:
        result = ex.run(one_broker, sessions=3)
    finally:
        serve.shutdown()
    assert ex.check(result) == []
    for session, r in result.items():
        assert r["resumed_at"] == 5 and r["n"] == len(ex.reply_tokens(session))
        assert r["second"][0] == ex.reply_tokens(session)[5]


def test_sub_agents_take_their_own_tasks_in_the_planned_order(
    one_broker: actors.Cluster,
) -> None:
    ex = example("lite_sub_agents")
    ray.cloudpickle.register_pickle_by_value(ex)  # its agents run in worker processes
    reports = ex.run(one_broker)
    assert reports == {a: [f"done {t!r}" for t in tasks] for a, tasks in ex.PLAN.items()}
