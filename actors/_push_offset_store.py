"""Where a push consumer keeps its offsets (RocketMQ's ``OffsetStore``).

* :class:`RemoteBrokerOffsetStore` (CLUSTERING): the group's offsets live on the
  broker holding each queue. Commits are asynchronous (one call per broker per
  round, answers checked on the next round); reads and the final commit at
  shutdown or when a queue is given up wait.
* :class:`LocalFileOffsetStore` (BROADCASTING): each consumer keeps its own
  offsets in ``<dir>/<group>/<instance name>.json``, written atomically (a
  temporary file renamed over the old one). The file is locked while the
  consumer runs, so two live consumers can never share (and corrupt) it.

Offsets are "the next offset to consume", as RocketMQ commits them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import ray

from rebalance import MessageQueue
from storage.errors import InvalidConfigError

from . import _rpc
from ._nameserver_client import NameServerClient

log = logging.getLogger("raymq.actors.push_consumer")

OFFSET_CALL_TIMEOUT_S = 10.0


class OffsetStore(Protocol):
    def read(self, mq: MessageQueue) -> int:
        """The stored offset of ``mq``, or -1 when there is none."""
        ...

    def commit(self, offsets: Mapping[MessageQueue, int], *, wait: bool) -> None: ...

    def close(self) -> None: ...


class RemoteBrokerOffsetStore:
    def __init__(self, ns: NameServerClient, group: str, client_id: str) -> None:
        self.ns = ns
        self.group = group
        self.client_id = client_id
        self._pending: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def _broker(self, mq: MessageQueue) -> Any:
        route = self.ns.require_route(mq.topic)
        if route.broker(mq.broker_name) is None:
            route = self.ns.require_route(mq.topic, refresh=True)
        return self.ns.broker(route, mq.broker_name)

    def read(self, mq: MessageQueue) -> int:
        ref = self._broker(mq).query_offset.remote(self.group, mq.topic, mq.queue_id)
        return int(_rpc.get(ref, OFFSET_CALL_TIMEOUT_S))

    def _check_pending(self, wait: bool) -> None:
        """Log the commits that failed; with ``wait``, first wait for every answer."""
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return
        refs = [ref for _, ref in pending]
        ready, _ = ray.wait(
            refs, num_returns=len(refs), timeout=OFFSET_CALL_TIMEOUT_S if wait else 0
        )
        done = set(ready)
        still: list[tuple[str, Any]] = []
        for broker, ref in pending:
            if ref not in done:
                if wait:
                    log.warning("group %s: offset commit on %s timed out", self.group, broker)
                else:
                    still.append((broker, ref))
                continue
            try:
                _rpc.get(ref)
            except Exception as exc:  # noqa: BLE001 - the next round commits again
                log.warning(
                    "group %s: committing offsets on %s failed: %s", self.group, broker, exc
                )
        with self._lock:
            self._pending.extend(still)

    def commit(self, offsets: Mapping[MessageQueue, int], *, wait: bool) -> None:
        self._check_pending(wait=False)
        by_broker: dict[str, tuple[MessageQueue, dict[tuple[str, int], int]]] = {}
        for mq, off in offsets.items():
            by_broker.setdefault(mq.broker_name, (mq, {}))[1][(mq.topic, mq.queue_id)] = off
        for broker, (mq, table) in by_broker.items():
            try:
                ref = self._broker(mq).commit_offsets.remote(self.group, table, self.client_id)
            except Exception as exc:  # noqa: BLE001 - no route now: retried next round
                log.warning("group %s: no broker to commit %s offsets: %s", self.group, broker, exc)
                continue
            with self._lock:
                self._pending.append((broker, ref))
        if wait:
            self._check_pending(wait=True)

    def close(self) -> None:
        self._check_pending(wait=True)


def _key(mq: MessageQueue) -> str:
    return f"{mq.topic}@{mq.broker_name}@{mq.queue_id}"


class LocalFileOffsetStore:
    def __init__(self, root: str | os.PathLike[str] | None, group: str, instance_name: str) -> None:
        base = Path(root) if root is not None else Path.home() / ".raymq_offsets"
        self.path = base / group / f"{instance_name}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._lock_fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            raise InvalidConfigError(
                f"broadcasting offsets {self.path} are in use by another consumer: give each "
                "broadcasting consumer of a group its own instance_name"
            ) from exc
        self._table: dict[str, int] = {}
        if self.path.exists():
            try:
                raw = json.loads(self.path.read_text(encoding="utf-8"))
                self._table = {str(k): int(v) for k, v in raw.get("offsetTable", {}).items()}
            except (OSError, ValueError, AttributeError) as exc:
                log.error("ignoring unreadable broadcasting offsets %s: %s", self.path, exc)
        log.info("broadcasting offsets of %s in %s (%d queues)", group, self.path, len(self._table))

    def read(self, mq: MessageQueue) -> int:
        with self._lock:
            return self._table.get(_key(mq), -1)

    def commit(self, offsets: Mapping[MessageQueue, int], *, wait: bool) -> None:
        with self._lock:
            for mq, off in offsets.items():
                self._table[_key(mq)] = off
            data = json.dumps({"offsetTable": dict(sorted(self._table.items()))}, indent=1)
            tmp = self.path.with_suffix(".tmp")
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)

    def close(self) -> None:
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
            self._lock_fd = -1
