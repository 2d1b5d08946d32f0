"""Configuration values: RocketMQ's defaults, clear errors, files that load."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from actors import (
    BrokerConfig,
    BrokerSpec,
    ClusterConfig,
    NameServerConfig,
    ProducerConfig,
    TopicConfig,
)
from actors.protocol.topic import AUTO_CREATE_TOPIC_KEY, perm_to_string
from storage.errors import InvalidConfigError, InvalidMessageError


def test_topic_config_defaults_and_rocketmq_fields_round_trip() -> None:
    tc = TopicConfig("Orders", 4, 2, 6)
    assert tc.readable and tc.writeable
    data = tc.to_dict()
    assert (
        data["topicName"] == "Orders" and data["readQueueNums"] == 4 and data["writeQueueNums"] == 2
    )
    assert TopicConfig.from_dict(data) == tc
    assert (
        TopicConfig.from_dict({"topic_name": "Orders", "read_queue_nums": 4, "write_queue_nums": 2})
        == tc
    )
    assert perm_to_string(6) == "RW-" and perm_to_string(4) == "R--"


@pytest.mark.parametrize("perm", [0, 1, 3, 5, 7, 8, 99])
def test_topic_perm_must_be_2_4_or_6(perm: int) -> None:
    with pytest.raises(InvalidConfigError, match="perm"):
        TopicConfig("T", perm=perm)


def test_only_the_template_topic_may_inherit() -> None:
    assert TopicConfig(AUTO_CREATE_TOPIC_KEY, perm=7).perm == 7


@pytest.mark.parametrize("nums", [0, -1, 1025, 2.5, True])
def test_queue_nums_are_bounded(nums: object) -> None:
    with pytest.raises(InvalidConfigError, match="read_queue_nums"):
        TopicConfig("T", read_queue_nums=nums)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "a/b", "../x", "x" * 128, "sp ace", None])
def test_bad_topic_names(name: object) -> None:
    with pytest.raises(InvalidMessageError, match="topic"):
        TopicConfig(name)  # type: ignore[arg-type]


def test_broker_config_checks_store_fields_in_the_callers_process() -> None:
    with pytest.raises(InvalidConfigError, match="unknown StoreConfig field"):
        BrokerConfig(store={"no_such": 1})
    with pytest.raises(InvalidConfigError, match="flush_disk_type"):
        BrokerConfig(store={"flush_disk_type": "SOMETIMES"})
    with pytest.raises(InvalidConfigError, match="broker_name"):
        BrokerConfig(broker_name="a b")
    with pytest.raises(InvalidConfigError, match="malloc_trim_threshold"):
        BrokerConfig(malloc_trim_threshold=-1)
    with pytest.raises(InvalidConfigError, match="pop_max_reconsume_times"):
        BrokerConfig(pop_max_reconsume_times=-1)
    with pytest.raises(InvalidConfigError, match="pop_revive_interval_s"):
        BrokerConfig(pop_revive_interval_s=0)
    with pytest.raises(InvalidConfigError, match="grpc_renew_ahead_s"):
        BrokerConfig(grpc_renew_invisible_s=2.0, grpc_renew_ahead_s=2.0)
    with pytest.raises(InvalidConfigError, match="grpc_renew_max_s"):
        BrokerConfig(grpc_renew_max_s=0)
    with pytest.raises(InvalidConfigError, match="grpc_max_pending_calls"):
        BrokerConfig(grpc_max_pending_calls=0)
    for bad in (20, -21, "0", True, 1.5):
        with pytest.raises(InvalidConfigError, match="process_nice"):
            BrokerConfig(process_nice=bad)  # type: ignore[arg-type]
    assert BrokerConfig(process_nice=None).process_nice is None
    assert BrokerConfig(broker_name="broker-x", broker_id=1).actor_name == "broker-x-1"


def test_a_broker_name_may_carry_its_machine_room(tmp_path: Path) -> None:
    """RocketMQ's room@broker names, which the machine-room strategies read."""
    cfg = BrokerConfig(broker_name="hz@broker-a")
    assert cfg.actor_name == "hz@broker-a-0"
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=hz@broker-b\n")
    assert BrokerConfig.from_broker_conf(conf).broker_name == "hz@broker-b"
    for bad in ("a@b@c", "@broker", "hz@", "h z@broker", "hz@bro/ker"):
        with pytest.raises(InvalidConfigError, match="room@name"):
            BrokerConfig(broker_name=bad)


