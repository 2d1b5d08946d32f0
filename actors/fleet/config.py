"""How a consumer fleet sizes itself: :class:`FleetConfig`, checked on construction.

Its own module so that both the fleet's handle (``fleet``) and its control loop
(``controller``) read it without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from actors.config.options import check_process_nice
from storage.errors import InvalidConfigError


@dataclass(frozen=True)
class FleetConfig:
    """How a :class:`ConsumerFleet` sizes itself.

    Autoscaling keeps the size within ``[min_consumers, min(max_consumers, the
    topic's readable queues)]`` (a consumer beyond the queue count would idle): it
    grows when the group's lag per consumer stayed above ``target_lag_per_consumer``
    for ``scale_up_window_s`` and shrinks when it stayed below for
    ``scale_down_window_s``, reading the lag every ``interval_s``. Lag is counted
    from committed offsets, so it trails consumption by up to the consumers'
    ``persist_offset_interval_s``. ``num_cpus`` and ``resources`` (Ray custom
    resources, e.g. ``{"GPU": 1}`` or a node's own resource) are each member actor's
    request: a member no node has room for is pending (in ``status()``) until one
    has, which on an autoscaling cluster makes Ray add a node. A member gets
    ``member_shutdown_timeout_s`` to leave gracefully before it is killed.

    ``process_nice``: the niceness each member lowers its process to when it starts
    (None: it keeps the one Ray gives its workers, nice 15 by default). Its consumer's
    threads then do not wait behind every process at nice 0 on a busy node, as a
    broker's do not (``BrokerConfig.process_nice``, ``docs/latency.md``). Lowering it
    takes root or ``CAP_SYS_NICE``; refused, the member keeps Ray's and logs why.
    """

    min_consumers: int = 1
    max_consumers: int = 8
    target_lag_per_consumer: int = 10_000
    scale_up_window_s: float = 10.0
    scale_down_window_s: float = 30.0
    interval_s: float = 1.0
    num_cpus: float = 1.0
    resources: Mapping[str, float] | None = None
    member_shutdown_timeout_s: float = 45.0
    process_nice: int | None = 0

    def __post_init__(self) -> None:
        check_process_nice("FleetConfig", self.process_nice)
        for name in ("min_consumers", "max_consumers", "target_lag_per_consumer"):
            value = getattr(self, name)
            low = 0 if name == "min_consumers" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise InvalidConfigError(f"FleetConfig.{name}={value!r}: must be an int >= {low}")
        if self.min_consumers > self.max_consumers:
            raise InvalidConfigError(
                f"FleetConfig.min_consumers={self.min_consumers} is above "
                f"max_consumers={self.max_consumers}"
            )
        for name in (
            "scale_up_window_s",
            "scale_down_window_s",
            "interval_s",
            "member_shutdown_timeout_s",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise InvalidConfigError(f"FleetConfig.{name}={value!r}: must be a number > 0")
        cpus = self.num_cpus
        if not isinstance(cpus, (int, float)) or isinstance(cpus, bool) or cpus < 0:
            raise InvalidConfigError(f"FleetConfig.num_cpus={cpus!r}: must be a number >= 0")
        res = self.resources
        if res is not None and (
            not isinstance(res, Mapping)
            or not all(isinstance(k, str) and k for k in res)
            or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                for v in res.values()
            )
            or {"CPU", "memory", "object_store_memory"} & set(res)
        ):
            raise InvalidConfigError(
                f"FleetConfig.resources={res!r}: a mapping of Ray resource names to numbers "
                ">= 0 (CPUs go in num_cpus)"
            )
        if res is not None:
            object.__setattr__(self, "resources", dict(res))

    def request(self) -> dict[str, float]:
        """What each member asks of a node, as Ray counts it."""
        out = {"CPU": float(self.num_cpus)} if self.num_cpus else {}
        out.update((k, float(v)) for k, v in (self.resources or {}).items() if v)
        return out
