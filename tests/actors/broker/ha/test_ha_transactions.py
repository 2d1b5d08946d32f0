"""Transactions live through a failover (issue #24). Half messages: a SYNC_MASTER (or a
DLedger leader) acknowledges two transactional messages its producer left UNKNOW and
dies; its slave is promoted (a new leader elected), and the new master's check service
resolves both with the producer: the committed one becomes visible once, the
rolled-back one never. One-phase commits: a SYNC_MASTER commits a transaction with its
consumer offset alone and dies before its slave copied the offset table; the promoted
slave shows the messages once and the offset moved (re-applied from the commit's
marker). A DLedger group leaves the commit to the coordinator."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import ray
from raymq_ha_testkit import RAFT, kill, members, status_of
from raymq_testkit import drain, wait_until

import actors
from actors import BrokerSpec, LocalTransactionState, TransactionalProducer, TransactionProducer
from rebalance import MessageQueue
from storage import Message

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
TXN = {
    "heartbeat_interval_s": 1.0,
    "transaction_check_interval_s": 0.3,
    "transaction_timeout_s": 1.0,
}
SYNC_MASTER = {
    "broker_role": "SYNC_MASTER",
    "slave_sync_interval_s": 0.2,
    "ha_slave_timeout_s": 1.5,
}


class Listener:
    """Leaves every transaction UNKNOW; answers checks by body once ``ready`` is set."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.lock = threading.Lock()
        self.checked_by: list[bytes] = []

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return UNKNOW

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        if not self.ready.is_set():
            return UNKNOW
        with self.lock:
            self.checked_by.append(msg.body)
        return COMMIT if msg.body == b"commit-me" else ROLLBACK


def _group(
    make_cluster: Any, raft: bool, topics: list[actors.TopicConfig], options: dict[str, Any]
) -> tuple[actors.Cluster, str, Any, dict[str, Any]]:
    """A broker-a group (a master and a slave, or three Raft members): the cluster, its
    master's name and handle, and the other members by name."""
    cluster = make_cluster(
        nameservers=1,
        brokers=[BrokerSpec("broker-a", i) for i in range(3 if raft else 2)],
        topics=topics,
        broker_options={**options, **TXN},
    )
    old = members(cluster, "broker-a").get(0) or wait_until(
        lambda: members(cluster, "broker-a").get(0), what="a master"
    )
    others = {
        name: cluster.broker("broker-a", int(name[-1]))
        for name in (f"broker-a-{i}" for i in range(3 if raft else 2))
        if name != old
    }
    return cluster, old, ray.get_actor(old, namespace=cluster.namespace), others


def _fail_over(
    cluster: actors.Cluster, raft: bool, old: str, master: Any, others: dict[str, Any], held: str
) -> str:
    """Kill the master once its slave confirmed all it wrote (``held``: what that is;
    a Raft leader acknowledged only what a majority held), then wait for its successor
    (promoted, or elected) and return its name."""
    if not raft:
        end = status_of(master)["commitlog_max_offset"]
        [slave] = others.values()
        wait_until(
            lambda: status_of(slave).get("ha_confirmed_offset", -1) >= end,
            what=f"the slave told the master {held}",
        )
    kill(master)
    if raft:
        return str(
            wait_until(
                lambda: (leader := members(cluster, "broker-a").get(0)) != old and leader,
                timeout_s=30,
                what="a new leader",
            )
        )
    wait_until(lambda: 0 not in members(cluster, "broker-a"), what="master out of routes")
    new = str(cluster.admin.promote("broker-a")["broker"])
    wait_until(lambda: members(cluster, "broker-a").get(0) == new, what="new master")
    return new


@pytest.mark.parametrize("mode", ["SYNC_MASTER", "DLEDGER"])
def test_half_messages_acknowledged_before_a_failover_are_resolved_after_it(
    make_cluster: Any, mode: str
) -> None:
    raft = mode == "DLEDGER"
    cluster, old, master, others = _group(
        make_cluster, raft, [actors.TopicConfig("HATx", 1, 1)], RAFT if raft else SYNC_MASTER
    )
    listener = Listener()
    producer = TransactionProducer(
        "pg-ha", listener, namespace=cluster.namespace, check_heartbeat_s=0.5, send_timeout_s=5.0
    )
    try:
        sent = [
            producer.send_message_in_transaction(Message("HATx", body), None)
            for body in (b"commit-me", b"drop-me")
        ]
        assert all(s.local_state is UNKNOW for s in sent)
        new = _fail_over(cluster, raft, old, master, others, "it holds both half messages")
        listener.ready.set()  # from now the producer answers the new master's checks
        successor = others[new]

        def pending() -> list[dict[str, Any]]:
            return list(ray.get(successor.pending_transactions.remote()))

        wait_until(lambda: not pending(), timeout_s=30, interval_s=0.2, what="both resolved")
        assert sorted(set(listener.checked_by)) == [b"commit-me", b"drop-me"]
        consumer = cluster.pull_consumer("g-ha")

        def committed() -> list[Any]:  # a Raft group shows it once a majority holds it
            return [m for msgs in drain(consumer, "HATx").values() for m in msgs]

        wait_until(lambda: committed(), timeout_s=30, interval_s=0.2, what="the commit readable")
        got = committed()
        assert [m.body for m in got] == [b"commit-me"]
        assert got[0].msg_id == sent[0].msg_id
    finally:
        producer.close()


@pytest.mark.parametrize("mode", ["SYNC_MASTER", "DLEDGER"])
def test_a_one_phase_commit_acknowledged_before_a_failover_shows_once_after_it(
    make_cluster: Any, mode: str
) -> None:
    raft = mode == "DLEDGER"
    # the slave copies its master's offset table only on the hour: what it knows of the
    # commit's offset after the failover comes from the commit marker it replicated
    options = {**RAFT} if raft else {**SYNC_MASTER, "slave_sync_interval_s": 3600.0}
    topics = [actors.TopicConfig("HA1pIn", 1, 1), actors.TopicConfig("HA1pOut", 2, 2)]
    cluster, old, master, others = _group(make_cluster, raft, topics, options)
    feed = cluster.producer("pg-ha-1p-feed")
    feed.send_batch([Message("HA1pIn", b"in-%d" % i) for i in range(10)])
    feed.close()
    producer = TransactionalProducer(
        "pg-ha-1p", transactional_id="ha-1p", namespace=cluster.namespace, send_timeout_s=5.0
    )
    mq = MessageQueue("HA1pIn", "broker-a", 0)
    try:
        with producer.begin() as txn:
            txn.send([Message("HA1pOut", b"1p-%d" % i) for i in range(5)])
            if not raft:
                txn.send_offsets("g-ha-1p-in", {mq: 6})
        # a DLedger leader answers that it keeps the two phases: the coordinator decided
        assert (producer.one_phase_commits, producer.one_phase_refused) == (
            (0, 1) if raft else (1, 0)
        )
        # acknowledged: the slave holds the whole group (the answer waited)
        new = _fail_over(cluster, raft, old, master, others, "it holds the commit")
        got = [
            m.body
            for msgs in drain(cluster.pull_consumer("g-ha-1p"), "HA1pOut").values()
            for m in msgs
        ]
        assert sorted(got) == [b"1p-%d" % i for i in range(5)]
        if not raft:
            successor = others[new]
            assert ray.get(successor.query_offset.remote("g-ha-1p-in", "HA1pIn", 0)) == 6
    finally:
        producer.close()
