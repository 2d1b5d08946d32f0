"""The PullConsumer: explicit queues and offsets, long polling, broker-side offsets.

A pull names (queue, offset, max count); the broker answers with stored
records as one blob, which is decoded here (lazily, on first access to
``messages``) and filtered exactly by tag text (the broker filters by tag hash
only). Offsets a group commits live on the broker that holds the queue.
"""

from __future__ import annotations

import concurrent.futures
import enum
import logging
import struct
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

from actors.client import instance as _instance
from actors.config.client import ConsumerConfig
from actors.config.options import with_options
from actors.protocol import rpc as _rpc
from actors.protocol.names import DEFAULT_NAMESPACE
from actors.protocol.topic import is_readable
from actors.protocol.wire import pull_request_to_wire, pulls_from_wire
from rebalance import MessageQueue
from storage.codec import FIXED_LEN, MAGIC, body_slices, decode_records
from storage.errors import (
    BrokerUnavailableError,
    InvalidMessageError,
    PermissionDeniedError,
    StoreCorruptedError,
)
from storage.message import GetStatus, MessageExt, RawGetResult, record_starts_of
from storage.subscription import parse_subscription

log = logging.getLogger("raymq.actors.consumer")


_SIZE_MAGIC_BODYLEN = struct.Struct(">iI76xi")  # TOTALSIZE, MAGIC, ..., BODYLEN at 84
_BODY_AT = 88


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


# keyed by the members' values: an Enum member's hash is a Python call (enum.__hash__)
_PULL_STATUS = {
    GetStatus.FOUND._value_: PullStatus.FOUND,
    GetStatus.NO_MATCHED_MESSAGE._value_: PullStatus.NO_MATCHED_MSG,
    GetStatus.NO_MATCHED_LOGIC_QUEUE._value_: PullStatus.NO_NEW_MSG,
    GetStatus.NO_MESSAGE_IN_QUEUE._value_: PullStatus.NO_NEW_MSG,
    GetStatus.OFFSET_OVERFLOW_ONE._value_: PullStatus.NO_NEW_MSG,
    GetStatus.OFFSET_TOO_SMALL._value_: PullStatus.OFFSET_ILLEGAL,
    GetStatus.OFFSET_OVERFLOW_BADLY._value_: PullStatus.OFFSET_ILLEGAL,
    GetStatus.OFFSET_FOUND_NULL._value_: PullStatus.OFFSET_ILLEGAL,
}


