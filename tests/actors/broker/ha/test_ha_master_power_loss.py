"""A SYNC_MASTER's machine loses power and the master starts again on its own disk before
any slave is promoted: its CommitLog lost the unflushed tail that its slave holds and that
producers were told was stored (SYNC_MASTER acknowledges once a slave has the bytes).

The master copies that tail back from the slave before it takes a write: every
acknowledged message is read back once, no queue offset is given twice, and master and
slave hold the same CommitLog. (Writing again from its own end gave the acknowledged
queue offsets to new messages, and the slave, ahead in the same epoch, was told to cut
the acknowledged tail off.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raymq_ha_testkit import commitlog_bytes, kill, members, status_of
from raymq_testkit import SMALL_STORE, wait_until
from store_faults import cut_commitlog

from actors import SendStatus
from storage import Message
from storage.message_id import parse_offset_msg_id

# nothing flushed by time: what the master's page cache held is what the cut takes
OPTIONS = {"store": {**SMALL_STORE, "flush_interval_commitlog_ms": 600_000}}
TOPIC = "PowerLoss"


def test_a_master_restarted_behind_its_slave_copies_the_acknowledged_tail_first(
    sync_master_group: Any,
) -> None:
    """Two slaves at different ends: the master copies from the one furthest ahead, and
    the other, whose log is a prefix of it, replicates on from its own end (no cut)."""
    group = sync_master_group(TOPIC, **OPTIONS)
    cluster = group.cluster
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    behind = cluster.broker("broker-a", 2)
    producer = cluster.producer("p-power-loss", max_batch_messages=20)

    def send(first: int, last: int) -> list[Any]:
        return [
            r
            for i in range(first, last, 20)
            for r in producer.send_batch(
                [Message(TOPIC, b"before-%04d" % (i + j)) for j in range(20)]
            )
        ]

    acked = send(0, 100)
    m_end = status_of(master)["commitlog_max_offset"]
    wait_until(
        lambda: status_of(behind)["commitlog_max_offset"] == m_end, what="both slaves caught up"
    )
    behind_store = status_of(behind)["store_dir"]
    kill(behind)  # it holds the first 100 messages only
    acked += send(100, 200)
    assert {r.status for r in acked} == {SendStatus.SEND_OK}
    store = Path(status_of(master)["store_dir"])
    slave_store = status_of(slave)["store_dir"]
    kill(master)

    # the power loss: the master's disk keeps the CommitLog up to the record of the 50th
    # acknowledged message; one slave holds all 200, the other the first 100
    cut = min(parse_offset_msg_id(r.offset_msg_id)[1] for r in acked[50:])
    cut_commitlog(store, cut)
    assert len(commitlog_bytes(str(store))) <= cut < m_end < len(commitlog_bytes(slave_store))
    behind = group.start(2)
    wait_until(lambda: 2 in members(cluster, "broker-a"), what="second slave registered again")
    master = group.start(0)
    wait_until(lambda: 0 in members(cluster, "broker-a"), what="master registered again")

    after = cluster.producer("p-power-loss-2").send_batch(
        [Message(TOPIC, b"after-%04d" % i) for i in range(40)]
    )
    assert {r.status for r in after} == {SendStatus.SEND_OK}
    slots = [(r.message_queue.queue_id, r.queue_offset) for r in [*acked, *after]]
    assert len(set(slots)) == len(slots), "a queue offset was acknowledged twice"

    bodies = group.read("g-power-loss")
    expected = [b"before-%04d" % i for i in range(200)] + [b"after-%04d" % i for i in range(40)]
    assert sorted(bodies) == sorted(expected)
    m = status_of(master)
    for member in (slave, behind):
        wait_until(
            lambda member=member: (
                status_of(member)["commitlog_max_offset"] == m["commitlog_max_offset"]
            ),
            what="slave caught up",
        )
    assert commitlog_bytes(m["store_dir"]) == commitlog_bytes(slave_store)
    assert commitlog_bytes(behind_store) == commitlog_bytes(slave_store)
    # the slave behind got only the bytes past its own end: it was not cut back first
    assert status_of(behind)["ha_received_bytes"] == m["commitlog_max_offset"] - m_end


def test_a_slave_back_after_its_master_restarted_without_it_drops_the_old_tail(
    sync_master_group: Any,
) -> None:
    """The master restarts behind its slave while the slave is down, so it cannot copy
    the tail; it takes writes from its own end. When the slave comes back, its old tail
    is cut off at that end before it replicates: the acknowledged messages only it held
    are lost (said in the master's log), but the two CommitLogs never mix."""
    group = sync_master_group(TOPIC, size=2, **OPTIONS)
    cluster = group.cluster
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    acked = cluster.producer("p-slave-away", max_batch_messages=20).send_batch(
        [Message(TOPIC, b"before-%04d" % i) for i in range(100)]
    )
    assert {r.status for r in acked} == {SendStatus.SEND_OK}
    store = Path(status_of(master)["store_dir"])
    kill(master)
    kill(slave)
    cut = min(parse_offset_msg_id(r.offset_msg_id)[1] for r in acked[50:])
    cut_commitlog(store, cut)
    master = group.start(0)
    wait_until(lambda: 0 in members(cluster, "broker-a"), what="master registered again")
    alone = cluster.producer("p-slave-away-2").send_batch(
        [Message(TOPIC, b"alone-%04d" % i) for i in range(30)]
    )  # stored on the master, answered SLAVE_NOT_AVAILABLE: no slave has them
    assert {r.status for r in alone} == {SendStatus.SLAVE_NOT_AVAILABLE}

    slave = group.start(1)
    m = status_of(master)
    wait_until(
        lambda: status_of(slave).get("commitlog_max_offset") == m["commitlog_max_offset"],
        what="slave caught up",
    )
    assert commitlog_bytes(m["store_dir"]) == commitlog_bytes(status_of(slave)["store_dir"])
