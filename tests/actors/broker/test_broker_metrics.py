"""The broker's ``raymq_*`` metrics reach the node's Prometheus endpoint, tagged and
adding up: messages and bytes in and out per topic, put and flush latency, lag per
group and topic, store gauges, transactions ended per state; and every series the Grafana dashboard
(``docs/grafana/raymq.json``) queries is among them.

Ray exports metrics every ``metrics_report_interval_ms`` (10 s unless set when Ray
starts), so this test needs a Ray of its own, started with 500 ms: it runs this
file as a script in a child process (``_child``), which starts that Ray and a
RayMQ cluster, stores and pulls known batches, prints what the metrics must say
and the node's metrics port, and stays up until the test closes its stdin.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from raymq_testkit import SMALL_STORE, unique_namespace, wait_until

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "docs" / "grafana" / "raymq.json"
TESTKIT = Path(__file__).resolve().parents[1]  # tests/actors: raymq_testkit
BROKER = {"broker": "broker-a", "broker_id": "0"}


def _child(store_root: str) -> None:
    import ray

    import actors
    from actors.protocol.wire import pull_from_wire
    from storage import Message, encode_batch

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=False,
        _system_config={"metrics_report_interval_ms": 500},
    )
    ns = unique_namespace("metrics")
    cluster = actors.start_cluster(
        namespace=ns,
        nameservers=1,
        brokers=1,
        store_root=store_root,
        topics=[
            actors.TopicConfig("MetricsT", 2, 2),
            actors.TopicConfig("MetricsU", 1, 1),
            actors.TopicConfig("MetricsX", 1, 1),
        ],
        broker_options={
            "store": SMALL_STORE,
            "metrics_export_interval_s": 0.2,
            "metrics_lag_interval_s": 0.2,
        },
    )
    broker = ray.get_actor("broker-a-0", namespace=ns)
    # two puts: 20 records to MetricsT:0, then one batch of two topics (and below, one of
    # transactional messages to MetricsX)
    one = encode_batch([Message("MetricsT", b"t" * 100, queue_id=0)] * 20)
    two = encode_batch(
        [Message("MetricsT", b"t" * 100, queue_id=1)] * 5
        + [Message("MetricsU", b"u" * 50, queue_id=0)] * 3
    )
    for batch in (one, two):
        ray.get(broker.send.remote(batch.to_bytes()))
    sizes = [int(s) for s in two.sizes]
    # two pulls of MetricsT (20 + 2 records) and an empty one of MetricsU past its end
    pulled = [
        pull_from_wire(ray.get(broker.pull.remote("g1", "MetricsT", 0, 0, 32))),
        pull_from_wire(ray.get(broker.pull.remote("g1", "MetricsT", 1, 0, 2))),
        pull_from_wire(ray.get(broker.pull.remote("g2", "MetricsU", 0, 3, 32))),
    ]
    ray.get(broker.commit_offsets.remote("g1", {("MetricsT", 0): 20, ("MetricsT", 1): 2}))
    ray.get(broker.commit_offsets.remote("g2", {("MetricsU", 0): 1}))
    # three transactional (half) messages: one committed, one rolled back, one left open
    from actors.protocol.wire import SendAck
    from storage.properties import PROP_PRODUCER_GROUP, PROP_TRAN_MSG

    txn = {PROP_TRAN_MSG: "true", PROP_PRODUCER_GROUP: "metrics-txn"}
    halves = encode_batch([Message("MetricsX", b"h", queue_id=0, properties=txn)] * 3)
    ack = SendAck.from_wire(ray.get(broker.send.remote(halves.to_bytes())))
    ids, offsets = list(halves.uniq_keys), ack.commitlog_offsets.tolist()
    for i, commit in ((0, True), (1, False)):
        assert ray.get(broker.end_transaction.remote("metrics-txn", offsets[i], ids[i], commit))
    ray.get(broker.persist.remote())  # at least one CommitLog flush
    expected = {
        "messages_in": {"MetricsT": 25, "MetricsU": 3},
        "bytes_in": {"MetricsT": len(one.data) + sum(sizes[:5]), "MetricsU": sum(sizes[5:])},
        "messages_out": {"MetricsT": sum(r.count for r in pulled)},
        "bytes_out": {"MetricsT": sum(len(r.data) for r in pulled)},
        "lag": {"g1/MetricsT": 3, "g2/MetricsU": 2},
        "commitlog_bytes": ray.get(broker.status.remote())["commitlog_max_offset"],
        "transactions": {"committed": 1, "rolled_back": 1},
    }
    port = ray._private.worker.global_worker.node.metrics_export_port
    print(json.dumps({"port": port, "expected": expected}), flush=True)
    sys.stdin.read()  # until the test is done scraping
    cluster.shutdown(timeout_s=10.0)
    ray.shutdown()


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus samples of the ``ray_raymq_*`` series, by sample name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("ray_raymq_"):
                samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def _value(samples: dict[str, Any], name: str, **tags: str) -> float | None:
    want = {**BROKER, **tags}
    found = [v for labels, v in samples.get(name, []) if want.items() <= labels.items()]
    return sum(found) if found else None


def _start_child(tmp_path: Path) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), str(TESTKIT), env.get("PYTHONPATH")])
    )
    stderr = open(tmp_path / "child.err", "w")  # noqa: SIM115 - the child writes it
    proc = subprocess.Popen(
        [sys.executable, __file__, str(tmp_path / "stores")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
    )
    stderr.close()
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        proc.wait(timeout=60)
        raise AssertionError(f"metrics child failed:\n{(tmp_path / 'child.err').read_text()}")
    return proc, json.loads(line)


def _mismatches(s: dict[str, Any], exp: dict[str, Any]) -> list[str]:
    """What the scrape ``s`` does not show yet of what the child expects."""
    want: list[tuple[str, dict[str, str], float]] = [
        (f"ray_raymq_{m}_total", {"topic": t}, v)
        for m in ("messages_in", "bytes_in", "messages_out", "bytes_out")
        for t, v in exp[m].items()
    ]
    for key, lag in exp["lag"].items():
        group, _, topic = key.partition("/")
        want.append(("ray_raymq_consumer_lag", {"group": group, "topic": topic}, lag))
    want.append(("ray_raymq_put_latency_seconds_count", {}, 3))  # the two, the halves
    want.append(("ray_raymq_commitlog_bytes", {}, exp["commitlog_bytes"]))
    for state, n in exp["transactions"].items():
        want.append(("ray_raymq_transactions_total", {"state": state}, n))
    bad = [
        f"{name}{tags} = {got} (want {v})"
        for name, tags, v in want
        if (got := _value(s, name, **tags)) != v
    ]
    if not _value(s, "ray_raymq_flush_latency_seconds_count"):
        bad.append("no flush latency observed")
    bad.extend(
        f"{name}: named by {DASHBOARD.name}, not exported" for name in dashboard_series() - set(s)
    )
    return bad


def dashboard_series() -> set[str]:
    """Every ``ray_raymq_*`` series the Grafana dashboard's queries name (a valid
    dashboard: JSON with a uid, a datasource variable and Prometheus queries)."""
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] == "raymq" and board["title"] == "RayMQ"
    assert "datasource" in {v["name"] for v in board["templating"]["list"]}
    targets = [t for p in board["panels"] for t in p.get("targets", [])]
    assert len(targets) >= 12 and all(t["expr"] and t["refId"] for t in targets)
    names = {n for t in targets for n in re.findall(r"\bray_raymq_\w+", t["expr"])}
    assert {
        "ray_raymq_messages_in_total",
        "ray_raymq_consumer_lag",
        "ray_raymq_master_epoch",
    } <= names
    return names


def test_broker_metrics_reach_prometheus_with_tags_and_values(tmp_path: Path) -> None:
    proc, info = _start_child(tmp_path)
    try:
        port, exp = info["port"], info["expected"]
        last: list[str] = []

        def complete() -> dict[str, Any] | None:
            samples = _scrape(port)
            last[:] = _mismatches(samples, exp)
            return None if last else samples

        try:
            samples = wait_until(complete, timeout_s=60, interval_s=0.5, what="raymq_ metrics")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {last}") from None
        assert _value(samples, "ray_raymq_messages_out_total", topic="MetricsU") is None
        put_s = _value(samples, "ray_raymq_put_latency_seconds_sum")
        assert put_s is not None and 0 < put_s < 10
        disk = _value(samples, "ray_raymq_store_disk_used_ratio")
        assert disk is not None and 0 < disk <= 1
        buckets = {labels["le"] for labels, _ in samples["ray_raymq_put_latency_seconds_bucket"]}
        assert {"0.001", "1.0", "+Inf"} <= buckets
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (tmp_path / "child.err").read_text()


if __name__ == "__main__":
    _child(sys.argv[1])
