"""Elastic consumer fleets: a consumer group as a set of Ray actors that scales with lag.

    fleet = ConsumerFleet("my-group", "Orders", listener, min_consumers=1, max_consumers=8,
                          target_lag_per_consumer=10_000, namespace="raymq",
                          consumer_options={"consume_batch_size": 32})
    fleet.status()     # members, per-member queues, lag, consume rates, scaling events
    fleet.scale(4)     # pin the size by hand (pauses autoscaling) ...
    fleet.autoscale()  # ... until autoscaling is resumed
    fleet.shutdown()   # every member leaves gracefully, then the fleet is gone

Each member is a Ray actor hosting one :class:`actors.PushConsumer` (CLUSTERING)
with ``listener`` and ``consumer_options``, created with ``num_cpus`` and
``resources``: a member no node has room for is PENDING in :meth:`ConsumerFleet.status`
(with what it waits for) and starts when a node with room comes; on an
autoscaling cluster it makes Ray add one. The
control loop is the detached actor ``fleet-<group>`` (see
:mod:`.controller` for why an actor rather than a driver thread): the
fleet outlives the program that started it, and :meth:`ConsumerFleet.attach`
finds it from any other. Members join the group by starting and leave it by a
graceful ``PushConsumer.shutdown`` before their actor is killed, so queue moves
go through the group's rebalance (its coordinator, where there is one) with
their offsets committed.

``listener`` runs inside the member actors: it is pickled (cloudpickle), and
state it keeps is per member.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import ray

from actors.client.push.consumer import Listener, PushConsumerConfig
from actors.config.options import with_options
from actors.fleet.config import FleetConfig
from actors.fleet.controller import FleetController
from actors.fleet.member import MemberSpec
from actors.protocol import rpc as _rpc
from actors.protocol.names import DEFAULT_NAMESPACE, fleet_actor_name
from storage.codec import validate_topic
from storage.errors import InvalidConfigError, InvalidMessageError, RayMQError

log = logging.getLogger("raymq.actors.fleet")

CALL_TIMEOUT_S = 30.0
CONTROLLER_MAX_CONCURRENCY = 16


class ConsumerFleet:
    """A consumer group run as a fleet of consumer actors (starts on construction).

    ``options`` are :class:`FleetConfig` fields (``min_consumers``,
    ``max_consumers``, ``target_lag_per_consumer``, ``num_cpus``, windows ...);
    ``consumer_options`` are :class:`actors.PushConsumerConfig` fields for every
    member (the model is always CLUSTERING).
    """

    def __init__(
        self,
        group: str,
        topic: str,
        listener: Listener,
        subscription: str = "*",
        *,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        consumer_options: dict[str, Any] | None = None,
        config: FleetConfig | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(group, str) or not group:
            raise InvalidMessageError(f"consumer group={group!r}: must be a non-empty str")
        validate_topic(topic)
        if not callable(listener):
            raise InvalidConfigError(f"listener={listener!r}: must be callable")
        consumer_options = dict(consumer_options or {})
        for name in ("listener", "namespace", "nameservers", "config", "actor_handle"):
            if name in consumer_options:
                raise InvalidConfigError(f"consumer_options[{name!r}]: give it to the fleet")
        consumer = with_options(PushConsumerConfig(), consumer_options)  # fails early
        if not consumer.clustering:
            raise InvalidConfigError("consumer_options['model']: a fleet consumes CLUSTERING")
        self.group, self.topic, self.namespace = group, topic, namespace
        self.config = with_options(config or FleetConfig(), options)
        name = fleet_actor_name(group)
        try:
            # an ActorHandle; Any, as Ray's typing of a class's methods knows no ``.remote``
            controller: Any = _rpc.service_actor(
                FleetController, name, namespace, max_concurrency=CONTROLLER_MAX_CONCURRENCY
            ).remote(
                MemberSpec(
                    group,
                    topic,
                    subscription,
                    listener,
                    namespace,
                    list(nameservers) if nameservers else None,
                    consumer_options,
                    self.config.process_nice,
                ),
                self.config,
            )
        except ValueError as exc:  # Ray: the name is taken
            raise RayMQError(
                f"a fleet for group {group!r} already runs in namespace {namespace!r} "
                f"(actor {name!r}): use ConsumerFleet.attach"
            ) from exc
        self._controller = controller
        _rpc.get(controller.ping.remote(), CALL_TIMEOUT_S)
        log.info("fleet %s started on %s (%s)", name, topic, self.config)

    @classmethod
    def attach(cls, group: str, namespace: str = DEFAULT_NAMESPACE) -> ConsumerFleet:
        """A handle on the fleet of ``group`` that some program started."""
        try:
            controller = ray.get_actor(fleet_actor_name(group), namespace=namespace)
        except ValueError as exc:
            raise RayMQError(f"no fleet for group {group!r} in namespace {namespace!r}") from exc
        fleet = cls.__new__(cls)
        fleet._controller = controller
        fleet.group, fleet.namespace = group, namespace
        st = _rpc.get(controller.status.remote(), CALL_TIMEOUT_S)
        fleet.topic = st["topic"]
        fleet.config = FleetConfig(
            min_consumers=st["min_consumers"], max_consumers=st["max_consumers"]
        )
        return fleet

    # ------------------------------------------------------------ control
    def status(self) -> dict[str, Any]:
        """``members`` (name, state: PENDING, STARTING, RUNNING or STOPPING, node, client
        id, queues, consumed, rate; a PENDING one says what it is ``waiting_for``),
        ``assignment`` (member → queues), ``lag`` and ``lag_per_consumer``,
        ``consume_rate`` (msg/s), ``size``, ``running``, ``pending``, ``target_size``,
        ``autoscale`` and the recent scaling ``events``."""
        return dict(_rpc.get(self._controller.status.remote(), CALL_TIMEOUT_S))

    def scale(self, n: int, *, wait: bool = True, timeout_s: float = 60.0) -> int:
        """Pin the fleet at ``n`` members (0..``max_consumers``, at most one per readable
        queue) and pause autoscaling until :meth:`autoscale`; with ``wait``, return once
        every member runs or is pending for want of a node with room (``status()``
        shows it; it starts when such a node comes). Members still pending after
        ``timeout_s`` are logged, not raised; a member placed but not started by then
        raises. Returns the size set."""
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= self.config.max_consumers:
            raise InvalidConfigError(
                f"scale(n={n!r}): must be an int in 0..max_consumers={self.config.max_consumers}"
            )
        size = int(_rpc.get(self._controller.scale.remote(n), CALL_TIMEOUT_S))
        if not wait:
            return size
        ref = self._controller.wait_settled.remote(size, timeout_s)
        settled = _rpc.get(ref, timeout_s + CALL_TIMEOUT_S)
        members = self.status()["members"]
        pending = [m for m in members if m["state"] == "PENDING"]
        if pending:
            log.warning(
                "fleet %s: %d of %d member(s) pending, waiting for %s",
                self.group,
                len(pending),
                len(members),
                pending[0]["waiting_for"],
            )
        if not settled and any(m["state"] in ("STARTING", "STOPPING") for m in members):
            raise RayMQError(
                f"fleet {self.group}: not settled at {size} after {timeout_s}s: {members}"
            )
        return size

    def autoscale(self, enabled: bool = True) -> None:
        """Resume lag-driven sizing (or pause it, keeping the current size)."""
        _rpc.get(self._controller.autoscale.remote(enabled), CALL_TIMEOUT_S)

    def wait_stable(self, n: int | None = None, timeout_s: float = 60.0) -> None:
        """Wait until every member runs (and there are ``n``); raises on timeout (the
        status in the message says what pending members wait for)."""
        ok = _rpc.get(self._controller.wait_stable.remote(n, timeout_s), timeout_s + CALL_TIMEOUT_S)
        if not ok:
            raise RayMQError(
                f"fleet {self.group}: not stable at {n if n is not None else 'its size'} "
                f"after {timeout_s}s: {self.status()['members']}"
            )

    def shutdown(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """Every member leaves gracefully, then the controller goes; the final status."""
        try:
            final = dict(_rpc.get(self._controller.shutdown.remote(), timeout_s))
        finally:
            ray.kill(self._controller, no_restart=True)
        log.info("fleet %s shut down", fleet_actor_name(self.group))
        return final

    def __enter__(self) -> ConsumerFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
