"""A topic as a Ray Data source and sink: bounded reads into ``ray.data.Dataset`` and writes back.

``read_topic`` plans one read task per queue (split by offset range when
``rows_per_task`` asks), runs each on the node of the broker that holds the
queue, and has it pull raw record blobs from the broker in large batches and
decode them straight into Arrow columns (``TOPIC_SCHEMA``). Records travel
broker -> read task; the driver only plans. ``write_to_topic`` is the other
direction: Ray Data write tasks encode Arrow rows into record batches and send
them with a Producer of their own (see ``actors.bridge.write``).

A read is bounded: its ranges are fixed when it is planned, from given
offsets, a consumer group's committed offsets or the queues' ends, up to the
queues' max offsets at that moment (or given end offsets).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import ray
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from actors.bridge.arrow_codec import TOPIC_SCHEMA, records_to_arrow
from actors.bridge.write import write_to_topic
from actors.namesrv.brokers import BrokerHandles
from actors.namesrv.client import NameServerClient
from actors.protocol import rpc as _rpc
from actors.protocol.data_path import DataPath
from actors.protocol.names import DEFAULT_NAMESPACE
from actors.protocol.topic import is_readable
from actors.protocol.wire import pull_request_to_wire, pulls_from_wire
from rebalance import MessageQueue
from storage.errors import (
    BrokerUnavailableError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    PermissionDeniedError,
)
from storage.message import GetStatus, RawGetResult
from storage.subscription import parse_subscription

__all__ = [
    "TOPIC_SCHEMA",
    "QueueRange",
    "TopicDatasource",
    "plan_topic_read",
    "read_topic",
    "write_to_topic",
]

log = logging.getLogger("raymq.datasource")

StartOffsets = Literal["earliest", "latest", "committed"] | Mapping[MessageQueue, int]
EndOffsets = Literal["latest"] | Mapping[MessageQueue, int]

DEFAULT_PULL_BATCH = 16_384
_ROW_BYTES_GUESS = 256  # for Ray Data's memory planning before anything is read
_PULL_ATTEMPTS = 4
_CALL_TIMEOUT_S = 60.0
_NODE_ID_LABEL = "ray.io/node-id"


@dataclass(frozen=True)
class QueueRange:
    """Offsets ``[start, end)`` of one queue and where its broker lives."""

    topic: str
    broker_name: str
    queue_id: int
    start: int
    end: int
    actor_name: str
    namespace: str
    node_id: str | None = None

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    @property
    def count(self) -> int:
        return max(0, self.end - self.start)

    def split(self, rows: int) -> list[QueueRange]:
        """This range cut into ranges of at most ``rows`` offsets."""
        return [
            replace(self, start=s, end=min(s + rows, self.end))
            for s in range(self.start, self.end, rows)
        ]


# ---------------------------------------------------------------- planning (driver)


def _queue_key(mq: MessageQueue | tuple[str, int] | int) -> tuple[str | None, int]:
    if isinstance(mq, MessageQueue):
        return mq.broker_name, mq.queue_id
    if isinstance(mq, tuple):
        return mq[0], mq[1]
    return None, int(mq)


def _lookup(table: Mapping[Any, int], broker_name: str, queue_id: int) -> int | None:
    """An offset given for this queue, keyed by MessageQueue, (broker, queue id) or queue id."""
    for key, value in table.items():
        name, qid = _queue_key(key)
        if qid == queue_id and name in (None, broker_name):
            return int(value)
    return None


def plan_topic_read(
    topic: str,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    group: str | None = None,
    start_offsets: StartOffsets | None = None,
    end_offsets: EndOffsets = "latest",
    default_start: Literal["earliest", "latest"] = "earliest",
    nameservers: Sequence[str] | None = None,
) -> list[QueueRange]:
    """The offset range of every readable queue of ``topic``, fixed now.

    ``start_offsets``: ``"earliest"`` (each queue's min offset), ``"latest"``
    (its max: an empty read), ``"committed"`` (``group``'s committed offsets),
    or a mapping from ``MessageQueue`` (or ``(broker name, queue id)``, or a
    queue id on every broker) to an offset. Default: ``"committed"`` with a
    group, else ``"earliest"``. A queue the group never committed, or the
    mapping leaves out, starts at ``default_start``.
    ``end_offsets``: ``"latest"`` (each queue's max offset now) or a mapping.
    Offsets below a queue's min offset (deleted files) start at its min; ends
    past its max stop at its max.
    """
    from actors.namesrv.client import discover_nameservers

    if start_offsets is None:
        start_offsets = "committed" if group else "earliest"
    if start_offsets == "committed" and not group:
        raise InvalidMessageError("start_offsets='committed' needs a consumer group")
    if isinstance(start_offsets, str) and start_offsets not in ("earliest", "latest", "committed"):
        raise InvalidMessageError(
            f"start_offsets={start_offsets!r}: 'earliest', 'latest', 'committed' or a mapping"
        )
    if default_start not in ("earliest", "latest"):
        raise InvalidMessageError(f"default_start={default_start!r}: 'earliest' or 'latest'")
    if isinstance(end_offsets, str) and end_offsets != "latest":
        raise InvalidMessageError(f"end_offsets={end_offsets!r}: 'latest' or a mapping")
    ns = NameServerClient(nameservers or discover_nameservers(namespace), namespace, 0.0)
    route = ns.require_route(topic, refresh=True)
    brokers = BrokerHandles(ns)
    queues: list[tuple[MessageQueue, Any, str, str | None]] = []
    for qd in route.queue_datas:
        bd = route.broker(qd.broker_name)
        if bd is None or not is_readable(qd.perm) or bd.master_actor_name() is None:
            continue
        actor_name = bd.master_actor_name()
        assert actor_name is not None
        handle = brokers.broker(route, qd.broker_name)
        node = bd.node_ids.get(0)
        for q in range(qd.read_queue_nums):
            queues.append((MessageQueue(topic, qd.broker_name, q), handle, actor_name, node))
    if not queues:
        raise PermissionDeniedError(f"topic={topic!r}: no live broker lets it be read")
    bounds = _rpc.get(
        [h.min_max_offset.remote(topic, mq.queue_id) for mq, h, _, _ in queues], _CALL_TIMEOUT_S
    )
    committed: dict[str, dict[int, int]] = {}
    if start_offsets == "committed":
        handles = {mq.broker_name: h for mq, h, _, _ in queues}
        answers = _rpc.get(
            [h.query_offsets.remote(group, topic) for h in handles.values()], _CALL_TIMEOUT_S
        )
        committed = dict(zip(handles, answers))
    ranges = []
    for (mq, _, actor_name, node), (min_off, max_off) in zip(queues, bounds):
        default = min_off if default_start == "earliest" else max_off
        if start_offsets == "earliest":
            start = min_off
        elif start_offsets == "latest":
            start = max_off
        elif start_offsets == "committed":
            start = committed.get(mq.broker_name, {}).get(mq.queue_id, -1)
            start = default if start < 0 else start
        else:
            given = _lookup(start_offsets, mq.broker_name, mq.queue_id)
            start = default if given is None else given
        end = max_off
        if not isinstance(end_offsets, str):
            given = _lookup(end_offsets, mq.broker_name, mq.queue_id)
            end = max_off if given is None else min(given, max_off)
        if start < min_off:
            log.warning(
                "%s: offset %d is below the queue's min offset %d (expired); reading from %d",
                mq,
                start,
                min_off,
                min_off,
            )
            start = min_off
        ranges.append(
            QueueRange(topic, mq.broker_name, mq.queue_id, start, end, actor_name, namespace, node)
        )
    return ranges


# ---------------------------------------------------------------- reading (read tasks)


@dataclass(frozen=True)
class _ReadOptions:
    tags: str | None
    pull_batch_size: int
    check_crc: bool
    fail_on_data_loss: bool


def _pull(broker: Any, r: QueueRange, offset: int, opts: _ReadOptions) -> Any:
    """One pull of ``r`` from ``offset``: over the broker's socket when ``broker`` is a
    data-path stub (``actors.protocol.data_path``), else as a Ray call."""
    count = min(opts.pull_batch_size, r.end - offset)
    request = pull_request_to_wire("", [(r.topic, r.queue_id, offset)], count, opts.tags, 0.0, "")
    return broker.pull_packed.remote(request)


def _get_pull(
    r: QueueRange, offset: int, ref: Any, opts: _ReadOptions, data_path: DataPath
) -> RawGetResult:
    """The pull's answer; when Ray cannot deliver it, the pull again (the broker may be
    restarting in place) a few times before giving up."""
    for attempt in range(_PULL_ATTEMPTS):
        try:
            return pulls_from_wire(_rpc.get(ref, _CALL_TIMEOUT_S))[0]
        except Exception as exc:
            if not _rpc.is_retriable(exc) or attempt == _PULL_ATTEMPTS - 1:
                if _rpc.is_retriable(exc):
                    raise BrokerUnavailableError(
                        f"broker {r.broker_name!r} did not answer a pull of "
                        f"{r.topic}:{r.queue_id}@{offset} after {_PULL_ATTEMPTS} attempts: "
                        f"{type(exc).__name__}"
                    ) from exc
                raise
            log.warning("pull of %s:%d failed (%s); retrying", r.topic, r.queue_id, exc)
            time.sleep(0.5 * 2**attempt)
            broker = data_path.wrap(
                r.actor_name, ray.get_actor(r.actor_name, namespace=r.namespace)
            )
            ref = _pull(broker, r, offset, opts)
    raise AssertionError("unreachable")


def _read_queue_range(r: QueueRange, opts: _ReadOptions) -> Iterator[pa.Table]:
    """Pull ``r`` in batches of ``opts.pull_batch_size`` and yield one table per pull.

    The next pull is in flight while the current blob is decoded.
    """
    subscribed = parse_subscription(opts.tags)
    wanted = None if subscribed is None else pa.array(sorted(subscribed), pa.string())
    data_path = DataPath()  # this read task's connections: closed when it is done
    try:
        yield from _read_with(r, opts, wanted, data_path)
    finally:
        data_path.close()


def _read_with(
    r: QueueRange, opts: _ReadOptions, wanted: pa.Array | None, data_path: DataPath
) -> Iterator[pa.Table]:
    broker = data_path.wrap(r.actor_name, ray.get_actor(r.actor_name, namespace=r.namespace))
    offset = r.start
    ref = _pull(broker, r, offset, opts) if offset < r.end else None
    while ref is not None:
        raw = _get_pull(r, offset, ref, opts, data_path)
        status = raw.status
        if status is GetStatus.OFFSET_TOO_SMALL:
            message = (
                f"{r.topic}:{r.broker_name}:{r.queue_id}: offsets {offset}..{raw.next_offset} "
                "were deleted before they were read"
            )
            if opts.fail_on_data_loss:
                raise OffsetOutOfRangeError(message + " (fail_on_data_loss=True)")
            log.warning("%s; skipping them", message)
        elif status not in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
            raise OffsetOutOfRangeError(
                f"{r.topic}:{r.broker_name}:{r.queue_id}: pull at {offset} answered "
                f"{status.value} (queue now [{raw.min_offset}, {raw.max_offset}]); "
                f"the planned range was [{r.start}, {r.end})"
            )
        if raw.next_offset <= offset:
            raise OffsetOutOfRangeError(
                f"{r.topic}:{r.queue_id}: the broker did not advance past offset {offset}"
            )
        offset = raw.next_offset
        ref = _pull(broker, r, offset, opts) if offset < r.end else None
        if raw.count:
            table = records_to_arrow(
                raw.data, topic=r.topic, broker_name=r.broker_name, check_crc=opts.check_crc
            )
            # A filtered pull may look past the range's end; a filter by hash may let
            # another tag through.
            keep = pc.less(table.column("queue_offset"), r.end)
            if wanted is not None:
                keep = pc.and_(keep, pc.is_in(table.column("tags"), wanted).fill_null(False))
            if not pc.all(keep).as_py():
                table = table.filter(keep)
            if table.num_rows:
                yield table


class TopicDatasource(Datasource):
    """Ray Data source over fixed queue ranges (see :func:`plan_topic_read`).

    One read task per range, or per ``rows_per_task`` offsets of it; Ray Data's
    requested parallelism is not followed, so a small topic never turns into
    hundreds of tiny tasks and a task always reads in large pulls.
    """

    def __init__(
        self,
        ranges: Sequence[QueueRange],
        *,
        tags: str | None = None,
        pull_batch_size: int = DEFAULT_PULL_BATCH,
        rows_per_task: int | None = None,
        check_crc: bool = False,
        fail_on_data_loss: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(pull_batch_size, int) or pull_batch_size <= 0:
            raise InvalidMessageError(f"pull_batch_size={pull_batch_size!r}: must be an int > 0")
        if rows_per_task is not None and (not isinstance(rows_per_task, int) or rows_per_task <= 0):
            raise InvalidMessageError(f"rows_per_task={rows_per_task!r}: must be an int > 0")
        parse_subscription(tags)  # raises on a bad expression, here rather than in a task
        self.ranges = [r for r in ranges if r.count > 0]
        self.rows_per_task = rows_per_task
        self._options = _ReadOptions(tags, pull_batch_size, check_crc, fail_on_data_loss)

    def get_name(self) -> str:
        topics = ",".join(sorted({r.topic for r in self.ranges}))
        brokers = ",".join(sorted({r.broker_name for r in self.ranges}))
        return f"RayMQTopic({topics}@{brokers})"

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(r.count for r in self.ranges) * _ROW_BYTES_GUESS

    def task_ranges(self) -> list[QueueRange]:
        if self.rows_per_task is None:
            return list(self.ranges)
        rows = self.rows_per_task
        return [part for r in self.ranges for part in r.split(rows)]

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        exact = self._options.tags is None
        tasks = []
        for r in self.task_ranges():
            metadata = BlockMetadata(
                num_rows=r.count if exact else None,
                size_bytes=r.count * _ROW_BYTES_GUESS,
                exec_stats=None,
                input_files=None,
            )
            tasks.append(
                ReadTask(
                    functools.partial(_read_queue_range, r, self._options),
                    metadata,
                    schema=TOPIC_SCHEMA,
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return tasks


def read_topic(
    topic: str,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    group: str | None = None,
    start_offsets: StartOffsets | None = None,
    end_offsets: EndOffsets = "latest",
    tags: str | None = None,
    pull_batch_size: int = DEFAULT_PULL_BATCH,
    rows_per_task: int | None = None,
    check_crc: bool = False,
    fail_on_data_loss: bool = True,
    locality: bool = True,
    ray_options: Mapping[str, Any] | None = None,
    ranges: Sequence[QueueRange] | None = None,
) -> ray.data.Dataset:
    """A bounded read of ``topic`` as a ``ray.data.Dataset`` of ``TOPIC_SCHEMA`` rows.

    Offsets as in :func:`plan_topic_read` (or the given ``ranges``). ``tags``
    is a subscription expression (``"TagA || TagB"``). With ``locality``, the
    read tasks of each broker run on that broker's node when it has room (a
    ``ray.io/node-id`` label selector with a fallback to any node).
    ``ray_options`` go to ``ray.data.read_datasource`` (``num_cpus``,
    ``memory``, ``concurrency``, ...). A read never commits offsets; the
    group's offsets only choose where it starts.
    """
    if ranges is None:
        ranges = plan_topic_read(
            topic,
            namespace=namespace,
            group=group,
            start_offsets=start_offsets,
            end_offsets=end_offsets,
        )
    options = dict(
        tags=tags,
        pull_batch_size=pull_batch_size,
        rows_per_task=rows_per_task,
        check_crc=check_crc,
        fail_on_data_loss=fail_on_data_loss,
    )
    by_node: dict[str | None, list[QueueRange]] = {}
    for r in ranges:
        if r.count > 0:
            by_node.setdefault(r.node_id if locality else None, []).append(r)
    if not by_node:
        return ray.data.from_arrow(TOPIC_SCHEMA.empty_table())
    parts = []
    for node, node_ranges in by_node.items():
        args = dict(ray_options or {})
        if node is not None and "label_selector" not in args:
            args["label_selector"] = {_NODE_ID_LABEL: node}
            args["fallback_strategy"] = [{"label_selector": {}}]
        source = TopicDatasource(node_ranges, **options)  # type: ignore[arg-type]
        # As many blocks as tasks: Ray Data would otherwise cut each task's output
        # into pieces to reach its default parallelism.
        args.setdefault("override_num_blocks", len(source.task_ranges()))
        parts.append(ray.data.read_datasource(source, **args))
    return parts[0] if len(parts) == 1 else parts[0].union(*parts[1:])
