"""A broker the producer isolated after a failure is sent to again as soon as its route
names another master (a promoted slave), not when the isolation's time runs out."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import ray
from raymq_ha_testkit import kill, members
from raymq_testkit import drain, wait_until

import actors
from actors import BrokerSpec, SendStatus
from storage import Message


def test_the_producer_sends_to_the_promoted_master_at_once(make_cluster: Any) -> None:
    cluster = make_cluster(
        nameservers=1,
        brokers=[BrokerSpec("broker-a", 0), BrokerSpec("broker-a", 1), BrokerSpec("broker-b")],
        topics=[actors.TopicConfig("Isolate", 2, 2)],
        broker_options={"slave_sync_interval_s": 0.2, "ha_slave_timeout_s": 1.5},
    )
    # isolations long enough that only the route's change can end this one in time
    producer = cluster.producer(
        "p-isolate", enable_idempotence=False, fault_isolation_s=60.0, send_timeout_s=1.0
    )
    master = cluster.broker("broker-a", 0)
    ray.get(master.inject_fault.remote("hang_after_store", 1000))  # it stops answering
    for i in range(4):  # round robin: some reach broker-a, time out, go to broker-b
        producer.send(Message("Isolate", b"before-%d" % i))
    assert not producer.fault.is_available("broker-a")
    kill(master)
    wait_until(lambda: 0 not in members(cluster, "broker-a"), what="master out of the routes")
    assert cluster.admin.promote("broker-a")["broker"] == "broker-a-1"
    promoted = time.monotonic()

    def lands_on_a() -> bool:
        return producer.send(Message("Isolate", b"after")).message_queue.broker_name == "broker-a"

    wait_until(lands_on_a, timeout_s=10, interval_s=0.05, what="a send to broker-a")
    assert time.monotonic() - promoted < 2.0
    producer.close()


def test_an_idempotent_send_stored_but_not_replicated_is_sent_again_until_it_is(
    make_cluster: Any,
) -> None:
    """SYNC_MASTER whose slave stalls: the master stores the batch and answers
    FLUSH_SLAVE_TIMEOUT. The idempotent producer sends the same run again rather than
    hand the caller a failure that invites a second copy; once the slave is back the
    master answers it from its record, SEND_OK, and the batch is stored once."""
    cluster = make_cluster(
        nameservers=1,
        brokers=[BrokerSpec("broker-a", 0), BrokerSpec("broker-a", 1)],
        topics=[actors.TopicConfig("Durable", 1, 1)],
        broker_options={
            "broker_role": "SYNC_MASTER",
            "slave_sync_interval_s": 0.1,
            "ha_slave_timeout_s": 30.0,  # a stalled slave stays in sync: the master waits
            "sync_replication_timeout_s": 0.5,
        },
    )
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    # each attempt waits sync_replication_timeout_s for the slave: 6 of them outlast the
    # stall below on a busy machine, where the default 3 (~1.8 s) may not
    producer = cluster.producer("p-durable", retry_times_when_send_async_failed=5)
    assert producer.send(Message("Durable", b"warm")).status is SendStatus.SEND_OK
    slave_pid = ray.get(slave.status.remote())["pid"]
    os.kill(slave_pid, signal.SIGSTOP)
    try:
        pending = producer.send_async([Message("Durable", b"d%d" % i) for i in range(5)])
        wait_until(  # stored on the master, and answered FLUSH_SLAVE_TIMEOUT at least once
            lambda: ray.get(master.status.remote())["put_msgs"] >= 6, what="stored"
        )
        time.sleep(0.6)  # the fault's length: past one sync_replication_timeout_s
    finally:
        os.kill(slave_pid, signal.SIGCONT)
    results = pending.result(timeout=30)
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    bodies = [
        m.body for got in drain(cluster.pull_consumer("c-durable"), "Durable").values() for m in got
    ]
    assert bodies == [b"warm"] + [b"d%d" % i for i in range(5)]  # once each
    producer.close()
