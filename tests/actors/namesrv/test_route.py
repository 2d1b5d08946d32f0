"""The NameServer's route table: registration, liveness and expiry, without Ray."""

from __future__ import annotations

from actors.namesrv.route_info import RouteInfoManager
from actors.protocol.route import BrokerRegistration
from actors.protocol.topic import TopicConfig


def reg(
    name: str,
    incarnation: str = "i1",
    topics: dict[str, TopicConfig] | None = None,
    broker_id: int = 0,
) -> BrokerRegistration:
    return BrokerRegistration(
        "C",
        name,
        broker_id,
        f"10.0.0.1:{10911 + broker_id}",
        f"{name}-{broker_id}",
        "ns",
        "node1",
        incarnation,
        topics if topics is not None else {"T": TopicConfig("T", 4, 2)},
    )


def test_route_merges_brokers_and_names_their_actors() -> None:
    routes = RouteInfoManager()
    assert routes.register(reg("broker-a"), 0.0)
    assert routes.register(reg("broker-b"), 0.0)
    route = routes.route("T")
    assert route is not None
    assert [(q.broker_name, q.read_queue_nums, q.write_queue_nums) for q in route.queue_datas] == [
        ("broker-a", 4, 2),
        ("broker-b", 4, 2),
    ]
    assert route.broker("broker-b").master_actor_name() == "broker-b-0"  # type: ignore[union-attr]
    assert routes.topics() == ["T"]
    assert routes.route("missing") is None


def test_reregistration_replaces_the_brokers_topics() -> None:
    routes = RouteInfoManager()
    routes.register(reg("broker-a"), 0.0)
    assert not routes.register(reg("broker-a", topics={"U": TopicConfig("U")}), 1.0)
    assert routes.route("T") is None
    assert routes.route("U") is not None


def test_death_of_an_old_incarnation_does_not_remove_the_new_one() -> None:
    routes = RouteInfoManager()
    routes.register(reg("broker-a", "old"), 0.0)
    assert routes.register(reg("broker-a", "new"), 1.0)
    assert not routes.unregister("broker-a", 0, "old")
    assert routes.route("T") is not None
    assert routes.unregister("broker-a", 0, "new")
    assert routes.route("T") is None


def test_silent_brokers_expire() -> None:
    routes = RouteInfoManager()
    routes.register(reg("broker-a"), 0.0)
    routes.register(reg("broker-b"), 50.0)
    assert routes.scan_expired(100.0, 120.0) == []
    assert routes.scan_expired(121.0, 120.0) == [("broker-a", 0)]
    route = routes.route("T")
    assert route is not None and [q.broker_name for q in route.queue_datas] == ["broker-b"]
    assert [b.broker_name for b in route.broker_datas] == ["broker-b"]


def test_cluster_info_lists_members() -> None:
    routes = RouteInfoManager()
    routes.register(reg("broker-a"), 0.0)
    routes.register(reg("broker-a", broker_id=1), 0.0)
    info = routes.cluster_info(2.0)
    assert info["clusters"] == {"C": ["broker-a"]}
    assert sorted(info["brokers"]["broker-a"]["members"]) == [0, 1]
    assert info["brokers"]["broker-a"]["members"][1]["heartbeat_age_s"] == 2.0
