"""The producer's queue selection on its own: routes from a stand-in for the NameServers,
no Ray."""

from __future__ import annotations

import pytest

from actors.client.fault import LatencyFaultTolerance
from actors.client.queue_selector import QueueSelector
from actors.config.client import ProducerConfig
from actors.protocol.route import BrokerData, QueueData, TopicRouteData
from actors.protocol.topic import AUTO_CREATE_TOPIC_KEY, PERM_READ, PERM_WRITE
from rebalance import MessageQueue
from storage.errors import BrokerUnavailableError, PermissionDeniedError, TopicNotFoundError

RW = PERM_READ | PERM_WRITE


def broker(name: str, live: bool = True) -> BrokerData:
    actors = {0: f"{name}-0"} if live else {}
    return BrokerData("c", name, {0: "10.0.0.1:10911"} if live else {}, actors, "ns")


def route(topic: str, *queues: tuple[str, int, int], dead: tuple[str, ...] = ()) -> TopicRouteData:
    names = sorted({b for b, _, _ in queues})
    return TopicRouteData(
        topic,
        tuple(QueueData(b, n, n, perm) for b, n, perm in queues),
        tuple(broker(b, live=b not in dead) for b in names),
    )


class Routes:
    """What the selector asks of the NameServers."""

    def __init__(self, *routes: TopicRouteData) -> None:
        self.routes = {r.topic: r for r in routes}
        self.invalidated: list[str] = []

    def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData | None:
        return self.routes.get(topic)

    def require_route(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        found = self.routes.get(topic)
        if found is None:
            raise TopicNotFoundError(f"topic={topic!r}")
        return found

    def invalidate(self, topic: str) -> None:
        self.invalidated.append(topic)


def selector(*routes: TopicRouteData, **options: object) -> QueueSelector:
    return QueueSelector(Routes(*routes), LatencyFaultTolerance(), ProducerConfig(**options))  # type: ignore[arg-type]


def test_round_robin_skips_the_avoided_and_the_unavailable_broker() -> None:
    s = selector(route("T", ("a", 2, RW), ("b", 2, RW)))
    picked = [s.select("T", None, None).mq for _ in range(4)]
    assert picked == [MessageQueue("T", b, q) for b, q in (("a", 0), ("a", 1), ("b", 0), ("b", 1))]
    assert {s.select("T", "a", None).mq.broker_name for _ in range(4)} == {"b"}
    s.fault.update("b", 0.0, failed=True)
    assert {s.select("T", None, None).mq.broker_name for _ in range(4)} == {"a"}
    s.fault.update("a", 0.0, failed=True)  # both out: the one back first, b
    assert {s.select("T", None, None).mq.broker_name for _ in range(4)} == {"b"}


def test_a_sharding_key_always_picks_the_same_queue() -> None:
    s = selector(route("T", ("a", 4, RW), ("b", 4, RW)))
    first = s.select("T", None, "order-42").mq
    assert all(s.select("T", "a", "order-42").mq == first for _ in range(10))


def test_write_queues_are_those_of_live_writeable_brokers() -> None:
    s = selector()
    queues = s.write_queues(
        route("T", ("a", 2, RW), ("b", 2, PERM_READ), ("c", 2, RW), dead=("c",))
    )
    assert queues == [MessageQueue("T", "a", 0), MessageQueue("T", "a", 1)]
    with pytest.raises(PermissionDeniedError):
        s.write_queues(route("R", ("a", 2, PERM_READ)))
    with pytest.raises(BrokerUnavailableError):
        s.write_queues(route("D", ("a", 2, RW), dead=("a",)))


def test_a_topic_without_a_route_gets_a_synthetic_one_until_it_is_created() -> None:
    template = route(AUTO_CREATE_TOPIC_KEY, ("a", 8, RW), ("b", 2, RW))
    s = selector(template, default_topic_queue_nums=4)
    picked = s.select("New", None, None)
    assert picked.auto_n == 4
    assert {(qd.broker_name, qd.write_queue_nums) for qd in picked.route.queue_datas} == {
        ("a", 4),
        ("b", 2),
    }
    assert s.route("New") == (picked.route, 4)  # the same synthetic route until created
    s.created("New")
    assert s.ns.invalidated == ["New"]  # type: ignore[attr-defined]
    assert s.route("New")[0] is not picked.route
    with pytest.raises(TopicNotFoundError):
        selector().select("Nowhere", None, None)


class LateRoutes(Routes):
    """A NameServer view where the topic shows up between two questions: the first
    asks before any broker has it, the refresh after."""

    def __init__(self, late: TopicRouteData) -> None:
        super().__init__()
        self.late = late

    def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData | None:
        if topic == self.late.topic and refresh:
            self.routes[topic] = self.late
        return self.routes.get(topic)

    def require_route(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        self.route(topic, refresh=refresh)
        return super().require_route(topic, refresh=refresh)


def test_a_topic_that_appears_while_no_template_exists_is_sent_to() -> None:
    # the fault lab's seed 8: no route, no auto-create template, then the refresh found
    # the topic: that send failed with an AssertionError
    late = route("T", ("a", 2, RW))
    s = QueueSelector(LateRoutes(late), LatencyFaultTolerance(), ProducerConfig())  # type: ignore[arg-type]
    picked = s.select("T", None, None)
    assert (picked.route, picked.auto_n) == (late, 0)
    assert picked.mq.broker_name == "a"
