"""Master/slave replication: a slave holds the master's CommitLog byte for byte, follows its
metadata, serves reads when the master is gone, and can be promoted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from raymq_ha_testkit import (
    broker_config,
    commitlog_bytes,
    kill,
    members,
    read_all,
    start_broker,
    status_of,
)
from raymq_testkit import SMALL_STORE, unique_namespace, wait_until

import actors
from actors import BrokerSpec, PullStatus, SendStatus
from actors.protocol import rpc as _rpc
from actors.protocol.wire import pull_from_wire
from actors.tools.cli import main as cli
from rebalance import MessageQueue
from storage import Message
from storage.codec import encode_batch
from storage.errors import BrokerUnavailableError, TopicNotFoundError
from storage.message import GetStatus

GROUP = [BrokerSpec("broker-a", 0), BrokerSpec("broker-a", 1)]
FAST = {"slave_sync_interval_s": 0.2, "ha_slave_timeout_s": 1.5}
SLAVE_READ = {"slave_read_enable": True, "slave_read_window_bytes": 20_000}


def caught_up(master: Any, slave: Any) -> bool:
    m, s = status_of(master), status_of(slave)
    return bool(m and s) and m["commitlog_max_offset"] == s["commitlog_max_offset"]


@pytest.fixture(scope="module")
def pair(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    """A SYNC_MASTER and its slave (reads sent to the slave past 20 KB behind) shared by
    the tests that kill neither, each on topics and groups of its own: a group costs
    ~5 s to start."""
    cluster = actors.start_cluster(
        namespace=unique_namespace("pair"),
        nameservers=1,
        brokers=GROUP,
        store_root=str(tmp_path_factory.mktemp("pair")),
        topics=[actors.TopicConfig("HA", 4, 4), actors.TopicConfig("HAL", 1, 1)],
        broker_options={
            "store": SMALL_STORE,
            "heartbeat_interval_s": 2.0,
            "broker_role": "SYNC_MASTER",
            **SLAVE_READ,
            **FAST,
        },
    )
    yield cluster
    cluster.shutdown(timeout_s=10.0)


def test_a_sync_slave_holds_the_masters_commitlog_byte_for_byte(pair: actors.Cluster) -> None:
    cluster = pair
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    assert (status_of(master)["role"], status_of(master)["broker_role"]) == (
        "MASTER",
        "SYNC_MASTER",
    )
    assert status_of(slave)["role"] == "SLAVE"
    producer = cluster.producer("p-ha", max_batch_messages=100)
    results = producer.send_batch([Message("HA", b"m%05d" % i, keys=f"k{i}") for i in range(3000)])
    assert {r.status for r in results} == {SendStatus.SEND_OK}

    wait_until(lambda: caught_up(master, slave), what="slave caught up")
    m, s = status_of(master), status_of(slave)
    assert commitlog_bytes(m["store_dir"]) == commitlog_bytes(s["store_dir"])
    # its ConsumeQueues and index are its own
    for q in range(4):
        mine = pull_from_wire(ray.get(slave.pull.remote("g", "HA", q, 0, 10_000)))
        theirs = pull_from_wire(ray.get(master.pull.remote("g", "HA", q, 0, 10_000)))
        assert mine.count == theirs.count > 0 and mine.data == theirs.data
    found = ray.get(slave.query_by_key.remote("HA", "k1234"))
    assert [x.body for x in found] == [b"m01234"]

    # a slave takes no writes
    blob = encode_batch([Message("HA", b"x")]).to_bytes()
    with pytest.raises(BrokerUnavailableError, match="slave"):
        _rpc.get(slave.send.remote(blob), 30)

    # topics, consumer offsets, delay progress and FIFO groups follow the master
    cluster.admin.create_topic("HA2", 2, 2, brokers=["broker-a"])
    consumer = cluster.pull_consumer("g-ha")
    consumer.commit(MessageQueue("HA", "broker-a", 2), 700)
    cluster.admin.set_group_fifo("g-fifo", brokers=["broker-a"])
    wait_until(
        lambda: (
            "HA2" in ray.get(slave.topic_configs.remote())
            and ray.get(slave.query_offset.remote("g-ha", "HA", 2)) == 700
            and status_of(slave)["fifo_groups"] == ["g-fifo"]
        ),
        what="metadata synced to the slave",
    )
    assert status_of(master)["slaves"]["broker-a-1"]["ack_offset"] > 0

    # a topic created on the slave (as start_cluster and admin tools create one on every
    # member at once) outlives a snapshot the master took before its own create: else a
    # failover in that window would lose the topic for good
    ray.get(slave.create_topic.remote(actors.TopicConfig("HA3", 1, 1)))
    rounds = status_of(slave)["metadata_syncs"]
    wait_until(lambda: status_of(slave)["metadata_syncs"] >= rounds + 2, what="two more syncs")
    assert "HA3" in ray.get(slave.topic_configs.remote())


def test_sync_master_says_when_no_slave_has_the_bytes(make_cluster: Any) -> None:
    cluster = make_cluster(
        nameservers=1,
        brokers=GROUP,
        topics=["HAS"],
        broker_options={
            "broker_role": "SYNC_MASTER",
            "sync_replication_timeout_s": 0.3,
            **FAST,
        },
    )
    producer = cluster.producer("p-has")
    assert producer.send(Message("HAS", b"first")).status is SendStatus.SEND_OK
    kill(cluster.broker("broker-a", 1))
    # the slave counts as live for ha_slave_timeout_s: puts wait for it and time out
    statuses = {producer.send(Message("HAS", b"late")).status for _ in range(2)}
    assert SendStatus.FLUSH_SLAVE_TIMEOUT in statuses
    wait_until(
        lambda: producer.send(Message("HAS", b"alone")).status is SendStatus.SLAVE_NOT_AVAILABLE,
        what="SLAVE_NOT_AVAILABLE once the slave is known gone",
    )


def test_reads_and_commits_go_to_the_slave_while_the_master_is_gone(
    make_cluster: Any, tmp_path: Path
) -> None:
    ns_root = tmp_path / "root"
    cluster = make_cluster(
        nameservers=2,
        brokers=GROUP,
        topics=[actors.TopicConfig("HAR", 2, 2)],
        store_root=str(ns_root),
        broker_options={"broker_role": "SYNC_MASTER", **FAST},
    )
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    producer = cluster.producer("p-har", max_batch_messages=50)
    sent = [b"r%04d" % i for i in range(400)]
    producer.send_batch([Message("HAR", b) for b in sent])
    wait_until(lambda: caught_up(master, slave), what="slave caught up")
    consumer = cluster.pull_consumer("g-har")
    queues = consumer.fetch_subscribe_queues("HAR")

    kill(master)
    wait_until(lambda: 0 not in members(cluster, "broker-a"), what="master out of the routes")
    # writes are refused (read-only group); reads and commits go to the slave
    with pytest.raises(BrokerUnavailableError):
        cluster.producer("p-har2", retry_times_when_send_failed=0).send(Message("HAR", b"no"))
    assert sorted(read_all(consumer, "HAR", queues)) == sorted(sent)
    consumer.commit_offsets({q: 150 for q in queues})
    assert all(
        ray.get(slave.query_offset.remote("g-har", "HAR", q.queue_id)) == 150 for q in queues
    )

    # the master comes back: it takes the slave's commits before it serves anyone
    config = broker_config(cluster, str(ns_root), "broker-a", 0, broker_role="SYNC_MASTER", **FAST)
    master = start_broker(config)
    wait_until(lambda: members(cluster, "broker-a").get(0) == "broker-a-0", what="master back")
    fresh = cluster.pull_consumer("g-har")
    assert all(fresh.fetch_offset(q) == 150 for q in queues)
    more = producer.send_batch([Message("HAR", b"after-%d" % i) for i in range(50)])
    assert {r.status for r in more} == {SendStatus.SEND_OK}
    offsets = {r.queue_offset for r in more}
    assert min(offsets) >= 200  # writes continue after what was there
    wait_until(lambda: caught_up(master, slave), what="slave caught up again")


def test_promotion_refuses_what_would_lose_messages_then_moves_the_group(
    make_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    cluster = make_cluster(
        nameservers=1,
        brokers=[*GROUP, BrokerSpec("broker-a", 2)],
        topics=[actors.TopicConfig("HAP", 2, 2)],
        store_root=str(root),
        broker_options={"broker_role": "SYNC_MASTER", **FAST},
    )
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    producer = cluster.producer("p-hap")
    first = producer.send_batch([Message("HAP", b"a%d" % i) for i in range(100)])
    assert {r.status for r in first} == {SendStatus.SEND_OK}
    with pytest.raises(actors.PromotionRefusedError, match="live master"):
        cluster.admin.promote("broker-a", 1)
    # slave 2 falls behind: what the master acknowledges from now on, only slave 1 has
    kill(cluster.broker("broker-a", 2))
    second = producer.send_batch([Message("HAP", b"b%d" % i) for i in range(100)])
    assert {r.status for r in second} == {SendStatus.SEND_OK}
    wait_until(lambda: caught_up(master, slave), what="slave 1 caught up")
    end = status_of(master)["commitlog_max_offset"]
    wait_until(
        lambda: status_of(slave)["ha_confirmed_offset"] >= end,
        what="slave 1 told that the master acknowledged everything",
    )

    kill(master)
    wait_until(lambda: 0 not in members(cluster, "broker-a"), what="master out of the routes")
    lagging = start_broker(
        broker_config(cluster, str(root), "broker-a", 2, broker_role="SYNC_MASTER", **FAST)
    )
    wait_until(lambda: 2 in members(cluster, "broker-a"), what="slave 2 back")
    with pytest.raises(actors.PromotionRefusedError, match="slave 1 up to"):
        cluster.admin.promote("broker-a", 2)
    with pytest.raises(actors.PromotionRefusedError, match="acknowledged SYNC_MASTER offset"):
        cluster.admin.promote("broker-a", 2, force=True)
    # slave 1, the one ahead, stops answering: the one that answers is behind it, and
    # promoting it would lose what only slave 1 holds
    ray.get(slave.inject_fault.remote("stall_status", 2))
    with pytest.raises(actors.PromotionRefusedError, match=r"did not answer.*1 \(GetTimeoutError"):
        cluster.admin.promote("broker-a", status_timeout_s=1.0)
    ns = ["--namespace", cluster.namespace]
    assert cli(["broker", "promote", "broker-a", "--status-timeout", "1", *ns]) == 1
    assert "did not answer" in capsys.readouterr().err
    assert status_of(lagging)["role"] == "SLAVE"
    done = cluster.admin.promote("broker-a")  # the slave holding the most: 1
    assert (done["broker"], done["role"], done["epoch"]) == ("broker-a-1", "SYNC_MASTER", 1)
    wait_until(lambda: members(cluster, "broker-a").get(0) == "broker-a-1", what="new master")
    # slave 2 follows the new master and acknowledges for it
    wait_until(
        lambda: "broker-a-2" in status_of(slave).get("slaves", {}), what="slave 2 re-attached"
    )
    third = producer.send_batch([Message("HAP", b"c%d" % i) for i in range(100)])
    assert {r.status for r in third} == {SendStatus.SEND_OK}
    wait_until(lambda: caught_up(slave, lagging), what="slave 2 caught up")

    # the old master returns: the NameServers refuse it as master, it becomes a slave of
    # the new one, and replicates what it lacks
    config = broker_config(cluster, str(root), "broker-a", 0, broker_role="SYNC_MASTER", **FAST)
    old = start_broker(config)
    wait_until(lambda: status_of(old).get("role") == "SLAVE", what="old master demoted")
    wait_until(lambda: caught_up(slave, old), what="old master caught up as a slave")
    assert commitlog_bytes(status_of(old)["store_dir"]) == commitlog_bytes(
        status_of(slave)["store_dir"]
    )
    bodies = read_all(cluster.pull_consumer("g-hap"), "HAP")
    assert len(bodies) == 300
    assert status_of(old)["registered_id"] == 1000
    assert status_of(old)["master"] == "broker-a-1"


def test_a_consumer_far_behind_is_sent_to_the_slave(pair: actors.Cluster) -> None:
    cluster = pair
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    producer = cluster.producer("p-hal")
    producer.send_batch([Message("HAL", b"x" * 200) for _ in range(1000)])
    wait_until(lambda: caught_up(master, slave), what="slave caught up")
    # the slave holds the bytes; its ConsumeQueue is built from them a moment later (a
    # slave behind on that answers an empty queue: what is asserted below is the redirect)
    wait_until(
        lambda: ray.get(slave.min_max_offset.remote("HAL", 0))[1] == 1000,
        what="the slave's ConsumeQueue built",
    )
    consumer = cluster.pull_consumer("g-hal")
    mq = MessageQueue("HAL", "broker-a", 0)
    first = consumer.pull(mq, 0, 10)  # ~290 KB behind: the master points at the slave
    assert first.status is PullStatus.FOUND
    before = status_of(slave)["pulls"]
    second = consumer.pull(mq, first.next_offset, 10)
    assert second.status is PullStatus.FOUND
    assert status_of(slave)["pulls"] == before + 1
    near = consumer.pull(mq, 990, 10)  # caught up: the slave sends it back to the master
    assert near.status is PullStatus.FOUND
    before = status_of(master)["pulls"]
    consumer.pull(mq, 1000, 10)
    assert status_of(master)["pulls"] == before + 1

    # an offset past what the slave's queue holds (its dispatch behind its CommitLog, or
    # the master's newer messages) is not illegal there: the answer keeps the offset and
    # sends the consumer back to the master at once (not held for the 30 s asked), as
    # RocketMQ's PULL_RETRY_IMMEDIATELY does
    ahead = pull_from_wire(ray.get(slave.pull.remote("g-hal", "HAL", 0, 5000, 10, None, 30.0)))
    assert (ahead.status, ahead.next_offset, ahead.suggest_broker_id) == (
        GetStatus.OFFSET_OVERFLOW_ONE,
        5000,
        0,
    )


def test_a_topic_created_just_before_the_master_dies_is_read_from_the_slave(
    make_cluster: Any,
) -> None:
    # the slave's metadata sync never runs again after its first round: whatever it knows
    # of the new topic, it learned with the topic's records
    cluster = make_cluster(
        nameservers=1,
        brokers=GROUP,
        broker_options={
            "broker_role": "SYNC_MASTER",
            "slave_sync_interval_s": 3600.0,
            "ha_slave_timeout_s": 1.5,
        },
    )
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    producer = cluster.producer("p-late")
    sent = [b"late-%03d" % i for i in range(60)]
    results = producer.send_batch([Message("LateTopic", b) for b in sent])  # auto-created now
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    wait_until(lambda: caught_up(master, slave), what="slave caught up")

    kill(master)
    wait_until(lambda: 0 not in members(cluster, "broker-a"), what="master out of the routes")
    consumer = cluster.pull_consumer("g-late")

    def routed() -> list[MessageQueue] | None:
        try:
            return consumer.fetch_subscribe_queues("LateTopic")
        except TopicNotFoundError:  # the slave registers what it learned a moment later
            return None

    queues = wait_until(routed, timeout_s=15, what="the slave's route for the new topic")
    assert sorted(read_all(consumer, "LateTopic", queues)) == sorted(sent)
