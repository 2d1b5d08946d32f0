"""What every part of the admin client shares: its share of the client instance, the
live masters, and one call made on many brokers at once."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from actors.client import instance as _instance
from actors.protocol import rpc as _rpc
from actors.protocol.names import DEFAULT_NAMESPACE
from storage.errors import (
    BrokerUnavailableError,
    InvalidMessageError,
)

log = logging.getLogger("raymq.actors.admin")

ADMIN_TIMEOUT_S = 30.0
INDEX_TIME_RESOLUTION_MS = 1000  # an IndexFile entry keeps its store time in seconds
RESET_POSITIONS = ("earliest", "latest")


class AdminBase:
    def __init__(
        self, namespace: str = DEFAULT_NAMESPACE, nameservers: Sequence[str] | None = None
    ) -> None:
        self.namespace = namespace
        # control calls only: brokers through Ray, routes read afresh where they matter
        self._lease = _instance.share(
            self, namespace, nameservers, data_path="ray", route_ttl_s=None
        )
        self.instance = self._lease.instance
        self.ns = self._lease.view

    # ------------------------------------------------------------ brokers
    def brokers(self) -> dict[str, Any]:
        """Live master brokers by broker name (as the NameServers see them)."""
        return self.ns.master_brokers()

    def _brokers_for(self, names: Sequence[str] | None) -> dict[str, Any]:
        live = self.brokers()
        if names is None:
            if not live:
                raise BrokerUnavailableError(f"no live broker in namespace {self.namespace!r}")
            return live
        missing = [n for n in names if n not in live]
        if missing:
            raise BrokerUnavailableError(f"broker(s) {missing} are not live; live: {sorted(live)}")
        return {n: live[n] for n in names}

    def _on_all(self, brokers: dict[str, Any], method: str, *args: Any) -> dict[str, Any]:
        refs = {name: getattr(h, method).remote(*args) for name, h in brokers.items()}
        return {name: _rpc.get(ref, ADMIN_TIMEOUT_S) for name, ref in refs.items()}

    def _topic_brokers(self, topic: str) -> dict[str, Any]:
        route = self.ns.require_route(topic, refresh=True)
        return {
            qd.broker_name: self.ns.broker(route, qd.broker_name)
            for qd in route.queue_datas
            if route.broker(qd.broker_name) is not None
        }


def epoch_ms(value: int | datetime, what: str = "time") -> int:
    """Epoch milliseconds from an int (ms) or a datetime (naive: local time), exactly."""
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.astimezone()
        return (aware - _EPOCH) // timedelta(milliseconds=1)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise InvalidMessageError(f"{what}={value!r}: epoch milliseconds (an int >= 0) or a datetime")


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
