"""Sub-agents as Ray actors, each with its own task queue: a lite topic.

    python examples/lite_sub_agents.py

A planner splits a job into tasks for three sub-agents (researcher, coder, reviewer)
and sends each task to the agent's lite topic in the parent ``Agents`` of type LITE.
Each ``SubAgent`` actor subscribes its own lite topic in the consumer group
``agents``, so it alone consumes it, takes its tasks in the order they were sent,
acknowledges them, and reports each result to the planner's own lite topic
``planner``. Adding an agent is a new name, not a new topic.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

import ray

import actors
from actors.client.lite import LiteConsumer, LiteProducer

PARENT = "Agents"
STOP = "<stop>"
PLAN = {
    "researcher": ["find the papers on lite topics", "summarise the quota rules"],
    "coder": ["write the parser", "write the tests", "fix the failing test"],
    "reviewer": ["review the parser", "review the tests"],
}


def wait_for(receive, timeout_s: float = 30.0) -> list:
    """Batches from ``receive(wait_s=...)`` once there are some (the broker holds each
    receive until a send to one of its lite topics, or ``wait_s``)."""
    deadline = time.monotonic() + timeout_s
    while not (batches := receive(wait_s=min(5.0, max(0.0, deadline - time.monotonic())))):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing received in {timeout_s} s")
    return batches


@ray.remote(num_cpus=0)
class SubAgent:
    """Consumes the lite topic named after it, one task after another, until STOP."""

    def __init__(self, name: str, namespace: str) -> None:
        self.name = name
        self.tasks = LiteConsumer("agents", PARENT, namespace=namespace)
        self.results = LiteProducer(PARENT, namespace=namespace)
        self.owned = self.tasks.subscribe(f"agent-{name}")

    def work(self) -> int:
        done = 0
        while True:
            for batch in wait_for(self.tasks.receive):
                for message in batch.messages:
                    task = message.body.decode()
                    if task == STOP:
                        self.tasks.ack(batch)
                        self.tasks.close()
                        self.results.close()
                        return done
                    self.results.send("planner", f"{self.name}: done {task!r}".encode())
                    done += 1
                self.tasks.ack(batch)  # the group resumes after these


def run(cluster: actors.Cluster) -> dict[str, list[str]]:
    """Start the agents, plan, and collect their reports: per agent, its results in
    the order it did them."""
    cluster.admin.create_lite_topic(PARENT, quota=10_000, ttl_ms=600_000)
    agents = {name: SubAgent.remote(name, cluster.namespace) for name in PLAN}
    inbox = LiteConsumer("planner", PARENT, namespace=cluster.namespace)
    inbox.subscribe("planner")
    with LiteProducer(PARENT, namespace=cluster.namespace) as planner:
        ray.get([a.__ray_ready__.remote() for a in agents.values()])  # subscribed
        working = {name: a.work.remote() for name, a in agents.items()}
        step = 0
        while any(step < len(tasks) for tasks in PLAN.values()):  # interleaved, in order
            planner.send_batch(
                [
                    (f"agent-{n}", tasks[step].encode())
                    for n, tasks in PLAN.items()
                    if step < len(tasks)
                ]
            )
            step += 1
        planner.send_batch([(f"agent-{n}", STOP.encode()) for n in PLAN])
        counts = ray.get(list(working.values()), timeout=60)
    reports: dict[str, list[str]] = {name: [] for name in PLAN}
    expected = sum(counts)
    while sum(map(len, reports.values())) < expected:
        for batch in wait_for(inbox.receive):
            for m in batch.messages:
                agent, _, result = m.body.decode().partition(": ")
                reports[agent].append(result)
            inbox.ack(batch)
    inbox.close()
    return reports


def main() -> int:
    ray.init(address="local", include_dashboard=False, logging_level="WARNING")
    root = tempfile.mkdtemp(prefix="raymq-lite-agents-")
    cluster = actors.start_cluster(namespace="lite-agents-demo", store_root=root)
    try:
        reports = run(cluster)
        for agent, results in reports.items():
            print(f"{agent} (lite topic agent-{agent}):")
            for result in results:
                print(f"  {result}")
        ok = all(reports[a] == [f"done {t!r}" for t in PLAN[a]] for a in PLAN)
        print("every agent did its tasks in the order planned" if ok else "out of order!")
        return 0 if ok else 1
    finally:
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
