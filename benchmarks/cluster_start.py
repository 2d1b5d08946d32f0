"""How long ``actors.start_cluster`` takes, against the floor of one actor's start.

    python -m benchmarks.cluster_start [--brokers B] [--rounds R]

On a local Ray started here (``address="local"``, 4 logical CPUs, as the tests'):

* the floor: a trivial actor started and answering its first call. Every RayMQ actor
  is a new worker process (Python, ``import ray``, registration with the raylet), so
  no cluster starts faster than one such start;
* ``start_cluster(nameservers=1, brokers=B)`` with small store files, until every
  broker is registered with the NameServer; then its shutdown.

Alternated, R rounds, medians, and the ratio of the cluster's start to the floor (1.0
would mean every actor of the cluster started in parallel at no cost of its own). The
stores go in a temporary directory, deleted. Not a test: figures drift on shared
machines, ratios much less.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid

import ray

import actors

STORE = {
    "commitlog_file_size": 8 << 20,
    "consume_queue_file_entries": 20_000,
    "index_hash_slots": 4099,
    "index_max_entries": 200_000,
}


@ray.remote(num_cpus=0)
class Floor:
    def ping(self) -> str:
        return "pong"


def floor_start() -> float:
    began = time.perf_counter()
    actor = Floor.remote()  # type: ignore[attr-defined]
    ray.get(actor.ping.remote())
    took = time.perf_counter() - began
    ray.kill(actor)
    return took


def cluster_start(brokers: int) -> tuple[float, float]:
    root = tempfile.mkdtemp(prefix="cluster-start-bench-")
    try:
        began = time.perf_counter()
        cluster = actors.start_cluster(
            namespace=f"bench-{uuid.uuid4().hex[:8]}",
            nameservers=1,
            brokers=brokers,
            store_root=root,
            broker_options={"store": STORE},
        )
        up = time.perf_counter() - began
        began = time.perf_counter()
        cluster.shutdown(timeout_s=10.0)
        return up, time.perf_counter() - began
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--brokers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="ERROR")
    try:
        floor_start()  # the first start of a session also loads the class: not counted
        floors, ups, downs = [], [], []
        for r in range(args.rounds):
            floors.append(floor_start())
            up, down = cluster_start(args.brokers)
            ups.append(up)
            downs.append(down)
            print(
                f"round {r + 1}: one actor {floors[-1]:.2f} s, cluster up {up:.2f} s, "
                f"down {down:.2f} s",
                flush=True,
            )
        f, u, d = (statistics.median(x) for x in (floors, ups, downs))
        print(
            f"medians of {args.rounds}: one actor {f:.2f} s; cluster (1 NameServer, "
            f"{args.brokers} brokers) up {u:.2f} s = {u / f:.2f}x one actor; down {d:.2f} s"
        )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
