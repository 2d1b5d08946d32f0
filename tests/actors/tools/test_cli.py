"""The ``raymq`` console script, run in-process against the test Ray cluster."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from raymq_testkit import SMALL_STORE, unique_namespace, wait_until

from actors.tools.cli import main
from storage import Message
from storage.errors import PermissionDeniedError


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_cli_round_trip(
    ray_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = unique_namespace("cli")
    config = tmp_path / "cluster.yaml"
    store = ", ".join(f"{k}: {v}" for k, v in SMALL_STORE.items())
    config.write_text(
        f"namespace: {ns}\nnameservers: 1\nbrokers: [broker-a]\n"
        f"store_root: {tmp_path / 'stores'}\n"
        f"broker: {{auto_create_topic_enable: false, store: {{{store}}}}}\n"
        "topics: [{topic_name: Cli, read_queue_nums: 2, write_queue_nums: 2}]\n"
        "auto_promote: true\n"  # a keeper to promote slaves: `down` stops it first
    )
    try:
        up = run(capsys, "up", "--config", str(config))
        assert [b["broker_name"] for b in up["brokers"]] == ["broker-a"]
        status = run(capsys, "status", "--namespace", ns)
        assert status["nameservers"][0]["alive"] and status["brokers"][0]["role"] == "MASTER"

        assert (
            run(
                capsys,
                "topic",
                "create",
                "Extra",
                "--read-queues",
                "1",
                "--write-queues",
                "1",
                "--namespace",
                ns,
            )["writeQueueNums"]
            == 1
        )
        assert run(capsys, "topic", "list", "--namespace", ns) == ["Cli", "Extra"]
        run(capsys, "topic", "update", "Extra", "--perm", "4", "--namespace", ns)
        assert main(["send", "Extra", "--body", "x", "--namespace", ns]) == 1  # read-only now
        assert "forbids write" in capsys.readouterr().err

        sent = run(
            capsys,
            "send",
            "Cli",
            "--body",
            "hello",
            "--count",
            "3",
            "--tags",
            "T1",
            "--keys",
            "order-9",
            "--namespace",
            ns,
        )
        assert len(sent) == 3 and {r["status"] for r in sent} == {"SEND_OK"}
        rows = run(capsys, "topic", "status", "Cli", "--namespace", ns)
        assert sum(r["max_offset"] for r in rows) == 3

        lag = run(capsys, "lag", "--group", "cli-g", "--topic", "Cli", "--namespace", ns)
        assert lag["total_lag"] == 3
        got = run(capsys, "consume", "Cli", "--group", "cli-g", "--namespace", ns)
        assert [m["body"] for m in got] == ["hello"] * 3 and got[0]["tags"] == "T1"
        assert run(capsys, "lag", "--group", "cli-g", "--namespace", ns)["total_lag"] == 0
        assert run(capsys, "consume", "Cli", "--group", "cli-g", "--namespace", ns) == []

        by_key = run(capsys, "query", "--key", "order-9", "--topic", "Cli", "--namespace", ns)
        assert len(by_key) == 3
        by_id = run(capsys, "query", "--id", sent[0]["offset_msg_id"], "--namespace", ns)
        assert by_id[0]["msg_id"] == sent[0]["msg_id"]

        assert main(["topic", "status", "Nope", "--namespace", ns, "--json"]) == 1
        assert json.loads(capsys.readouterr().out)["error"] == "TopicNotFoundError"
        human = main(["status", "--namespace", ns])
        assert human == 0 and "broker-a" in capsys.readouterr().out
    finally:
        down = run(capsys, "down", "--namespace", ns)
    assert down["stopped"] == ["broker-a-0", "nameserver-0", "raymq-keeper"]
    assert main(["status", "--namespace", ns]) == 1
    assert "no RayMQ NameServer" in capsys.readouterr().err


def test_offset_reset_to_a_time_earliest_latest_and_query_by_key_in_a_time_range(
    make_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = make_cluster(nameservers=1, brokers=1)
    ns = cluster.namespace
    cluster.admin.create_topic("CliReset", 2, 2)
    producer = cluster.producer("p-cli-reset", max_batch_messages=1)
    first = producer.send_batch([Message("CliReset", b"a%d" % i, keys="k") for i in range(4)])
    split_ms = time.time_ns() // 1_000_000 + 1
    wait_until(lambda: time.time_ns() // 1_000_000 > split_ms, what="the split time to pass")
    producer.send_batch([Message("CliReset", b"b%d" % i, keys="k") for i in range(2)])
    producer.close()
    split_iso = datetime.fromtimestamp(split_ms / 1000, tz=timezone.utc).isoformat()

    query = ["query", "--key", "k", "--topic", "CliReset", "--namespace", ns]
    assert len(run(capsys, *query)) == 6
    assert sorted(m["body"] for m in run(capsys, *query, "--begin", str(split_ms))) == ["b0", "b1"]
    older = run(capsys, *query, "--end", split_iso.replace("+00:00", "Z"))
    assert sorted(m["body"] for m in older) == ["a0", "a1", "a2", "a3"]
    assert run(capsys, *query, "--begin", str(split_ms), "--end", str(split_ms)) == []

    reset = ["offset", "reset", "--group", "cli-reset", "--topic", "CliReset", "--namespace", ns]

    def offsets(out: Any) -> dict[int, int]:
        return {q["queue_id"]: q["offset"] for q in out["queues"]}

    latest = run(capsys, *reset, "--to", "latest")
    assert sum(offsets(latest).values()) == 6 and latest["to"] == "latest"
    lag = run(capsys, "lag", "--group", "cli-reset", "--topic", "CliReset", "--namespace", ns)
    assert lag["total_lag"] == 0
    at_split = run(capsys, *reset, "--to", split_iso)
    assert at_split["to"] == split_ms and sum(offsets(at_split).values()) == len(first)
    assert sum(offsets(run(capsys, *reset, "--to", str(split_ms))).values()) == len(first)
    assert set(offsets(run(capsys, *reset, "--to", "earliest")).values()) == {0}
    lag = run(capsys, "lag", "--group", "cli-reset", "--topic", "CliReset", "--namespace", ns)
    assert lag["total_lag"] == 6

    assert main([*reset, "--to", "yesterday", "--json"]) == 1
    assert "ISO-8601" in json.loads(capsys.readouterr().out)["message"]


def test_system_topics_are_refused_and_auto_creation_goes_on(
    make_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = make_cluster(brokers=1, broker_options={"auto_create_topic_enable": True})
    ns = cluster.namespace
    # the template of auto-created topics, a broker's own topics, and RocketMQ's
    # RMQ_SYS_* (refused whether it exists or not, before asking where it lives)
    for topic in ("TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRACE_TOPIC", "broker-a"):
        assert main(["topic", "delete", topic, "--namespace", ns]) == 1
        err = capsys.readouterr().err
        assert f"raymq: error: topic={topic!r} is a system topic: it cannot be deleted" in err
        assert main(["topic", "update", topic, "--perm", "4", "--namespace", ns, "--json"]) == 1
        assert json.loads(capsys.readouterr().out) == {
            "error": "PermissionDeniedError",
            "message": f"topic={topic!r} is a system topic: it cannot be changed",
        }
    with pytest.raises(PermissionDeniedError, match="DefaultCluster"):
        cluster.admin.delete_topic("DefaultCluster")  # the cluster's own topic
    assert "TBW102" in run(capsys, "topic", "list", "--all", "--namespace", ns)
    sent = run(capsys, "send", "AutoAfterRefusal", "--body", "x", "--namespace", ns)
    assert [r["status"] for r in sent] == ["SEND_OK"]  # auto-creation still works
    got = run(capsys, "consume", "AutoAfterRefusal", "--start", "earliest", "--namespace", ns)
    assert [m["body"] for m in got] == ["x"]


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["consume", "T", "--max", "-1"], "argument --max: must be at least 1, got -1"),
        (["consume", "T", "--max", "0"], "argument --max: must be at least 1, got 0"),
        (["consume", "T", "--wait", "-1"], "argument --wait: must be a number of seconds >= 0"),
        (["lag", "--group", ""], "argument --group: '': must be a non-empty name"),
        (["lag", "--group", "g", "--topic", ""], "argument --topic: '': must be a non-empty"),
        (["send", "T", "--body", "x", "--count", "0"], "argument --count: must be at least 1"),
        (["dlq", "list", "--group", " g"], "argument --group: ' g': must be a non-empty name"),
        (["group", "status", "g", "--log", "0"], "argument --log: must be at least 1"),
        (["query", "--key", "k", "--topic", "T", "--max", "x"], "argument --max: 'x' is not"),
    ],
)
def test_bad_arguments_are_refused_with_exit_code_2(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert complaint in capsys.readouterr().err
