"""NameServer liveness: heartbeats keep brokers in the routes, silence removes them."""

from __future__ import annotations

import time
from typing import Any

import ray
from raymq_testkit import wait_until

from actors import NameServer, NameServerConfig, TopicConfig
from actors.protocol.route import BrokerRegistration


def test_silent_broker_expires_heartbeating_broker_stays(make_cluster: Any) -> None:
    expired_s = 1.5
    cluster = make_cluster(
        nameservers=1,
        brokers=1,
        topics=["Beat"],
        nameserver_config=NameServerConfig(broker_expired_s=expired_s, scan_interval_s=0.1),
        broker_options={"heartbeat_interval_s": 0.3},
    )
    ns = cluster.nameserver(0)
    silent = BrokerRegistration(
        "DefaultCluster",
        "broker-silent",
        0,
        "10.9.9.9:10911",
        "broker-silent-0",
        cluster.namespace,
        "nowhere",
        "once",
        {"Beat": TopicConfig("Beat", 2, 2)},
    )
    ray.get(ns.register_broker.remote(silent))
    registered = time.monotonic()

    def brokers() -> list[str]:
        route = ray.get(ns.get_route.remote("Beat"))
        return sorted(q.broker_name for q in route.queue_datas)

    assert brokers() == ["broker-a", "broker-silent"]
    wait_until(lambda: brokers() == ["broker-a"], timeout_s=10, what="silent broker expired")
    took = time.monotonic() - registered
    assert expired_s - 0.1 <= took < expired_s + 1.0
    # broker-a registered before the silent one: only its heartbeats kept it in the route
    info = ray.get(ns.get_cluster_info.remote())
    assert info["uptime_s"] > expired_s
    assert info["brokers"]["broker-a"]["members"][0]["heartbeat_age_s"] < expired_s


def test_nameserver_actor_alone(ray_cluster: Any) -> None:
    ns = ray.remote(NameServer).options(num_cpus=0).remote(NameServerConfig(), 7)
    try:
        assert ray.get(ns.ping.remote()) == 7
        assert ray.get(ns.get_route.remote("None")) is None
        assert ray.get(ns.get_all_topics.remote()) == []
        info = ray.get(ns.get_cluster_info.remote())
        assert info["brokers"] == {} and info["nameserver"] == 7
    finally:
        ray.kill(ns)