class PullResult:
    """One pull's answer. ``data`` holds ``count`` records as stored; ``messages``
    decodes them on first access and keeps those whose tags match exactly.
    ``OFFSET_ILLEGAL`` means the offset was outside [min_offset, max_offset]:
    ``next_offset`` is where to continue.

    The records of a large answer stay where Ray put them (its object store) until
    ``data`` or ``messages`` is first read, which copies them out once; ``bodies``
    cuts the bodies straight from there. So a reader that keeps a pull ahead asks for
    the next one without first copying megabytes, and a dropped result copies nothing."""

    __slots__ = (
        "queue",
        "store_status",
        "_data",
        "count",
        "next_offset",
        "min_offset",
        "max_offset",
        "_tags",
        "_check_crc",
        "_messages",
        "_sizes",
    )

    def __init__(
        self, queue: MessageQueue, raw: RawGetResult, tags: frozenset[str] | None, check_crc: bool
    ) -> None:
        self.queue = queue
        self.store_status = raw.status
        self._data = raw.data  # bytes, or a view of Ray's copy (pulls_from_wire(copy=False))
        self.count = raw.count
        self._sizes = raw.sizes  # the records' sizes: where they start, reckoned when wanted
        self.next_offset = raw.next_offset
        self.min_offset = raw.min_offset
        self.max_offset = raw.max_offset
        self._tags = tags
        self._check_crc = check_crc
        self._messages: list[MessageExt] | None = None

    @property
    def data(self) -> bytes:
        if not isinstance(self._data, bytes):
            self._data = bytes(self._data)  # and lets go of Ray's copy
        return self._data

    def __getstate__(self) -> Any:  # a view does not pickle: its bytes do
        self._data = self.data
        return None, {name: getattr(self, name) for name in self.__slots__ if hasattr(self, name)}

    @property
    def messages(self) -> list[MessageExt]:
        if self._messages is None:
            msgs = (
                decode_records(self.data, check_crc=self._check_crc, sizes=self._sizes)
                if self.count
                else []
            )
            if self._tags is not None:
                tags = self._tags
                msgs = [m for m in msgs if m.properties.get("TAGS") in tags]
            self._messages = msgs
        return self._messages

    @property
    def bodies(self) -> list[bytes]:
        """Just the bodies, in order: a fast path that skips building ``MessageExt``s
        when no tag filter applies."""
        if self._tags is not None or self._messages is not None:
            return [m.body for m in self.messages]
        starts = record_starts_of(self._sizes)
        if starts is not None and self.count:
            # copies the bodies out; any buffer does, though storage annotates bytes
            return body_slices(cast(bytes, self._data), starts)
        data, out, pos, end = self.data, [], 0, len(self.data)
        unpack = _SIZE_MAGIC_BODYLEN.unpack_from
        while pos < end:
            size, magic, body_len = unpack(data, pos)
            if magic != MAGIC or size < FIXED_LEN or pos + size > end:
                raise StoreCorruptedError(
                    f"pulled record at {pos}: bad size {size} or magic {magic:#x}"
                )
            out.append(data[pos + _BODY_AT : pos + _BODY_AT + body_len])
            pos += size
        return out

    @property
    def status(self) -> PullStatus:
        status = _PULL_STATUS[self.store_status._value_]
        if status is PullStatus.FOUND and self._tags is not None and not self.messages:
            return PullStatus.NO_MATCHED_MSG
        return status

    def __repr__(self) -> str:
        return (
            f"PullResult({self.queue.topic}:{self.queue.broker_name}:{self.queue.queue_id} "
            f"{self.store_status.value} count={self.count} next={self.next_offset} "
            f"[{self.min_offset}, {self.max_offset}])"
        )


class _Pending(NamedTuple):
    """Pull calls on their way: (request indexes, ObjectRef) per broker call."""

    refs: list[tuple[list[int], Any]]
    subscribed: frozenset[str] | None
    timeout: float


