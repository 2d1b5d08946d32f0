"""A SYNC_MASTER group whose master is cut off from its slave for a few seconds while an
idempotent producer sends: every acknowledged message is read back exactly once.

Nodes: ``a`` (Ray head, the NameServer), ``b`` (the master), ``c`` (the slave) and
``client`` (the producer and the checker), each in its own network namespace (``d`` idle:
the lab is shared with other tests). Schedule:
sends for a while, b and c partitioned for ``PARTITION_S``, healed, a quiet period of
``QUIET_S`` with sends going on, then every queue read back from offset 0.
"""

from __future__ import annotations

import time
from typing import Any

from checker import Verdict
from workload import SHARED_NODES, assert_exactly_once, brokers_on, finish, start_workload

LAB_GROUP = "shared"  # one lab for the tests on SHARED_NODES (conftest.py)

PARTITION_S = 5.0
QUIET_S = 5.0
TOPIC = "FaultSyncMaster"


def test_partitioned_slave_loses_and_duplicates_no_acknowledged_message(
    lab_factory: Any,
) -> None:
    lab = lab_factory(SHARED_NODES, cpus={"client": 0})
    client = start_workload(
        lab,
        TOPIC,
        brokers_on(lab, "broker-a", ["b", "c"]),
        {
            "broker_role": "SYNC_MASTER",
            "sync_replication_timeout_s": 2.0,
            "slave_sync_interval_s": 0.3,
            "ha_slave_timeout_s": 2.0,
            "heartbeat_interval_s": 2.0,
        },
    )
    ready = client.wait_for("ready", timeout_s=120)
    master_pid = ready["brokers"]["broker-a-0"]["pid"]
    slave_pid = ready["brokers"]["broker-a-1"]["pid"]
    assert master_pid in lab.nodes["b"].actor_pids("Broker"), "the master is not on b"
    assert slave_pid in lab.nodes["c"].actor_pids("Broker"), "the slave is not on c"
    client.wait_for("progress", timeout_s=60, until=lambda e: e["acked"] >= 200)

    lab.partition(["b"], ["c"])
    cut = time.monotonic()
    time.sleep(PARTITION_S)  # the fault schedule
    lab.heal()
    healed = time.monotonic()
    time.sleep(QUIET_S)
    client.wait_for("progress", timeout_s=30, until=lambda e: e["acked"] > 0)
    _, verdict = finish(client)
    print()
    print(Verdict.HEADER)
    print(verdict.row(f"sync-master b|c {PARTITION_S:.0f}s"))
    print(f"partition {healed - cut:.1f}s; {verdict.messages} messages sent, {verdict.read} read")
    assert_exactly_once(verdict)
