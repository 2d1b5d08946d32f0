"""Where a push consumer keeps its offsets (RocketMQ's ``OffsetStore``).

* :class:`RemoteBrokerOffsetStore` (CLUSTERING): the group's offsets live on the
  broker holding each queue. Commits are asynchronous (one call per broker per
  round, answers checked on the next round); reads and the final commit at
  shutdown or when a queue is given up wait. Every commit carries the queue's
  fencing token (``actors.protocol.fencing``): the coordinator's in a coordinated
  group, the fence the broker held when the queue was taken in an uncoordinated
  one (it rises only when the group's offsets are reset). Only queues granted a
  token are committed, and a round's offsets only for queues still held under
  the grant they were read under (:meth:`RemoteBrokerOffsetStore.grants`), so an
  offset read from a queue just dropped can never be sent with its next token.
* :class:`LocalFileOffsetStore` (BROADCASTING): each consumer keeps its own
  offsets in ``<dir>/<group>/<instance name>.json``, written atomically
  (``storage.atomic_file.write_atomically``). The file is locked while the
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
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from actors.client.instance import ClientView
from actors.protocol import rpc as _rpc
from actors.protocol.fencing import FencingToken, OffsetFencedError
from rebalance import MessageQueue
from storage.atomic_file import write_atomically
from storage.errors import InvalidConfigError

log = logging.getLogger("raymq.actors.push_consumer")

OFFSET_CALL_TIMEOUT_S = 10.0
Key = tuple[str, int]  # (topic, queue id)


class OffsetStore(Protocol):
    def read(self, mq: MessageQueue) -> int:
        """The stored offset of ``mq``, or -1 when there is none."""
        ...

    def commit(
        self,
        offsets: Mapping[MessageQueue, int],
        *,
        wait: bool,
        grants: Mapping[MessageQueue, int] | None = None,
    ) -> None:
        """Commit ``offsets``; ``grants`` (from :meth:`grants`, taken before the offsets
        were read): only queues still held under those grants."""
        ...

    def grants(self) -> Mapping[MessageQueue, int] | None:
        """The current grant of each queue holding a fencing token (None: no tokens)."""
        ...

    def close(self) -> None: ...


class RemoteBrokerOffsetStore:
    def __init__(self, ns: ClientView, group: str, client_id: str) -> None:
        self.ns = ns
        self.group = group
        self.client_id = client_id
        self._pending: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        # A coordinated group's fencing tokens: only queues holding one are committed.
        # Commits are sent under _submit, so a queue released under it has every
        # background commit of it sent (and run by its broker) before the caller's next.
        self._tokens: dict[MessageQueue, FencingToken] | None = None
        self._grants: dict[MessageQueue, int] = {}  # queue -> serial of its current grant
        self._serial = 0
        self._submit = threading.Lock()
        # called (from the committing thread) when the broker refused a background
        # commit as fenced: the consumer looks at its queues again at once
        self.on_fenced: Callable[[], None] | None = None

    # ------------------------------------------------------------ fencing tokens
    def use_tokens(self) -> None:
        """Commit only queues granted a token from now on (a coordinated group)."""
        with self._submit:
            if self._tokens is None:
                self._tokens = {}

    def grant(self, mq: MessageQueue, token: FencingToken) -> None:
        """Commit ``mq`` from now on, with ``token`` (the coordinator gave it to us)."""
        with self._submit:
            if self._tokens is None:
                self._tokens = {}
            self._tokens[mq] = token
            self._serial += 1
            self._grants[mq] = self._serial

    def release(self, mqs: Iterable[MessageQueue]) -> dict[MessageQueue, FencingToken]:
        """Stop committing ``mqs`` in the background; return the tokens they had."""
        mqs = list(mqs)
        with self._submit:
            tokens = self._tokens or {}
            for mq in mqs:
                self._grants.pop(mq, None)
            return {mq: tokens.pop(mq) for mq in mqs if mq in tokens}

    def token(self, mq: MessageQueue) -> FencingToken | None:
        """The token ``mq`` is committed with, if it is granted one."""
        with self._submit:
            return (self._tokens or {}).get(mq)

    def grants(self) -> dict[MessageQueue, int] | None:
        with self._submit:
            return None if self._tokens is None else dict(self._grants)

    def commit_sync(
        self, offsets: Mapping[MessageQueue, int], tokens: Mapping[MessageQueue, FencingToken]
    ) -> set[MessageQueue]:
        """Commit now with explicit ``tokens`` and wait; return the queues committed.
        Background commits sent before run first (waited for), so none of them can
        land after this one and move an offset back."""
        with self._submit, self._lock:
            earlier = [ref for _, ref in self._pending]
        if earlier:
            _rpc.wait(earlier, OFFSET_CALL_TIMEOUT_S)
        with self._submit:
            sent = self._send(offsets, tokens)
        done: set[MessageQueue] = set()
        for broker, mqs, ref in sent:
            try:
                _rpc.get(ref, OFFSET_CALL_TIMEOUT_S)
                done.update(mqs)
            except Exception as exc:  # noqa: BLE001 - the caller decides
                log.warning(
                    "group %s: committing %d offset(s) on %s failed: %s",
                    self.group,
                    len(mqs),
                    broker,
                    exc,
                )
        return done

    def read_many(self, mqs: Iterable[MessageQueue]) -> dict[MessageQueue, int]:
        """Stored offsets (-1: none) of ``mqs``, asked in parallel; a queue whose broker
        did not answer is missing from the result."""
        refs = {}
        for mq in mqs:
            try:
                refs[mq] = self._broker(mq).query_offset.remote(self.group, mq.topic, mq.queue_id)
            except Exception as exc:  # noqa: BLE001
                log.warning("group %s: cannot read the offset of %s: %s", self.group, mq, exc)
        out = {}
        for mq, ref in refs.items():
            try:
                out[mq] = int(_rpc.get(ref, OFFSET_CALL_TIMEOUT_S))
            except Exception as exc:  # noqa: BLE001
                log.warning("group %s: cannot read the offset of %s: %s", self.group, mq, exc)
        return out

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
        ready, _ = _rpc.wait(refs, OFFSET_CALL_TIMEOUT_S if wait else 0)
        done = {id(r) for r in ready}
        still: list[tuple[str, Any]] = []
        for broker, ref in pending:
            if id(ref) not in done:
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
                if isinstance(exc, OffsetFencedError) and self.on_fenced is not None:
                    self.on_fenced()
        with self._lock:
            self._pending.extend(still)

    def commit(
        self,
        offsets: Mapping[MessageQueue, int],
        *,
        wait: bool,
        grants: Mapping[MessageQueue, int] | None = None,
    ) -> None:
        self._check_pending(wait=False)
        with self._submit:
            if grants is not None:
                offsets = {
                    mq: off for mq, off in offsets.items() if self._grants.get(mq) == grants.get(mq)
                }
            sent = self._send(offsets, self._tokens)
            with self._lock:
                self._pending.extend((broker, ref) for broker, _, ref in sent)
        if wait:
            self._check_pending(wait=True)

    def _send(
        self,
        offsets: Mapping[MessageQueue, int],
        tokens: Mapping[MessageQueue, FencingToken] | None,
    ) -> list[tuple[str, list[MessageQueue], Any]]:
        """One commit call per broker (``tokens``: only queues holding one, with it)."""
        by_broker: dict[str, tuple[list[MessageQueue], dict[Key, int], dict[Key, FencingToken]]]
        by_broker = {}
        for mq, off in offsets.items():
            if tokens is not None and mq not in tokens:
                continue  # given up: its next owner commits it
            mqs, table, toks = by_broker.setdefault(mq.broker_name, ([], {}, {}))
            mqs.append(mq)
            table[(mq.topic, mq.queue_id)] = off
            if tokens is not None:
                toks[(mq.topic, mq.queue_id)] = tokens[mq]
        sent = []
        for broker, (mqs, table, toks) in by_broker.items():
            try:
                ref = self._broker(mqs[0]).commit_offsets.remote(
                    self.group, table, self.client_id, toks or None
                )
            except Exception as exc:  # noqa: BLE001 - no route now: retried next round
                log.warning("group %s: no broker to commit %s offsets: %s", self.group, broker, exc)
                continue
            sent.append((broker, mqs, ref))
        return sent

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

    def grants(self) -> None:
        return None  # offsets of its own: nothing to fence

    def commit(
        self,
        offsets: Mapping[MessageQueue, int],
        *,
        wait: bool,
        grants: Mapping[MessageQueue, int] | None = None,
    ) -> None:
        with self._lock:
            for mq, off in offsets.items():
                self._table[_key(mq)] = off
            data = json.dumps({"offsetTable": dict(sorted(self._table.items()))}, indent=1)
            write_atomically(self.path, data)

    def close(self) -> None:
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
            self._lock_fd = -1
