"""Half messages live through a failover (issue #24): a SYNC_MASTER acknowledges two
transactional messages its producer left UNKNOW, dies, its slave is promoted, and the
new master's check service resolves both with the producer: the committed one becomes
visible once, the rolled-back one never."""

from __future__ import annotations

import threading
from typing import Any

import ray
from raymq_ha_testkit import kill, members, status_of
from raymq_testkit import drain, wait_until

import actors
from actors import BrokerSpec, LocalTransactionState, TransactionProducer
from storage import Message

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
GROUP = [BrokerSpec("broker-a", 0), BrokerSpec("broker-a", 1)]


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


def test_half_messages_acknowledged_before_a_failover_are_resolved_after_it(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(
        nameservers=1,
        brokers=GROUP,
        topics=[actors.TopicConfig("HATx", 1, 1)],
        broker_options={
            "broker_role": "SYNC_MASTER",
            "slave_sync_interval_s": 0.2,
            "ha_slave_timeout_s": 1.5,
            "heartbeat_interval_s": 1.0,
            "transaction_check_interval_s": 0.3,
            "transaction_timeout_s": 1.0,
        },
    )
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
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
        end = status_of(master)["commitlog_max_offset"]
        wait_until(
            lambda: status_of(slave).get("ha_confirmed_offset", -1) >= end,
            what="the slave told the master acknowledged both half messages",
        )
        kill(master)
        wait_until(lambda: 0 not in members(cluster, "broker-a"), what="master out of routes")
        done = cluster.admin.promote("broker-a")
        assert done["broker"] == "broker-a-1"
        wait_until(lambda: members(cluster, "broker-a").get(0) == "broker-a-1", what="new master")
        listener.ready.set()  # from now the producer answers the new master's checks

        def pending() -> list[dict[str, Any]]:
            return list(ray.get(slave.pending_transactions.remote()))

        wait_until(lambda: not pending(), timeout_s=30, interval_s=0.2, what="both resolved")
        assert sorted(set(listener.checked_by)) == [b"commit-me", b"drop-me"]
        got = [m for msgs in drain(cluster.pull_consumer("g-ha"), "HATx").values() for m in msgs]
        assert [m.body for m in got] == [b"commit-me"]
        assert got[0].msg_id == sent[0].msg_id
    finally:
        producer.close()