def test_broker_conf_file_loads(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "brokerClusterName=C1\nbrokerName=broker-z\nbrokerId=0\nautoCreateTopicEnable=false\n"
        "flushDiskType=SYNC_FLUSH\nmappedFileSizeCommitLog=1048576\nmaxMessageSize=65536\ndeleteWhen=04\n"
        "storePathRootDir=/data/z\nbrokerRole=SYNC_MASTER\n"
        "transactionCheckInterval=2000\ntransactionTimeOut=500\ntransactionCheckMax=4\n"
    )
    bc = BrokerConfig.from_broker_conf(conf, namespace="ns1")
    assert (bc.cluster_name, bc.broker_name, bc.auto_create_topic_enable) == (
        "C1",
        "broker-z",
        False,
    )
    assert bc.store["flush_disk_type"] == "SYNC_FLUSH"
    assert bc.store["commitlog_file_size"] == 1 << 20
    assert bc.store_dir == "/data/z" and bc.namespace == "ns1"
    assert bc.store_config("/tmp/x", "10.0.0.1:10911").sync_flush
    assert (bc.transaction_check_interval_s, bc.transaction_timeout_s) == (2.0, 0.5)
    assert bc.transaction_check_max == 4


def test_cluster_config_from_yaml_and_toml(tmp_path: Path) -> None:
    yml = tmp_path / "cluster.yaml"
    yml.write_text(
        "namespace: prod\nnameservers: 3\n"
        "nameserver: {broker_expired_s: 60}\n"
        "broker: {auto_create_topic_enable: false, store: {flush_disk_type: SYNC_FLUSH}}\n"
        "brokers:\n  - broker-a\n  - {broker_name: broker-b, node: 10.0.0.2, heartbeat_interval_s: 10}\n"
        "topics:\n  - {topic_name: Orders, read_queue_nums: 8, write_queue_nums: 8}\n  - Audit\n"
    )
    cfg = ClusterConfig.from_file(yml)
    assert cfg.namespace == "prod" and cfg.nameservers == 3
    assert cfg.nameserver == NameServerConfig(broker_expired_s=60)
    assert cfg.brokers[1] == BrokerSpec(
        "broker-b", node="10.0.0.2", overrides={"heartbeat_interval_s": 10}
    )
    assert [t.topic_name for t in cfg.topics] == ["Orders", "Audit"]
    toml = tmp_path / "cluster.toml"
    toml.write_text('namespace = "t"\nnameservers = 1\n[[brokers]]\nbroker_name = "broker-q"\n')
    cfg = ClusterConfig.from_file(toml)
    assert [b.broker_name for b in cfg.brokers] == ["broker-q"]
    assert cfg.broker["auto_create_topic_enable"] is False  # deployments create topics explicitly


def test_cluster_config_rejects_unknown_keys_and_duplicates() -> None:
    with pytest.raises(InvalidConfigError, match="unknown key"):
        ClusterConfig.from_dict({"namespaces": "x"})
    with pytest.raises(InvalidConfigError, match="twice"):
        ClusterConfig(brokers=(BrokerSpec("broker-a"), BrokerSpec("broker-a")))
    with pytest.raises(InvalidConfigError, match="nameservers"):
        ClusterConfig(nameservers=0)


def test_producer_config_limits() -> None:
    with pytest.raises(InvalidConfigError, match="send_timeout_s"):
        ProducerConfig(send_timeout_s=0)
    with pytest.raises(InvalidConfigError, match="retry_times_when_send_failed"):
        ProducerConfig(retry_times_when_send_failed=-1)


