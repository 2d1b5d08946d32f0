"""One cluster for the asyncio clients' tests: one NameServer and two brokers with
small stores, short retry levels (a nack-ed message is back in ~0.3 s) and quick
transaction checks (a half message left without an end is checked after ~1 s). Each
test uses topics and groups of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from raymq_testkit import SMALL_STORE, unique_namespace

import actors
from actors import PullStatus


@pytest.fixture(scope="package")
def aio_cluster(
    ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[actors.Cluster]:
    cluster = actors.start_cluster(
        namespace=unique_namespace("aio"),
        nameservers=1,
        brokers=2,
        store_root=str(tmp_path_factory.mktemp("aio")),
        broker_options={
            "store": {**SMALL_STORE, "message_delay_level": "100ms 200ms 300ms 400ms"},
            "heartbeat_interval_s": 2.0,
            "channel_expired_s": 4.0,
            "transaction_check_interval_s": 0.3,
            "transaction_timeout_s": 1.0,
        },
    )
    yield cluster
    cluster.shutdown(timeout_s=10.0)


@pytest.fixture
def stored(aio_cluster: actors.Cluster) -> Callable[[str], list[bytes]]:
    """``stored(topic)``: the bodies of every message the topic's queues hold."""

    def bodies(topic: str) -> list[bytes]:
        consumer = aio_cluster.pull_consumer(f"check-{topic}")
        out: list[bytes] = []
        try:
            for mq in consumer.fetch_subscribe_queues(topic):
                r = consumer.pull(mq, 0, 10_000)
                if r.status is PullStatus.FOUND:
                    out.extend(m.body for m in r.messages)
        finally:
            consumer.close()
        return out

    return bodies
