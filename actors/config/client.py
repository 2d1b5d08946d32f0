"""Client settings: producers and pull consumers (the push consumer's are with it)."""

from __future__ import annotations

from dataclasses import dataclass

from actors.config.options import check_data_path, check_isolation, check_positive
from storage.errors import InvalidConfigError


@dataclass(frozen=True)
class ProducerConfig:
    """Client settings of a producer (RocketMQ's names and defaults where they exist)."""

    send_timeout_s: float = 3.0
    data_path: str = "socket"
    """How sends reach brokers: ``"socket"``, each broker's own port (the data path), or
    ``"ray"``, Ray actor calls. A broker whose socket cannot be reached gets Ray's path
    (logged once), so ``"socket"`` never loses a broker that Ray can still reach."""
    data_tls_ca: str | None = None
    """With brokers serving TLS: a PEM bundle to check their certificates against."""
    retry_times_when_send_failed: int = 2
    retry_times_when_send_async_failed: int = 2
    max_message_size: int = 4 << 20
    max_batch_bytes: int = 4 << 20
    max_batch_messages: int = 4096
    default_topic_queue_nums: int = 4
    route_refresh_s: float = 30.0
    send_latency_fault_enable: bool = True
    fault_isolation_s: float = 10.0
    born_host: str = "127.0.0.1:0"
    max_in_flight_per_broker: int = 2
    """``send_async`` calls on the wire to one broker; batches sent meanwhile wait and
    leave together in the next call (``actors.client.send_lanes``)."""
    async_send_max_messages: int = 65536
    async_send_max_bytes: int = 64 << 20
    """What ``send_async`` may hold unanswered, in messages and encoded bytes
    (RocketMQ's ``backPressureForAsyncSendNum`` / ``Size``): past it a send waits for
    room up to ``send_timeout_s`` and then raises ``ProducerBusyError``."""
    coalesce_list_max: int = 256
    """``send_async`` of a list of at most this many messages of one topic (no
    ``sharding_key``) waits with single messages and leaves inside their batches
    (``actors.client.coalescer``): a few messages per call cost what single ones do.
    Longer lists are batches of their own. 0: no list waits."""
    shared_memory_send: bool = True
    """Send calls of 256 KiB or more to a broker on this producer's own Ray node go
    through a shared memory ring instead of Ray's object store (``actors.protocol.shared_ring``);
    brokers on other nodes, and any broker that cannot read the ring, get Ray's path."""
    enable_idempotence: bool = True
    """Number each queue's sends so a broker stores a retried send once (Kafka's
    idempotent producer, ``actors.client.idempotence``); a send that may have been
    stored is then retried only on its own queue. False: RocketMQ's at-least-once,
    retries on another broker."""
    delivery_timeout_s: float = 30.0
    """Idempotent sends: how long a send that may have been stored keeps being sent
    again to its own queue (its broker restarting, or its slave taking over) before it
    fails (Kafka's ``delivery.timeout.ms``). Sends never stored fail over at once."""

    def __post_init__(self) -> None:
        check_data_path("ProducerConfig", self.data_path)
        check_positive(
            "ProducerConfig",
            max_in_flight_per_broker=self.max_in_flight_per_broker,
            async_send_max_messages=self.async_send_max_messages,
            async_send_max_bytes=self.async_send_max_bytes,
            send_timeout_s=self.send_timeout_s,
            delivery_timeout_s=self.delivery_timeout_s,
            max_message_size=self.max_message_size,
            max_batch_bytes=self.max_batch_bytes,
            max_batch_messages=self.max_batch_messages,
            default_topic_queue_nums=self.default_topic_queue_nums,
            route_refresh_s=self.route_refresh_s,
            fault_isolation_s=self.fault_isolation_s,
        )
        for name in (
            "retry_times_when_send_failed",
            "retry_times_when_send_async_failed",
            "coalesce_list_max",
        ):
            if getattr(self, name) < 0:
                raise InvalidConfigError(
                    f"ProducerConfig.{name}={getattr(self, name)}: must be >= 0"
                )


@dataclass(frozen=True)
class ConsumerConfig:
    """Client settings of a pull consumer."""

    pull_timeout_s: float = 10.0
    route_refresh_s: float = 30.0
    check_crc: bool = False
    data_path: str = "socket"
    """``"socket"`` (each broker's own port) or ``"ray"`` (actor calls); see ProducerConfig."""
    data_tls_ca: str | None = None
    isolation: str = "read_committed"
    """Only ``"read_committed"``: see ``PushConsumerConfig.isolation``."""

    def __post_init__(self) -> None:
        check_data_path("ConsumerConfig", self.data_path)
        check_isolation("ConsumerConfig", self.isolation)
        check_positive(
            "ConsumerConfig",
            pull_timeout_s=self.pull_timeout_s,
            route_refresh_s=self.route_refresh_s,
        )
