"""The master/slave group the HA tests stop and start member by member: broker-a, a
SYNC_MASTER (id 0) and its slaves, on a store root of its own so a member can be
started again by hand from its store (``sync_master_group``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray
from raymq_ha_testkit import broker_config, members, read_all, start_broker

import actors
from actors import BrokerConfig, BrokerSpec
from storage import Message

SYNC_MASTER = {
    "broker_role": "SYNC_MASTER",
    "slave_sync_interval_s": 0.2,
    "ha_slave_timeout_s": 1.5,
}
"""A SYNC_MASTER group with replication timings short enough for tests."""


@dataclass
class HaGroup:
    """broker-a's members (ids ``0..size-1``), one topic of two queues on them, and
    what a test needs to start a member again from its store."""

    cluster: actors.Cluster
    root: str
    topic: str
    options: dict[str, Any]
    size: int

    def broker(self, broker_id: int) -> Any:
        return self.cluster.broker("broker-a", broker_id)

    def config(self, broker_id: int) -> BrokerConfig:
        """The config ``make_cluster`` gave the member (to start it again by hand)."""
        return broker_config(self.cluster, self.root, "broker-a", broker_id, **self.options)

    def start(self, broker_id: int) -> Any:
        """Start the member again from its store and wait until it answers."""
        return start_broker(self.config(broker_id))

    def send(self, prefix: bytes, count: int) -> list[Any]:
        """``count`` messages ``<prefix>-0000``.. in batches of 20 by a new producer;
        the results of every send."""
        producer = self.cluster.producer(f"p-{prefix.decode()}", max_batch_messages=20)
        out = []
        for i in range(0, count, 20):
            batch = [Message(self.topic, prefix + b"-%04d" % (i + j)) for j in range(20)]
            out += producer.send_batch(batch)
        return out

    def registered(self) -> dict[int, str]:
        """The group's members on the NameServer; {} while it restarts."""
        try:
            return members(self.cluster, "broker-a")
        except ray.exceptions.RayActorError:
            return {}

    def read(self, group: str) -> list[bytes]:
        """Every body of the topic, from offset 0, by consumer group ``group``."""
        return read_all(self.cluster.pull_consumer(group), self.topic)


@pytest.fixture
def sync_master_group(make_cluster: Any, tmp_path: Path) -> Callable[..., HaGroup]:
    """``sync_master_group(topic, size=3, **broker_options)``: an :class:`HaGroup` of
    ``size`` members (a master and ``size - 1`` slaves) with ``SYNC_MASTER`` timings
    (``broker_options`` override them), one NameServer, shut down after the test."""

    def make(topic: str, size: int = 3, **options: Any) -> HaGroup:
        opts = {**SYNC_MASTER, **options}
        root = str(tmp_path / topic)
        cluster = make_cluster(
            nameservers=1,
            brokers=[BrokerSpec("broker-a", i) for i in range(size)],
            topics=[actors.TopicConfig(topic, 2, 2)],
            store_root=root,
            broker_options=opts,
        )
        return HaGroup(cluster, root, topic, opts, size)

    return make
