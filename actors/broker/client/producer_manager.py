"""The transactional producers a broker can check with (RocketMQ's ``ProducerManager``).

A transactional producer registers a handle of its own (``actors.client.transaction``:
a small relay actor its process takes checks from; or a gRPC client's Telemetry
stream) and renews it; a registration lives ``ttl_s``, at most ``channel_expired_s``.
The check service asks a live one of the half message's group
(``actors.broker.transaction.check_service``).
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

log = logging.getLogger("raymq.actors.broker.client.producer_manager")


class ProducerManager:
    """Producer group -> client id -> (its check handle, when it expires, monotonic)."""

    def __init__(self, expired_s: float) -> None:
        self.expired_s = expired_s
        self._producers: dict[str, dict[str, tuple[Any, float]]] = {}

    def register(self, group: str, client_id: str, handle: Any, ttl_s: float) -> None:
        ttl = min(ttl_s, self.expired_s)
        self._producers.setdefault(group, {})[client_id] = (handle, time.monotonic() + ttl)

    def unregister(self, group: str, client_id: str) -> None:
        self._producers.get(group, {}).pop(client_id, None)

    def live_producer(self, group: str) -> Any | None:
        """The handle of a live producer of ``group``, picked at random; None without one
        (the expired ones are dropped here)."""
        members = self._producers.get(group)
        if not members:
            return None
        now = time.monotonic()
        for client_id, (_, expires) in list(members.items()):
            if expires < now:
                log.info("transactional producer %s of %s expired", client_id, group)
                del members[client_id]
        if not members:
            return None
        return random.choice(list(members.values()))[0]
