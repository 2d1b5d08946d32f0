"""A broker the producer isolated after a failure is sent to again as soon as its route
names another master (a promoted slave), not when the isolation's time runs out."""

from __future__ import annotations

import time
from typing import Any

import ray
from raymq_ha_testkit import kill, members
from raymq_testkit import wait_until

import actors
from actors import BrokerSpec
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
