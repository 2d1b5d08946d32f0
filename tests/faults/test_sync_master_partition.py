"""A SYNC_MASTER group whose master is cut off from its slave for a few seconds while an
idempotent producer sends: every acknowledged message is read back exactly once.

Nodes: ``a`` (Ray head, the NameServer), ``b`` (the master), ``c`` (the slave) and
``client`` (the producer and the checker), each in its own network namespace. Schedule:
sends for a while, b and c partitioned for ``PARTITION_S``, healed, a quiet period of
``QUIET_S`` with sends going on, then every queue read back from offset 0.
"""

from __future__ import annotations

import time
from typing import Any

from checker import Op, Verdict, check
from workload import Workload

PARTITION_S = 5.0
QUIET_S = 5.0
TOPIC = "FaultSyncMaster"


def test_partitioned_slave_loses_and_duplicates_no_acknowledged_message(
    lab_factory: Any,
) -> None:
    lab = lab_factory(["a", "b", "c", "client"], cpus={"client": 0})
    brokers = [
        {"name": "broker-a", "id": i, "node": lab.nodes[n].resource,
         "store_dir": str(lab.nodes[n].dir / "store" / f"broker-a-{i}")}
        for i, n in enumerate(("b", "c"))
    ]  # fmt: skip
    client = Workload(
        lab,
        lab.nodes["client"],
        {
            "address": lab.address,
            "head_resource": lab.head.resource,
            "namespace": "faults",
            "topic": TOPIC,
            "queues": 4,
            "brokers": brokers,
            "broker_options": {
                "broker_role": "SYNC_MASTER",
                "sync_replication_timeout_s": 2.0,
                "slave_sync_interval_s": 0.3,
                "ha_slave_timeout_s": 2.0,
                "heartbeat_interval_s": 2.0,
            },
            "send_timeout_s": 3.0,
            "batch": 4,
            "pace_s": 0.02,
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
    client.stop()
    history = client.wait_for("history", timeout_s=120)
    assert client.proc.wait(timeout=60) == 0, client.tail()

    verdict = check([Op.from_json(o) for o in history["ops"]], history["read"])
    print()
    print(Verdict.HEADER)
    print(verdict.row(f"sync-master b|c {PARTITION_S:.0f}s"))
    print(f"partition {healed - cut:.1f}s; {verdict.messages} messages sent, {verdict.read} read")
    assert verdict.acknowledged > 0
    assert not verdict.lost, f"acknowledged, never read: {verdict.lost[:20]}"
    assert not verdict.duplicated, f"read more than once: {verdict.duplicated[:20]}"
    assert not verdict.unexpected, f"read, never sent: {verdict.unexpected[:20]}"