class PullConsumer(_instance.SharedClient):
    """Pulls given queues from given offsets; commits and fetches the group's offsets."""

    def __init__(
        self,
        group: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        config: ConsumerConfig | None = None,
        **options: Any,
    ) -> None:
        config = with_options(config or ConsumerConfig(), options)
        self._join("consumer", group, namespace, nameservers, config, _instance.READ)
        self.config = config
        self._read_from: dict[MessageQueue, int] = {}  # broker id a broker suggested for pulls
        self._waiter: concurrent.futures.ThreadPoolExecutor | None = None  # async pulls

    # ------------------------------------------------------------ queues
    def fetch_subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues on every live broker."""
        route = self.ns.require_route(topic)
        live = {bd.broker_name for bd in route.broker_datas if bd.actor_names}  # or a slave
        queues = [
            MessageQueue(topic, qd.broker_name, q)
            for qd in route.queue_datas
            if is_readable(qd.perm) and qd.broker_name in live
            for q in range(qd.read_queue_nums)
        ]
        if not queues and route.queue_datas:
            raise PermissionDeniedError(
                f"topic={topic!r}: no broker allows reading (perm forbids read)"
            )
        return queues

    def _broker(self, mq: MessageQueue, prefer_id: int = 0) -> Any:
        """The group's master, or a slave when the master is gone (or, for pulls, when the
        broker suggested one: ``slave_read_enable``)."""
        if not isinstance(mq, MessageQueue):
            raise InvalidMessageError(f"queue={mq!r}: expected a rebalance.MessageQueue")
        route = self.ns.require_route(mq.topic)
        if route.broker(mq.broker_name) is None:
            route = self.ns.require_route(mq.topic, refresh=True)
        try:
            return self.ns.broker_for_read(route, mq.broker_name, prefer_id)
        except BrokerUnavailableError:  # a member left since the route was cached
            route = self.ns.require_route(mq.topic, refresh=True)
            return self.ns.broker_for_read(route, mq.broker_name, prefer_id)

    def _call(self, mq: MessageQueue, method: str, *args: Any, timeout: float | None = None) -> Any:
        return self._wait(mq, self._start(mq, method, *args), timeout)

    def _start(self, mq: MessageQueue, method: str, *args: Any) -> Any:
        prefer = self._read_from.get(mq, 0) if method == "pull" else 0
        return getattr(self._broker(mq, prefer), method).remote(*args)

    def _wait(self, mq: MessageQueue, ref: Any, timeout: float | None) -> Any:
        try:
            return _rpc.get(ref, timeout or self.config.pull_timeout_s)
        except Exception as exc:
            if _rpc.is_retriable(exc):
                self.ns.invalidate(mq.topic)
                raise BrokerUnavailableError(
                    f"broker {mq.broker_name!r} did not answer for {mq.topic}:{mq.queue_id}: "
                    f"{type(exc).__name__}"
                ) from exc
            raise

    # ------------------------------------------------------------ pulling
    def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_count: int = 32,
        *,
        tags: str | None = None,
        long_poll_s: float = 0.0,
    ) -> PullResult:
        """Up to ``max_count`` messages of ``mq`` from ``offset``. With ``long_poll_s`` > 0
        the broker holds a pull that finds nothing new for up to that long."""
        return self.pull_many([(mq, offset)], max_count, tags=tags, long_poll_s=long_poll_s)[0]

    def pull_many(
        self,
        requests: Sequence[tuple[MessageQueue, int]],
        max_count: int = 32,
        *,
        tags: str | None = None,
        long_poll_s: float = 0.0,
    ) -> list[PullResult]:
        """Pull several queues at once: one call per broker, all in flight together.

        With ``long_poll_s`` > 0 a broker that has nothing new for any of its queues
        holds the call until one of them gets a message (or the time is up).
        """
        return self._answers(requests, self._start_pulls(requests, max_count, tags, long_poll_s))

    def pull_async(
        self,
        mq: MessageQueue,
        offset: int,
        max_count: int = 32,
        *,
        tags: str | None = None,
        long_poll_s: float = 0.0,
    ) -> concurrent.futures.Future[PullResult]:
        """:meth:`pull` without waiting (RocketMQ's ``pullAsync``); see :meth:`pull_many_async`."""
        requests = [(mq, offset)]
        pending = self._start_pulls(requests, max_count, tags, long_poll_s)
        return self._in_background(lambda: self._answers(requests, pending)[0])

    def pull_many_async(
        self,
        requests: Sequence[tuple[MessageQueue, int]],
        max_count: int = 32,
        *,
        tags: str | None = None,
        long_poll_s: float = 0.0,
    ) -> concurrent.futures.Future[list[PullResult]]:
        """:meth:`pull_many` without waiting: the calls are on their way to the brokers
        when this returns, and the future gives the same answers (or raises the same
        errors, bad arguments at once). A reader keeps one pull ahead by asking for
        the next offsets before it works through the answers it has::

            ahead = consumer.pull_many_async(requests, 256)
            while ...:
                results = ahead.result()
                ahead = consumer.pull_many_async(
                    [(r.queue, r.next_offset) for r in results], 256)
                handle(results)  # while the brokers read the next ones
        """
        requests = list(requests)
        pending = self._start_pulls(requests, max_count, tags, long_poll_s)
        return self._in_background(lambda: self._answers(requests, pending))

    def _in_background(self, wait: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Runs ``wait`` (a wait on calls already started) on the consumer's waiter
        threads, so errors and timeouts are exactly the synchronous call's."""
        if self._waiter is None:
            self._waiter = concurrent.futures.ThreadPoolExecutor(
                max_workers=4, thread_name_prefix=f"raymq-pull-{self.group}"
            )
        return self._waiter.submit(wait)

    def _start_pulls(
        self,
        requests: Sequence[tuple[MessageQueue, int]],
        max_count: int,
        tags: str | None,
        long_poll_s: float,
    ) -> _Pending:
        if not isinstance(max_count, int) or max_count <= 0:
            raise InvalidMessageError(f"max_count={max_count!r}: must be an int > 0")
        subscribed = parse_subscription(tags)
        calls: dict[tuple[str, int], list[int]] = {}  # (broker, member id) -> request indexes
        for i, (mq, _) in enumerate(requests):
            if not isinstance(mq, MessageQueue):
                raise InvalidMessageError(f"queue={mq!r}: expected a rebalance.MessageQueue")
            calls.setdefault((mq.broker_name, self._read_from.get(mq, 0)), []).append(i)
        refs = []
        for (_, prefer), indexes in calls.items():
            mq = requests[indexes[0]][0]
            batch = [
                (requests[i][0].topic, requests[i][0].queue_id, requests[i][1]) for i in indexes
            ]
            ref = self._broker(mq, prefer).pull_packed.remote(
                pull_request_to_wire(
                    self.group, batch, max_count, tags, long_poll_s, self.client_id
                )
            )
            refs.append((indexes, ref))
        return _Pending(refs, subscribed, self.config.pull_timeout_s + long_poll_s)

    def _answers(
        self, requests: Sequence[tuple[MessageQueue, int]], pending: _Pending
    ) -> list[PullResult]:
        results: list[PullResult | None] = [None] * len(requests)
        for indexes, ref in pending.refs:
            wire = self._wait(requests[indexes[0]][0], ref, pending.timeout)
            answers = pulls_from_wire(wire, copy=False)  # PullResult copies when asked to
            for i, raw in zip(indexes, answers):
                mq = requests[i][0]
                suggested = getattr(raw, "suggest_broker_id", -1)  # see protocol.wire.PullAnswer
                if suggested > 0:
                    self._read_from[mq] = suggested
                elif suggested == 0:
                    self._read_from.pop(mq, None)
                results[i] = PullResult(mq, raw, pending.subscribed, self.config.check_crc)
        return results  # type: ignore[return-value]  # every slot was filled

    # ------------------------------------------------------------ offsets
    def commit(self, mq: MessageQueue, offset: int) -> None:
        """Store ``offset`` (the next one to consume) for this group on the queue's broker."""
        self.commit_offsets({mq: offset})

    def commit_offsets(self, offsets: dict[MessageQueue, int]) -> None:
        by_broker: dict[str, tuple[MessageQueue, dict[tuple[str, int], int]]] = {}
        for mq, off in offsets.items():
            entry = by_broker.setdefault(mq.broker_name, (mq, {}))
            entry[1][(mq.topic, mq.queue_id)] = off
        pending = [
            (mq, self._start(mq, "commit_offsets", self.group, table, self.client_id))
            for mq, table in by_broker.values()
        ]
        for mq, ref in pending:
            self._wait(mq, ref, None)

    def fetch_offset(self, mq: MessageQueue) -> int:
        """The group's committed offset of ``mq``, or -1 when it has none."""
        return self._call(mq, "query_offset", self.group, mq.topic, mq.queue_id)

    def fetch_offsets(self, topic: str) -> dict[MessageQueue, int]:
        out: dict[MessageQueue, int] = {}
        queues = self.fetch_subscribe_queues(topic)
        brokers: dict[str, MessageQueue] = {}
        for mq in queues:
            brokers.setdefault(mq.broker_name, mq)
        for broker_name, mq in brokers.items():
            table = self._call(mq, "query_offsets", self.group, topic)
            for q in queues:
                if q.broker_name == broker_name:
                    out[q] = table.get(q.queue_id, -1)
        return out

    def min_offset(self, mq: MessageQueue) -> int:
        """The first offset ``mq`` still holds (``GET_MAX_OFFSET`` over the broker's
        socket, which answers both bounds)."""
        return self._call(mq, "min_max_offset", mq.topic, mq.queue_id)[0]

    def max_offset(self, mq: MessageQueue) -> int:
        """The offset the next message of ``mq`` will take (``GET_MAX_OFFSET``)."""
        return self._call(mq, "min_max_offset", mq.topic, mq.queue_id)[1]

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The first offset of ``mq`` stored at or after ``timestamp_ms``
        (``SEARCH_OFFSET`` over the broker's socket)."""
        return self._call(mq, "offset_by_time", mq.topic, mq.queue_id, timestamp_ms)

    def close(self) -> None:
        """Waits for the answers of async pulls still out and gives back its share of
        the client instance; offsets are committed explicitly, nothing else is left."""
        if self._waiter is not None:
            self._waiter.shutdown(wait=True)
            self._waiter = None
        self._leave()

    def __enter__(self) -> PullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
