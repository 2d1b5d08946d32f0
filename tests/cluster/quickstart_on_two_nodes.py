"""The quickstart's traffic on a `ray up` cluster of a head and a worker, then a broker crash.

Run on the head by tests/cluster/test_ray_up.py (``ray exec``), not collected by pytest.
Places brokers as docs/cluster.md tells a user to: each on the node that declares its
``raymq-<broker>`` resource in ``/data/raymq/node-resources.json`` (broker-a on the
head, broker-b on the worker), its store on that node's ``/data/raymq``. Sends and
consumes with the quickstart's own functions (``examples/quickstart.py`` itself puts
both brokers on the caller's node, in a temporary directory). Then SIGKILLs broker-b's
process from its own node, waits for Ray to restart the actor, and reads every message
again from offset 0.

Exits 0 when every message arrived exactly once before and after the crash; prints
``RESULT <json>`` with the brokers' ``status()`` before and after, which the test checks
against the nodes it built (node IPs, store directories on their disks).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import actors

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples import quickstart  # noqa: E402

NAMESPACE = "raymq-two-nodes"
BROKERS = ("broker-a", "broker-b")  # each pinned by its resource raymq-<name>
VICTIM = "broker-b"
STATUS_KEYS = ("node_id", "node_ip", "pid", "store_dir", "abnormal_start", "incarnation")


def wait_for_resources(names: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if all(any(r in n["Resources"] for n in alive) for r in names):
            return
        if time.monotonic() > deadline:
            sys.exit(f"no live node declares one of {names}: {[n['Resources'] for n in alive]}")
        time.sleep(1)


def status(cluster: actors.Cluster, broker: str) -> dict:
    full = ray.get(cluster.broker(broker).status.remote(), timeout=60)
    return {k: full[k] for k in STATUS_KEYS}


@ray.remote(num_cpus=0)
def sigkill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def wait_restarted(handle, incarnation: str, timeout_s: float) -> float:
    """Seconds until the actor answers again with another incarnation."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if ray.get(handle.ping.remote(), timeout=10) != incarnation:
                return time.monotonic() - started
        except ray.exceptions.RayError:  # dead or restarting
            pass
        time.sleep(0.5)
    sys.exit(f"{VICTIM} did not come back within {timeout_s}s")


def wait_routed(cluster: actors.Cluster, broker: str, timeout_s: float) -> None:
    """Until the NameServers route the topic to ``broker`` again and the consumers of
    this process know it. A restarted broker registers anew once it is up; a client
    that fetched the route while it was down skips its queues until the route is
    refreshed (as RocketMQ's clients do until their next poll of the NameServer)."""
    consumer = cluster.pull_consumer("quickstart-consumer")
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        route = consumer.ns.require_route(quickstart.TOPIC, refresh=True)
        if any(bd.broker_name == broker and bd.actor_names for bd in route.broker_datas):
            return
        time.sleep(0.5)
    sys.exit(f"{broker} was not routed again within {timeout_s}s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=5_000)
    args = parser.parse_args()
    n = args.messages

    ray.init(address="auto", logging_level="WARNING", log_to_driver=False)
    wait_for_resources([f"raymq-{b}" for b in BROKERS], timeout_s=60)
    cluster = actors.start_cluster(
        namespace=NAMESPACE,
        nameservers=2,
        brokers=[
            actors.BrokerSpec(b, node=f"raymq-{b}", store_dir=f"/data/raymq/{b}") for b in BROKERS
        ],
        topics=[actors.TopicConfig(quickstart.TOPIC, read_queue_nums=4, write_queue_nums=4)],
        broker_options={  # the quickstart's
            "store": {
                "commitlog_file_size": 64 << 20,
                "index_hash_slots": 500_000,
                "index_max_entries": 2_000_000,
            }
        },
    )
    try:
        before = {b: status(cluster, b) for b in BROKERS}
        quickstart.produce(cluster, n, args.batch)
        _, seen = quickstart.consume(cluster, n)
        problems = quickstart.check(seen, n)
        per_broker = {b: sum(len(v) for k, v in seen.items() if k.startswith(b)) for b in BROKERS}

        victim = cluster.broker(VICTIM)
        ray.get(
            sigkill.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    before[VICTIM]["node_id"], soft=False
                )
            ).remote(before[VICTIM]["pid"]),
            timeout=60,
        )
        restart_s = wait_restarted(victim, before[VICTIM]["incarnation"], timeout_s=120)
        wait_routed(cluster, VICTIM, timeout_s=60)
        after = status(cluster, VICTIM)
        _, seen_after = quickstart.consume(cluster, n)
        problems += [f"after the restart: {p}" for p in quickstart.check(seen_after, n)]
    finally:
        cluster.shutdown()
    result = {
        "before": before,
        "after": after,
        "per_broker": per_broker,
        "restart_s": round(restart_s, 1),
        "consumed_after": sum(map(len, seen_after.values())),
        "problems": problems,
    }
    print("RESULT " + json.dumps(result), flush=True)
    ray.shutdown()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
