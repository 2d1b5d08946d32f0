"""The push consumer's settings and the words its listener speaks.

RocketMQ's ``DefaultMQPushConsumer`` names and defaults where they exist
(``consumeThreadMin`` 20, ``pullBatchSize`` 32, ``pullThresholdForQueue`` 1000,
``maxReconsumeTimes`` 16, ``consumeTimeout`` 15 min, rebalance every 20 s,
offsets persisted every 5 s); intervals are configurable so tests run them short.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from actors.config.coordinator import CoordinatorConfig
from actors.config.options import check_data_path, check_isolation, check_name
from actors.coordinator.strategies import MACHINE_ROOM_STRATEGIES, StrategySpec, build_strategy
from storage.errors import InvalidConfigError
from storage.message import MessageExt


def valid_instance_name(name: object) -> bool:
    """A consumer's ``instance_name`` (a part of its client id): a non-empty str of
    letters, digits, ``_``, ``-`` and ``.``."""
    return isinstance(name, str) and bool(name) and all(c.isalnum() or c in "_-." for c in name)


class ConsumeStatus(enum.Enum):
    """What a listener returns. Anything but SUCCESS (an exception, ``None``, a
    call that ran past ``consume_timeout_s``) counts as RECONSUME_LATER."""

    SUCCESS = "SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


Listener = Callable[[list[MessageExt]], ConsumeStatus]
"""What a push consumer calls with each batch of messages."""


class MessageModel(enum.Enum):
    """CLUSTERING: each message to one consumer of the group, offsets on the brokers.
    BROADCASTING: every consumer gets every message, offsets in a local file."""

    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFromWhere(enum.Enum):
    """Where a queue the group never committed an offset for starts."""

    LAST = "LAST"
    FIRST = "FIRST"
    TIMESTAMP = "TIMESTAMP"


def _enum(kind: type[enum.Enum], name: str, value: object) -> enum.Enum:
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        text = value.upper().removeprefix("CONSUME_FROM_").removesuffix("_OFFSET")
        for member in kind:
            if member.value == text:
                return member
    raise InvalidConfigError(
        f"PushConsumerConfig.{name}={value!r}: must be one of {[m.value for m in kind]}"
    )


DELIVERIES = ("pull", "stream")
"""``PushConsumerConfig.delivery``: held pulls, or a subscription stream per broker."""


@dataclass(frozen=True)
class PushConsumerConfig:
    """Client settings of a :class:`actors.PushConsumer`.

    ``consume_timestamp`` is seconds since the epoch (like ``time.time()``), used
    with ``consume_from="TIMESTAMP"``; ``None`` means half an hour ago, as in
    RocketMQ. ``offset_store_dir`` holds broadcasting offsets (default
    ``~/.raymq_offsets``), one file per group and ``instance_name``.
    ``orderly``: RocketMQ's ``MessageListenerOrderly``: one batch of a queue at a time,
    in offset order; a failed batch is retried in place after
    ``suspend_current_queue_time_s`` (RocketMQ's 1 s) while the queue waits, and goes to
    the DLQ after ``max_reconsume_times`` (see :mod:`.consume_orderly`).
    ``session_timeout_s``: brokers drop a consumer they have not heard from for this
    long, so the group takes over a dead consumer's queues (default three
    heartbeats, at least 3 s; capped by the broker's ``channel_expired_s``).
    ``rebalance_strategy`` (a ``rebalance`` strategy name, with ``rebalance_options``)
    splits a CLUSTERING group's queues among its consumers, in both modes:
    ``coordinated`` True: the group's ``GroupCoordinator`` runs it and hands the queues
    out (one owner per queue, handed over with a commit in between);
    ``coordinator_config`` counts when this consumer creates the coordinator. False:
    each consumer runs it on its own over the brokers' member list (RocketMQ's way).
    ``machine_room``: this consumer's room, which the machine-room strategies need
    (brokers name theirs, ``<room>@<name>``). 'config': this consumer's queues are
    ``rebalance_options={"queues": [...]}``; a coordinated group refuses two members
    listing one queue (see ``actors.coordinator.strategies``).
    """

    model: MessageModel | str = MessageModel.CLUSTERING
    consume_from: ConsumeFromWhere | str = ConsumeFromWhere.LAST
    consume_timestamp: float | None = None
    consume_threads: int = 20
    consume_on_io_thread: bool = False
    """A concurrent listener called on the client's I/O thread, as the subscription
    stream's records arrive there (``delivery="stream"``, the default on the brokers'
    sockets), instead of on a consume thread: each message then crosses
    no thread, which at 1,000 msg/s takes a fifth to a quarter of a consumer's CPU and
    a tenth of its median latency off (``docs/latency.md``). One batch is consumed there
    per arrival; more ready at once goes to the consume threads, as do the batches a
    broadcasting consumer retries itself.
    Only for a listener that never blocks: while it runs, no connection of the process
    reads or writes (other consumers' records, a producer's acknowledgements,
    heartbeats), and a listener stuck there stalls them all. A synchronous send, whose
    answer this very thread reads, raises there at once (``send_async`` does not wait).
    Not with ``orderly``."""
    consume_batch_size: int = 1
    pull_batch_size: int = 32
    pull_threshold_for_queue: int = 1000
    pull_threshold_size_for_queue_mib: int = 100
    max_reconsume_times: int = 16
    consume_timeout_s: float = 900.0
    pull_suspend_s: float = 15.0
    pull_timeout_s: float = 10.0
    pull_retry_delay_s: float = 1.0
    local_retry_delay_s: float = 5.0
    rebalance_interval_s: float = 20.0
    heartbeat_interval_s: float = 10.0
    session_timeout_s: float | None = None
    persist_offset_interval_s: float = 5.0
    route_refresh_s: float = 30.0
    shutdown_timeout_s: float = 30.0
    instance_name: str = "DEFAULT"
    offset_store_dir: str | None = None
    check_crc: bool = False
    orderly: bool = False
    suspend_current_queue_time_s: float = 1.0
    coordinated: bool = True
    rebalance_strategy: str = "averagely"
    rebalance_options: Mapping[str, Any] | None = None
    machine_room: str | None = None
    coordinator_config: CoordinatorConfig | None = None
    data_path: str = "socket"
    """Pulls, offset commits, send-back and heartbeats over each broker's own socket
    (``"socket"``) or as Ray actor calls (``"ray"``); see ``ProducerConfig.data_path``."""
    data_tls_ca: str | None = None
    delivery: str | None = None
    """How records reach the process queues: ``"stream"``, one subscription per broker
    (and tag expression) that the broker writes new records to as it stores them,
    within a credit the consumer renews as its queues take them
    (``actors.client.push.stream_service``); ``"pull"``, a held pull per broker, again
    after each answer. ``"stream"`` needs ``data_path="socket"``. None (the default):
    ``"stream"`` on the brokers' sockets, ``"pull"`` on Ray's data path
    (:attr:`deliver_by` says which)."""
    dedup_window_s: float | None = None
    """Drop redeliveries of messages the listener acknowledged within this many seconds
    (by ``msg_id``; at most ``dedup_max_ids`` remembered): ``actors.client.push.dedup``.
    None: every delivery reaches the listener (RocketMQ's at-least-once)."""
    dedup_max_ids: int = 100_000
    isolation: str = "read_committed"
    """What a transaction's messages look like to this consumer: only
    ``"read_committed"`` (each shows at its commit, never before, never if aborted);
    ``"read_uncommitted"`` is refused with the reason (``docs/transactions.md``)."""

    @property
    def deliver_by(self) -> str:
        """``delivery``, or when it is None the one the data path serves best."""
        if self.delivery is not None:
            return self.delivery
        return "stream" if self.data_path == "socket" else "pull"

    def __post_init__(self) -> None:
        check_data_path("PushConsumerConfig", self.data_path)
        check_isolation("PushConsumerConfig", self.isolation)
        if self.delivery is not None and self.delivery not in DELIVERIES:
            raise InvalidConfigError(
                f"PushConsumerConfig.delivery={self.delivery!r}: must be one of {DELIVERIES}"
            )
        if self.delivery == "stream" and self.data_path != "socket":
            raise InvalidConfigError(
                'PushConsumerConfig.delivery="stream" is served on the brokers\' sockets: it '
                f'needs data_path="socket", not {self.data_path!r}'
            )
        if self.dedup_window_s is not None and not self.dedup_window_s > 0:
            raise InvalidConfigError(
                f"PushConsumerConfig.dedup_window_s={self.dedup_window_s!r}: must be > 0 or None"
            )
        if not isinstance(self.dedup_max_ids, int) or self.dedup_max_ids < 1:
            raise InvalidConfigError(
                f"PushConsumerConfig.dedup_max_ids={self.dedup_max_ids!r}: must be an int >= 1"
            )
        object.__setattr__(self, "model", _enum(MessageModel, "model", self.model))
        object.__setattr__(
            self, "consume_from", _enum(ConsumeFromWhere, "consume_from", self.consume_from)
        )
        for name in (
            "consume_threads",
            "consume_batch_size",
            "pull_batch_size",
            "pull_threshold_for_queue",
            "pull_threshold_size_for_queue_mib",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidConfigError(
                    f"PushConsumerConfig.{name}={value!r}: must be an int >= 1"
                )
        if self.consume_batch_size > 1024 or self.pull_batch_size > 65536:
            raise InvalidConfigError(
                f"PushConsumerConfig: consume_batch_size={self.consume_batch_size} (max 1024), "
                f"pull_batch_size={self.pull_batch_size} (max 65536)"
            )
        mrt = self.max_reconsume_times
        if not isinstance(mrt, int) or isinstance(mrt, bool) or not 0 <= mrt <= 10_000:
            raise InvalidConfigError(
                f"PushConsumerConfig.max_reconsume_times={mrt!r}: must be an int in 0..10000"
            )
        for name in (
            "consume_timeout_s",
            "pull_suspend_s",
            "pull_timeout_s",
            "pull_retry_delay_s",
            "local_retry_delay_s",
            "rebalance_interval_s",
            "heartbeat_interval_s",
            "persist_offset_interval_s",
            "route_refresh_s",
            "shutdown_timeout_s",
            "suspend_current_queue_time_s",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise InvalidConfigError(
                    f"PushConsumerConfig.{name}={value!r}: must be a number > 0"
                )
        if not isinstance(self.orderly, bool):
            raise InvalidConfigError(f"PushConsumerConfig.orderly={self.orderly!r}: must be a bool")
        if not isinstance(self.consume_on_io_thread, bool):
            raise InvalidConfigError(
                f"PushConsumerConfig.consume_on_io_thread={self.consume_on_io_thread!r}: "
                "must be a bool"
            )
        if self.consume_on_io_thread and self.orderly:
            raise InvalidConfigError(
                "PushConsumerConfig.consume_on_io_thread is for concurrent listeners: an "
                "orderly listener holds its queue's lock while it runs, on a consume thread"
            )
        if self.consume_on_io_thread and self.deliver_by != "stream":
            raise InvalidConfigError(
                "PushConsumerConfig.consume_on_io_thread takes the subscription stream's "
                'records where they arrive: it needs delivery="stream" (the default with '
                f'data_path="socket"), not delivery={self.deliver_by!r}'
            )
        if not valid_instance_name(name := self.instance_name):
            raise InvalidConfigError(
                f"PushConsumerConfig.instance_name={name!r}: letters, digits, '_', '-' or '.'"
            )
        if self.session_timeout_s is not None and (
            not isinstance(self.session_timeout_s, (int, float))
            or self.session_timeout_s <= self.heartbeat_interval_s
        ):
            raise InvalidConfigError(
                f"PushConsumerConfig.session_timeout_s={self.session_timeout_s!r}: must be "
                f"longer than heartbeat_interval_s={self.heartbeat_interval_s}"
            )
        if self.consume_timestamp is not None and (
            not isinstance(self.consume_timestamp, (int, float)) or self.consume_timestamp < 0
        ):
            raise InvalidConfigError(
                f"PushConsumerConfig.consume_timestamp={self.consume_timestamp!r}: "
                "seconds since the epoch (time.time())"
            )
        self._check_coordination()

    def _check_coordination(self) -> None:
        from rebalance import STRATEGY_NAMES

        if not isinstance(self.coordinated, bool):
            raise InvalidConfigError(
                f"PushConsumerConfig.coordinated={self.coordinated!r}: must be a bool"
            )
        if self.rebalance_strategy not in STRATEGY_NAMES:
            raise InvalidConfigError(
                f"PushConsumerConfig.rebalance_strategy={self.rebalance_strategy!r}: "
                f"one of {', '.join(STRATEGY_NAMES)}"
            )
        if self.rebalance_options is not None and not isinstance(self.rebalance_options, Mapping):
            raise InvalidConfigError(
                f"PushConsumerConfig.rebalance_options={self.rebalance_options!r}: "
                "a mapping of option names to values"
            )
        if self.machine_room is not None:
            check_name("PushConsumerConfig", "machine_room", self.machine_room)
        if self.clustering:
            self._check_strategy()
        if self.coordinator_config is not None and not isinstance(
            self.coordinator_config, CoordinatorConfig
        ):
            raise InvalidConfigError(
                f"PushConsumerConfig.coordinator_config={self.coordinator_config!r}: "
                "a CoordinatorConfig"
            )

    def _check_strategy(self) -> None:
        """The strategy's options, and a room where the strategy needs one."""
        name = self.rebalance_strategy
        if name in MACHINE_ROOM_STRATEGIES and self.machine_room is None:
            raise InvalidConfigError(
                f"PushConsumerConfig.rebalance_strategy={name!r} needs machine_room, this "
                "consumer's room (brokers carry theirs in their names: <room>@<name>)"
            )
        spec = StrategySpec(name, dict(self.rebalance_options or {}))
        build_strategy(spec, {"<this consumer>": self.machine_room})

    @property
    def session_timeout(self) -> float:
        if self.session_timeout_s is not None:
            return float(self.session_timeout_s)
        return max(3.0 * self.heartbeat_interval_s, 3.0)

    @property
    def clustering(self) -> bool:
        return self.model is MessageModel.CLUSTERING
