"""The pure parts of high availability: routes of groups whose master is gone, master
epochs fencing a deposed master, epoch arithmetic, and the broker's HA settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors import BrokerConfig
from actors.broker.ha.epochs import HAState, consistent_point
from actors.namesrv.route_info import RouteInfoManager
from actors.protocol.route import BrokerRegistration
from actors.protocol.topic import TopicConfig
from storage.config_files import JsonConfigFile
from storage.errors import InvalidConfigError


def reg(
    bid: int, actor: str | None = None, epoch: int = 0, topics: tuple[str, ...] = ("T",)
) -> BrokerRegistration:
    name = actor or f"broker-a-{bid}"
    return BrokerRegistration(
        "C",
        "broker-a",
        bid,
        f"10.0.0.1:{10911 + bid}",
        name,
        "ns",
        "node",
        f"inc-{name}-{epoch}",
        {t: TopicConfig(t, 2, 2) for t in topics},
        master_epoch=epoch,
    )


def test_a_group_without_its_master_stays_readable_through_a_slave() -> None:
    routes = RouteInfoManager()
    routes.register(reg(0, topics=("T", "U")), 0.0)
    routes.register(reg(1, topics=("T",)), 0.0)
    assert routes.route("U") is not None  # the master's topics win while it lives
    v = routes.version
    routes.unregister("broker-a", 0)
    assert routes.version > v
    route = routes.route("T")
    assert route is not None and route.broker("broker-a").master_actor_name() is None  # type: ignore[union-attr]
    assert dict(route.broker("broker-a").actor_names) == {1: "broker-a-1"}  # type: ignore[union-attr]
    assert routes.route("U") is None  # the slave's topics now
    routes.unregister("broker-a", 1)
    assert routes.route("T") is None


def test_master_epochs_fence_a_deposed_master() -> None:
    routes = RouteInfoManager()
    routes.register(reg(0), 0.0)
    assert routes.accepts(reg(0))  # the same broker, restarted
    promoted = reg(0, actor="broker-a-1", epoch=1)
    assert routes.accepts(promoted)
    routes.register(promoted, 1.0)
    assert routes.master_of("broker-a") == ("broker-a-1", 1)
    assert not routes.accepts(reg(0))  # the old master, back in epoch 0
    routes.unregister("broker-a", 0)
    assert not routes.accepts(reg(0))  # still refused: it may lack acknowledged writes
    assert routes.accepts(reg(1000, actor="broker-a-0"))  # as a slave it is welcome
    assert routes.accepts(reg(0, actor="broker-a-2", epoch=2))


def test_consistent_point_is_the_end_of_the_newest_shared_epoch() -> None:
    assert consistent_point([], 0, [(0, 0)], 500) == 0  # an empty slave
    assert consistent_point([(0, 0)], 300, [(0, 0)], 500) == 300  # a slave behind
    assert consistent_point([(0, 0)], 800, [(0, 0)], 500) == 500  # ahead: cut to the master
    # a deposed master (epoch 0 to 1000) meets the slave promoted at 900
    assert consistent_point([(0, 0)], 1000, [(0, 0), (1, 900)], 1500) == 900
    assert consistent_point([], 700, [(0, 0), (1, 900)], 1500) == 700  # no recorded epochs
    assert consistent_point([(0, 0), (2, 600)], 800, [(0, 0), (1, 900)], 1500) == 600


def test_ha_state_survives_and_starts_newer_epochs(tmp_path: Path) -> None:
    file = JsonConfigFile(tmp_path / "haState.json")
    state = HAState(file)
    state.adopt([(0, 0), (3, 500), (4, 900)], 700)  # bytes up to 700 only
    assert state.epochs == [(0, 0), (3, 500)] and state.max_epoch == 4
    assert state.begin_epoch(700) == 5
    state.set_role("SYNC_MASTER")
    again = HAState(file)
    assert again.role == "SYNC_MASTER" and again.epochs == [(0, 0), (3, 500), (5, 700)]


def test_broker_roles_and_their_settings(tmp_path: Path) -> None:
    assert BrokerConfig().role == "ASYNC_MASTER"
    assert BrokerConfig(broker_id=1, broker_role="SYNC_MASTER").role == "SLAVE"
    assert BrokerConfig(broker_id=1, broker_role="SLAVE").master_role == "ASYNC_MASTER"
    with pytest.raises(InvalidConfigError, match="broker_role"):
        BrokerConfig(broker_role="MASTER")
    with pytest.raises(InvalidConfigError, match="id 0 is the master"):
        BrokerConfig(broker_role="SLAVE")
    with pytest.raises(InvalidConfigError, match="dledger_peers"):
        BrokerConfig(enable_dledger=True)
    with pytest.raises(InvalidConfigError, match="must include"):
        BrokerConfig(enable_dledger=True, broker_id=3, dledger_peers=(0, 1, 2))
    with pytest.raises(InvalidConfigError, match="dledger_heartbeat_ms"):
        BrokerConfig(enable_dledger=True, dledger_peers=(0, 1, 2), dledger_heartbeat_ms=900)
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "brokerName=broker-b\nbrokerId=0\nbrokerRole=SYNC_MASTER\nslaveReadEnable=true\n"
        "enableDLegerCommitLog=true\ndLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912;"
        "n2-127.0.0.1:40913\n"
    )
    c = BrokerConfig.from_broker_conf(conf)
    assert (c.broker_role, c.slave_read_enable, c.enable_dledger) == ("SYNC_MASTER", True, True)
    assert c.dledger_peers == (0, 1, 2) and c.role == "SLAVE"  # a DLedger member is elected