def test_consumers_read_committed_and_refuse_read_uncommitted_with_the_reason() -> None:
    from actors.client.push.config import PushConsumerConfig
    from actors.client.simple_consumer import SimpleConsumer
    from actors.config.client import ConsumerConfig

    assert ConsumerConfig(isolation="read_committed").isolation == "read_committed"
    assert PushConsumerConfig().isolation == "read_committed"
    for make in (ConsumerConfig, PushConsumerConfig):
        with pytest.raises(InvalidConfigError, match="RMQ_SYS_TRANS_HALF_TOPIC"):
            make(isolation="read_uncommitted")
        with pytest.raises(InvalidConfigError, match="must be 'read_committed'"):
            make(isolation="READ_COMMITTED")
    with pytest.raises(InvalidConfigError, match="read_uncommitted' is not offered"):
        SimpleConsumer("g", "T", isolation="read_uncommitted")  # before any Ray call


def test_a_push_consumer_takes_the_stream_on_sockets_and_pulls_on_ray_by_default() -> None:
    from actors.client.push.config import PushConsumerConfig
    from actors.config.options import with_options

    assert PushConsumerConfig().deliver_by == "stream"
    assert with_options(PushConsumerConfig(), {"data_path": "ray"}).deliver_by == "pull"
    assert PushConsumerConfig(delivery="pull").deliver_by == "pull"
    with pytest.raises(InvalidConfigError, match='needs data_path="socket"'):
        PushConsumerConfig(delivery="stream", data_path="ray")
    with pytest.raises(InvalidConfigError, match="must be one of"):
        PushConsumerConfig(delivery="push")


def test_client_options_are_checked_by_name() -> None:
    from actors.config.options import with_options

    assert with_options(ProducerConfig(), {"send_timeout_s": 1.0}).send_timeout_s == 1.0
    with pytest.raises(InvalidConfigError, match=r"unknown option\(s\) \['sendtimeout'\]"):
        with_options(ProducerConfig(), {"sendtimeout": 1.0})


def test_broker_conf_keys_raymq_does_not_read_are_each_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conf = tmp_path / "broker-a.properties"
    conf.write_text(  # RocketMQ's conf/2m-2s-sync/broker-a.properties, plus a few more
        "# Licensed to the Apache Software Foundation (ASF) ...\n"
        "brokerClusterName=DefaultCluster\n"
        "brokerName=broker-a\n"
        "brokerId=0\n"
        "deleteWhen=04\n"
        "fileReservedTime=48\n"
        "brokerRole=SYNC_MASTER\n"
        "flushDiskType=ASYNC_FLUSH\n"
        "namesrvAddr=10.0.0.1:9876;10.0.0.2:9876\n"
        f"storePathRootDir={tmp_path / 'store'}\n"
        f"storePathCommitLog={tmp_path / 'store' / 'commitlog-elsewhere'}\n"
        "sendMessageThreadPoolNums=128\n"
        "flushDiskTyp=SYNC_FLUSH\n"
    )
    with caplog.at_level(logging.WARNING, logger="raymq"):
        bc = BrokerConfig.from_broker_conf(conf)
    assert (bc.broker_name, bc.broker_role, bc.store_dir) == (
        "broker-a",
        "SYNC_MASTER",
        str(tmp_path / "store"),
    )
    assert bc.store["flush_disk_type"] == "ASYNC_FLUSH"  # the misspelt key changed nothing
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("raymq.") and r.levelno == logging.WARNING
    ]
    unread = ("namesrvAddr", "storePathCommitLog", "sendMessageThreadPoolNums", "flushDiskTyp")
    for key in unread:  # each named once, never silence
        assert sum(f" {key} " in w for w in warned) == 1, (key, warned)
    assert len(warned) == len(unread), warned  # the keys RayMQ reads are not warned about
    text = "\n".join(warned)
    assert "namesrvAddr is ignored: a broker finds its NameServers as Ray actors" in text
    assert "storePathCommitLog is ignored: the CommitLog is always in <storePathRootDir>" in text
    assert "did you mean flushDiskType?" in text
