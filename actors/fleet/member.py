"""One member of a consumer fleet: a Ray actor hosting one PushConsumer.

Created by the fleet's controller as ``fleet-<group>-m<n>`` with the fleet's
``num_cpus`` (on an autoscaling cluster a member that fits nowhere makes Ray add
a node). It joins the group when :meth:`FleetMember.start` starts its consumer
and leaves it by :meth:`FleetMember.shutdown`, a graceful
``PushConsumer.shutdown`` (running batches finish, offsets are committed, the
group hands its queues over) before the controller kills the actor.
:meth:`FleetMember.wait_closed` stays pending while the member lives, so a
watcher (the controller, the group's coordinator) learns of its end at once:
the call returns on a clean stop and Ray fails it when the actor dies.

Once its consumer runs, a member moves every object it holds then (Ray, RayMQ, the
listener's imports: ~100,000 objects) out of the garbage collector's reach
(``gc.freeze``). A full collection walks every object it tracks while every thread of
the process waits: ~45-60 ms for such a process on the 2-core machine of #23, where
one came every few seconds at 1,000 messages/s and made much of the p99. After the
freeze a collection walks only what came since (~2-3 ms measured).
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import ray

from actors.broker.priority import take_priority
from actors.client.push.consumer import Listener, PushConsumer

log = logging.getLogger("raymq.actors.fleet")

# calls a member must answer while wait_closed calls (the controller's, the
# coordinator's) stay pending
MEMBER_MAX_CONCURRENCY = 8


@dataclass(frozen=True)
class MemberSpec:
    """What every member of one fleet consumes, and with which consumer settings."""

    group: str
    topic: str
    subscription: str
    listener: Listener
    namespace: str
    nameservers: list[str] | None
    consumer_options: dict[str, Any]
    process_nice: int | None = 0  # FleetConfig.process_nice


class FleetMember:
    """Ray actor class: ``ray.remote(FleetMember)``, created by the fleet controller."""

    def __init__(self, spec: MemberSpec) -> None:
        self.group = spec.group
        self.topic = spec.topic
        self.spec = spec
        self._consumer: PushConsumer | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._started_at = 0.0
        take_priority(spec.process_nice, f"fleet member of {spec.group}")  # not Ray's 15

    def start(self) -> str:
        """Start the consumer (it joins the group); returns its client id."""
        spec = self.spec
        with self._lock:
            if self._consumer is not None:
                return self._consumer.client_id
            consumer = PushConsumer(
                spec.group,
                spec.topic,
                spec.subscription,
                spec.listener,
                namespace=spec.namespace,
                nameservers=spec.nameservers,
                # the group's coordinator keeps a wait_closed call pending on this actor
                actor_handle=ray.get_runtime_context().current_actor,
                **spec.consumer_options,
            )
            consumer.start()
            self._consumer = consumer
            self._started_at = time.monotonic()
            gc.collect()  # what is garbage now is not frozen with the rest
            gc.freeze()  # see the module doc
        log.info("fleet member of %s started: %s", spec.group, consumer.client_id)
        return consumer.client_id

    def status(self) -> dict[str, Any]:
        """The consumer's counters plus the queues it owns (``topic:broker:queue``)."""
        consumer = self._consumer
        if consumer is None:
            return {"client_id": None, "queues": [], "assigned": []}
        out = consumer.status()
        out["assigned"] = [
            f"{mq.topic}:{mq.broker_name}:{mq.queue_id}" for mq in consumer.assigned_queues()
        ]
        out["uptime_s"] = round(time.monotonic() - self._started_at, 3)
        out["gc_frozen_objects"] = gc.get_freeze_count()
        out["process_nice"] = os.getpriority(os.PRIO_PROCESS, 0)  # the actor's thread
        return out

    def shutdown(self) -> dict[str, Any]:
        """Leave the group gracefully; returns the consumer's final counters."""
        with self._lock:
            consumer, self._consumer = self._consumer, None
        stats: dict[str, Any] = {}
        try:
            if consumer is not None:
                consumer.shutdown()
                stats = consumer.stats.snapshot()
        finally:
            self._closed.set()
        return stats

    def wait_closed(self) -> None:
        """Returns when the member shuts down; Ray fails the call if the actor dies."""
        self._closed.wait()

    def ping(self) -> bool:
        return True

    def node_id(self) -> str:
        """The node this member runs on (answered as soon as Ray has placed it)."""
        return ray.get_runtime_context().get_node_id()
