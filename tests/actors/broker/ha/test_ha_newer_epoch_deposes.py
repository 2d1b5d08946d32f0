"""A master that restarted in its old epoch, and was accepted, meets a slave whose log
holds a newer epoch: it becomes a slave, and the slave keeps its log.

A group of three: the master goes down, a slave is promoted (a new epoch) and the other
follows it; then the promoted master goes down too and the NameServer restarts,
forgetting the group's epochs. The old master comes back while the slave is paused
past the time a starting master waits for its slaves (``ha_ask_slaves_s``, short here),
so it registers in its old epoch and the NameServer accepts it. When the slave wakes
and asks it for the CommitLog, the master learns from the slave's epochs that a newer
master replaced it (``HAService``'s check, ``MasterSlaveReplication.newer_epoch``):
it becomes a slave, and the slave is never told to cut its log back to the old
master's end. The promoted master, back, is followed by both, and every acknowledged
message is read back once.
"""

from __future__ import annotations

from typing import Any

import ray
from raymq_ha_testkit import commitlog_bytes, kill, members, restart_nameserver, status_of
from raymq_testkit import paused, wait_until

from actors import SendStatus

OPTIONS = {
    "heartbeat_interval_s": 0.5,  # registrations again soon after a NameServer restart
    "ha_ask_slaves_s": 2.0,  # a starting master waits this long for a paused slave
}


def test_a_master_accepted_in_its_old_epoch_becomes_a_slave_of_the_newer_one(
    sync_master_group: Any,
) -> None:
    group = sync_master_group("NewerEpoch", **OPTIONS)
    cluster, send, registered = group.cluster, group.send, group.registered
    master = cluster.broker("broker-a", 0)
    acked = send(b"first", 40)
    m_end = status_of(master)["commitlog_max_offset"]
    for i in (1, 2):
        slave = cluster.broker("broker-a", i)
        wait_until(lambda s=slave: status_of(s)["commitlog_max_offset"] == m_end, what="synced")
    kill(master)
    wait_until(lambda: 0 not in members(cluster, "broker-a"), what="master out of the routes")
    promoted = cluster.admin.promote("broker-a")
    new_id = int(promoted["broker"].rsplit("-", 1)[1])
    other_id = 3 - new_id
    new, other = cluster.broker("broker-a", new_id), cluster.broker("broker-a", other_id)
    wait_until(
        lambda: (
            status_of(other).get("ha_connected")
            and status_of(other)["master"] == promoted["broker"]
        ),
        what="the other slave follows the promoted one",
    )
    acked += send(b"after", 40)  # in the new epoch, with the other slave's copy
    assert {r.status for r in acked} == {SendStatus.SEND_OK}
    new_end = status_of(new)["commitlog_max_offset"]
    wait_until(lambda: status_of(other)["commitlog_max_offset"] == new_end, what="other synced")

    kill(new)
    restart_nameserver(cluster)  # it forgets the group's epochs
    wait_until(
        lambda: registered().get(other_id) == f"broker-a-{other_id}",
        what="the slave registered again",
    )
    other_log = commitlog_bytes(status_of(other)["store_dir"])
    assert status_of(other)["master_epoch"] == promoted["epoch"]
    pid = status_of(other)["pid"]
    with paused(pid):
        master = group.start(0)
        # it waited ha_ask_slaves_s for the paused slave, then registered in its old epoch
        wait_until(
            lambda: status_of(master).get("accepted_as_master") is True,
            what="the old master accepted in its old epoch",
        )
        assert registered().get(0) == "broker-a-0"
        assert status_of(master)["master_epoch"] < promoted["epoch"]
    wait_until(lambda: registered().get(1000) == "broker-a-0", what="old master back as a slave")
    assert 0 not in registered()
    assert status_of(master)["role"] == "SLAVE"
    # the slave kept the newer epoch's log: nothing was cut back to the old master's end
    assert commitlog_bytes(status_of(other)["store_dir"]).startswith(other_log)

    new = group.start(new_id)  # the master of the newer epoch, from its store
    wait_until(lambda: registered().get(0) == f"broker-a-{new_id}", what="new master back")

    def a_slave_in_sync() -> bool:  # a sync master refuses sends until one is
        st = status_of(new)
        return any(s["ack_offset"] >= st["commitlog_max_offset"] for s in st["slaves"].values())

    wait_until(a_slave_in_sync, what="a slave following the new master")
    more = send(b"more", 20)
    assert {r.status for r in more} == {SendStatus.SEND_OK}
    bodies = group.read("g-newer-epoch")
    expected = [b"%s-%04d" % (p, i) for p in (b"first", b"after") for i in range(40)]
    expected += [b"more-%04d" % i for i in range(20)]
    assert sorted(bodies) == sorted(expected)
    end = status_of(new)["commitlog_max_offset"]
    for member in (master, other):
        wait_until(
            lambda member=member: status_of(member)["commitlog_max_offset"] == end,
            what="both follow the promoted master",
        )
    assert commitlog_bytes(status_of(master)["store_dir"]) == commitlog_bytes(
        status_of(new)["store_dir"]
    )


def test_a_master_restarting_while_no_nameserver_answers_asks_again(
    sync_master_group: Any,
) -> None:
    """No NameServer answering is no answer, not "no slaves": a master that took it for
    one would register at once, possibly in an epoch a slave knows to be over."""
    group = sync_master_group("NoNameServer", size=2, heartbeat_interval_s=0.5)
    cluster, send, registered = group.cluster, group.send, group.registered
    acked = send(b"first", 20)
    kill(cluster.broker("broker-a", 0))
    nameserver = cluster.nameserver(0)
    pid = ray.get(nameserver.get_cluster_info.remote())["pid"]
    with paused(pid):
        master = group.start(0)
        wait_until(
            lambda: status_of(master).get("waiting_for") == ["the NameServers"],
            what="the restarted master waiting for a NameServer's answer",
        )
        assert status_of(master)["accepted_as_master"] is not True
    wait_until(lambda: registered().get(0) == "broker-a-0", what="the master registered")
    assert "waiting_for" not in status_of(master)
    acked += send(b"after", 20)
    assert {r.status for r in acked} == {SendStatus.SEND_OK}
    bodies = group.read("g-no-nameserver")
    expected = [b"%s-%04d" % (p, i) for p in (b"first", b"after") for i in range(20)]
    assert sorted(bodies) == sorted(expected)
