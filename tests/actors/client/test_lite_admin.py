"""LITE parents through the admin client and the ``raymq`` CLI on a real two-broker
cluster: create one with its quota and TTL, describe it, list its lite topics by page,
a lite topic's offsets and its groups' offsets and lag, delete one; bad input is
refused and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from raymq_testkit import SMALL_STORE, unique_namespace

import actors
from actors.client.lite import LiteConsumer, LiteProducer
from actors.tools.cli import main
from storage.errors import (
    InvalidConfigError,
    InvalidMessageError,
    PermissionDeniedError,
    TopicNotFoundError,
)
from storage.lite import IllegalLiteTopicError

NAMES = [f"s{i:02d}" for i in range(30)]


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = actors.start_cluster(
        namespace=unique_namespace("liteadmin"),
        nameservers=1,
        brokers=2,
        store_root=str(tmp_path_factory.mktemp("liteadmin")),
        broker_options={"store": SMALL_STORE},
    )
    yield c
    c.shutdown()


def cli(capsys: pytest.CaptureFixture[str], ns: str, *argv: str, code: int = 0) -> Any:
    got = main([*argv, "--namespace", ns, "--json"])
    out = capsys.readouterr().out
    assert got == code, out
    return json.loads(out)


def test_a_lite_parent_is_created_described_paged_inspected_and_pruned(
    cluster: actors.Cluster,
) -> None:
    admin = cluster.admin
    made = admin.create_lite_topic("Sessions", quota=50, ttl_ms=3_600_000)
    assert made == {
        b: {"quota": 50, "ttl_ms": 3_600_000, "lite_topics": 0} for b in ("broker-a", "broker-b")
    }
    assert admin.lite_parents() == ["Sessions"]
    with pytest.raises(InvalidMessageError, match="must match"):  # a blank in a name
        admin.create_lite_topic("bad name", quota=5)
    with pytest.raises(InvalidConfigError):
        admin.create_lite_topic("Other", quota=0)
    assert admin.lite_parents() == ["Sessions"] and "Other" not in admin.list_topics()

    with LiteProducer("Sessions", namespace=cluster.namespace) as producer:
        producer.send_batch([(n, f"{n}-0".encode()) for n in NAMES])
        producer.send_batch([("s03", b"s03-1"), ("s03", b"s03-2")])
    d = admin.describe_lite_topic("Sessions")
    assert (d["lite_topics"], d["quota"], d["quota_used"], d["ttl_ms"]) == (30, 100, 0.3, 3_600_000)
    assert sum(b["lite_topics"] for b in d["brokers"].values()) == 30

    pages, after = [], ""
    while True:  # 7 a page, merged from both brokers in name order
        page = admin.list_lite_topics("Sessions", after=after, limit=7)
        assert page["total"] == 30 and len(page["lite_topics"]) <= 7
        pages.append(page["lite_topics"])
        if page["next"] is None:
            break
        after = page["next"]
    assert [n for p in pages for n in p] == NAMES and len(pages) == 5

    consumer = LiteConsumer("gateway", "Sessions", namespace=cluster.namespace)
    try:
        assert consumer.subscribe("s03") == ["s03"]
        (batch,) = consumer.receive(1)
        st = admin.lite_topic_status("Sessions", "s03")
        assert (st["min_offset"], st["max_offset"]) == (0, 3)
        assert st["groups"] == {
            "gateway": {"committed_offset": -1, "lag": 3, "owner": consumer.client_id}
        }
        consumer.ack(batch)
        st = admin.lite_topic_status("Sessions", "s03")
        assert st["groups"]["gateway"]["committed_offset"] == 1
        assert st["groups"]["gateway"]["lag"] == 2

        with pytest.raises(InvalidConfigError, match="holds"):  # each broker holds > 10
            admin.create_lite_topic("Sessions", quota=10)
        assert admin.describe_lite_topic("Sessions")["quota"] == 100  # unchanged
        with pytest.raises(IllegalLiteTopicError):
            admin.delete_lite_topic("Sessions", "no/slash")

        assert admin.delete_lite_topic("Sessions", "s03") == [st["broker"]]
        with pytest.raises(TopicNotFoundError):
            admin.lite_topic_status("Sessions", "s03")
        with pytest.raises(TopicNotFoundError):
            admin.delete_lite_topic("Sessions", "s03")
        assert admin.describe_lite_topic("Sessions")["lite_topics"] == 29
        with pytest.raises(PermissionDeniedError):  # its subscription went with it
            consumer.ack("s03", 0)
        assert consumer.pull("s03", 0).messages == []
    finally:
        consumer.close()


def test_the_cli_creates_and_inspects_lite_parents(
    cluster: actors.Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = cluster.namespace
    made = cli(capsys, ns, "topic", "create", "Agents", "--type", "LITE", "--quota", "4")
    assert made["type"] == "LITE" and made["brokers"]["broker-a"]["quota"] == 4
    with LiteProducer("Agents", namespace=ns) as producer:
        producer.send_batch(
            [("planner", b"p"), ("coder", b"c"), ("coder", b"c2"), ("critic", b"k")]
        )
    assert cli(capsys, ns, "lite", "describe", "Agents")["lite_topics"] == 3
    page = cli(capsys, ns, "lite", "list", "Agents", "--limit", "2")
    assert page == {"lite_topics": ["coder", "critic"], "total": 3, "next": "critic"}
    page = cli(capsys, ns, "lite", "list", "Agents", "--after", "critic")
    assert page == {"lite_topics": ["planner"], "total": 3, "next": None}
    # 3 lite topics on 2 brokers: one holds 2 of them
    err = cli(capsys, ns, "topic", "create", "Agents", "--type", "LITE", "--quota", "1", code=1)
    assert err["error"] == "InvalidConfigError"
    assert cli(capsys, ns, "lite", "describe", "Agents")["quota"] == 8
    st = cli(capsys, ns, "lite", "status", "Agents", "coder")
    assert (st["max_offset"], st["groups"]) == (2, {})
    assert cli(capsys, ns, "lite", "delete", "Agents", "coder")["deleted_on"] == [st["broker"]]
    err = cli(capsys, ns, "lite", "status", "Agents", "coder", code=1)
    assert err["error"] == "TopicNotFoundError"
    err = cli(capsys, ns, "topic", "create", "Plain", "--quota", "3", code=1)
    assert "--type LITE" in err["message"]
    assert "Plain" not in cluster.admin.list_topics()
