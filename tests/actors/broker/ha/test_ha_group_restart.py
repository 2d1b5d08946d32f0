"""A whole SYNC_MASTER group goes down and comes back in an order that favours a slave
behind what the master acknowledged.

A slave was stopped while the other one acknowledged the master's writes; then master
and slave went down too. The slave that comes back first lacks the acknowledged tail:
promoted, it would start a new epoch at its end, and the master and the other slave,
returning, would cut the acknowledged messages off to follow it. The keeper's automatic
promotion waits until every slave of the group is registered again, and a slave keeps
the offset its master said was acknowledged across a restart, so it refuses a promotion
that would lose it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import ray
from raymq_ha_testkit import commitlog_bytes, kill, members, restart_nameserver, status_of
from raymq_testkit import SMALL_STORE, paused, wait_until
from store_faults import cut_commitlog

from actors import SendStatus
from actors.client.admin import Admin
from actors.keeper import BrokerKeeper, KeptBroker
from actors.protocol.errors import PromotionRefusedError

OPTIONS = {
    "heartbeat_interval_s": 0.5,  # registrations again soon after a NameServer restart
    "store": {**SMALL_STORE, "flush_interval_commitlog_ms": 600_000},
}
TOPIC = "GroupRestart"
GONE_NODE = "f" * 56  # a node id Ray never gave: the node the keeper saw die


def test_the_keeper_does_not_promote_a_slave_behind_while_the_other_is_away(
    sync_master_group: Any,
) -> None:
    group = sync_master_group(TOPIC, **OPTIONS)
    cluster, send, registered = group.cluster, group.send, group.registered
    master = cluster.broker("broker-a", 0)
    ahead, behind = cluster.broker("broker-a", 1), cluster.broker("broker-a", 2)
    acked = send(b"first", 60)
    m_end = status_of(master)["commitlog_max_offset"]
    wait_until(lambda: status_of(behind)["commitlog_max_offset"] == m_end, what="caught up")
    kill(behind)
    acked += send(b"second", 60)  # acknowledged with the other slave's copy
    assert {r.status for r in acked} == {SendStatus.SEND_OK}
    kill(master)
    kill(ahead)

    configs = [group.config(i) for i in range(3)]
    here = ray.get_runtime_context().get_node_id()
    behind = group.start(2)
    wait_until(lambda: 2 in members(cluster, "broker-a"), what="the slave behind registered")
    keeper = BrokerKeeper(
        cluster.namespace,
        [
            KeptBroker(configs[0], None, GONE_NODE),  # its node is dead: an orphan group
            KeptBroker(configs[1], None, GONE_NODE),
            KeptBroker(configs[2], None, here),
        ],
        auto_promote=True,
    )
    keeper.tend()
    assert keeper.promotions == []
    assert status_of(behind)["role"] == "SLAVE"
    assert "broker-a-1" in asyncio.run(keeper.status())["refused"]["broker-a"]

    ahead = group.start(1)
    wait_until(lambda: 1 in members(cluster, "broker-a"), what="the slave ahead registered")
    keeper.tend()  # every slave answers now: the one holding the most is promoted
    assert [p["broker"] for p in keeper.promotions] == ["broker-a-1"]
    wait_until(
        lambda: (
            status_of(behind).get("ha_connected") and status_of(behind)["master"] == "broker-a-1"
        ),
        what="the slave behind follows the promoted one",
    )
    after = send(b"after", 20)  # acknowledged with the slave behind's copy
    assert {r.status for r in after} == {SendStatus.SEND_OK}

    # the new master goes down, and a NameServer restarted forgets the group's epochs:
    # the old master, back, would be accepted in its old epoch and take writes that the
    # slave (cut back to follow it) and then the new master's return would drop; the
    # slave's log says a newer epoch began, so it becomes a slave before it registers,
    # also when the slave is slow to say so (paused here: a loaded machine, a GC pause)
    kill(ahead)
    restart_nameserver(cluster)  # it forgets the group's epochs
    wait_until(lambda: registered().get(2) == "broker-a-2", what="the slave re-registered")
    pid = status_of(behind)["pid"]
    with paused(pid):
        master = group.start(0)
        wait_until(
            lambda: status_of(master).get("waiting_for") == ["broker-a-2"],
            what="the old master waiting for the paused slave's answer",
        )
        assert 0 not in registered()
    wait_until(lambda: registered().get(1000) == "broker-a-0", what="old master back as a slave")
    assert 0 not in registered()
    assert status_of(master)["role"] == "SLAVE"

    ahead = group.start(1)  # the master of the newer epoch, from its store
    wait_until(lambda: registered().get(0) == "broker-a-1", what="new master back")
    more = send(b"more", 20)
    assert {r.status for r in more} == {SendStatus.SEND_OK}
    bodies = group.read("g-group-restart")
    expected = [b"%s-%04d" % (p, i) for p in (b"first", b"second") for i in range(60)]
    expected += [b"%s-%04d" % (p, i) for p in (b"after", b"more") for i in range(20)]
    assert sorted(bodies) == sorted(expected)
    new_end = status_of(ahead)["commitlog_max_offset"]
    for member in (master, behind):
        wait_until(
            lambda member=member: status_of(member)["commitlog_max_offset"] == new_end,
            what="the others follow the promoted slave",
        )
    assert commitlog_bytes(status_of(master)["store_dir"]) == commitlog_bytes(
        status_of(ahead)["store_dir"]
    )


def test_a_slave_restarted_behind_the_acknowledged_offset_refuses_promotion(
    sync_master_group: Any,
) -> None:
    """Its unflushed tail lost with its machine's power: the slave still knows, from its
    ``haState.json``, how far the master acknowledged, and is not promoted below it."""
    group = sync_master_group(TOPIC, size=2, **OPTIONS)
    cluster = group.cluster
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    acked = group.send(b"first", 60)
    assert {r.status for r in acked} == {SendStatus.SEND_OK}
    m_end = status_of(master)["commitlog_max_offset"]
    wait_until(lambda: status_of(slave)["ha_confirmed_saved"] == m_end, what="confirmed saved")
    store = Path(status_of(slave)["store_dir"])
    kill(master)
    kill(slave)
    cut_commitlog(store, m_end // 2)  # the power loss takes its unflushed tail

    slave = group.start(1)
    wait_until(lambda: 1 in members(cluster, "broker-a"), what="slave registered")
    st = status_of(slave)
    assert st["commitlog_max_offset"] < m_end == st["ha_confirmed_offset"]
    with pytest.raises(PromotionRefusedError, match="acknowledged SYNC_MASTER offset"):
        Admin(cluster.namespace, list(cluster.nameserver_names)).promote("broker-a")
    assert status_of(slave)["role"] == "SLAVE"

    master = group.start(0)  # back as master: it holds every acknowledged one
    wait_until(lambda: status_of(slave)["commitlog_max_offset"] == m_end, what="slave caught up")
    bodies = group.read("g-slave-power-loss")
    assert sorted(bodies) == sorted(b"first-%04d" % i for i in range(60))
