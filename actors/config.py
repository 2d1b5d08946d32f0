"""Configuration of the cluster's parts: one dataclass per component, RocketMQ's defaults.

``BrokerConfig`` holds the broker's own keys and, in ``store``, keyword
arguments for :class:`storage.StoreConfig` (all but ``store_dir`` and
``store_host``, which the broker works out on its node). A RocketMQ
``broker.conf`` loads into both (:meth:`BrokerConfig.from_broker_conf`).
``ClusterConfig`` is what ``raymq up`` reads from YAML or TOML.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from storage.config import _CONF_KEYS as _STORE_CONF_KEYS
from storage.config import StoreConfig, parse_broker_conf
from storage.errors import InvalidConfigError

from .topic import TopicConfig

DEFAULT_NAMESPACE = "raymq"
DEFAULT_CLUSTER = "DefaultCluster"
MASTER_ID = 0
_STORE_FIELDS = {f.name for f in dataclasses.fields(StoreConfig)} - {"store_dir", "store_host"}


def nameserver_actor_name(index: int) -> str:
    """The documented Ray actor name of the ``index``-th NameServer."""
    return f"nameserver-{index}"


def broker_actor_name(broker_name: str, broker_id: int) -> str:
    """The documented Ray actor name of a broker: ``broker-a`` id 0 is ``broker-a-0``."""
    return f"{broker_name}-{broker_id}"


def coordinator_actor_name(group: str) -> str:
    """The documented Ray actor name of a consumer group's coordinator: ``coordinator-<group>``."""
    return f"coordinator-{group}"


C = TypeVar("C")


def with_options(config: C, options: Mapping[str, Any]) -> C:
    """``config`` with some fields replaced; unknown names are an InvalidConfigError."""
    known = {f.name for f in dataclasses.fields(config)}  # type: ignore[arg-type]
    unknown = set(options) - known
    if unknown:
        raise InvalidConfigError(
            f"{type(config).__name__}: unknown option(s) {sorted(unknown)}; known: {sorted(known)}"
        )
    return dataclasses.replace(config, **options)  # type: ignore[type-var]


def _check_positive(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise InvalidConfigError(f"{owner}.{name}={value!r}: must be a number > 0")


def _check_name(owner: str, name: str, value: object) -> None:
    if not isinstance(value, str) or not value or not all(c.isalnum() or c in "_-" for c in value):
        raise InvalidConfigError(
            f"{owner}.{name}={value!r}: must be non-empty letters, digits, '_' or '-'"
        )


@dataclass(frozen=True)
class NameServerConfig:
    """A NameServer's settings (RocketMQ: scan every 5 s, expire after 120 s)."""

    broker_expired_s: float = 120.0
    scan_interval_s: float = 5.0

    def __post_init__(self) -> None:
        _check_positive(
            "NameServerConfig",
            broker_expired_s=self.broker_expired_s,
            scan_interval_s=self.scan_interval_s,
        )


@dataclass(frozen=True)
class BrokerConfig:
    """One broker's settings. ``store_dir=None`` means ``~/raymq/store/<namespace>/<actor name>``
    on the broker's node; ``broker_ip=None`` means the node's IP address."""

    broker_name: str = "broker-a"
    broker_id: int = MASTER_ID
    cluster_name: str = DEFAULT_CLUSTER
    namespace: str = DEFAULT_NAMESPACE
    nameservers: tuple[str, ...] = (nameserver_actor_name(0),)
    store_dir: str | None = None
    broker_ip: str | None = None
    listen_port: int = 10911
    store: Mapping[str, Any] = field(default_factory=dict)
    auto_create_topic_enable: bool = True
    default_topic_queue_nums: int = 8
    heartbeat_interval_s: float = 30.0
    register_timeout_s: float = 6.0
    flush_consumer_offset_interval_s: float = 5.0
    long_polling_enable: bool = True
    max_pull_suspend_s: float = 30.0
    channel_expired_s: float = 120.0
    io_threads: int = 8
    inline_async_puts: bool = True
    inline_reads: bool = True
    malloc_trim_threshold: int = 256 << 20
    """Freed memory the broker's process keeps for its next calls instead of giving it
    back to the kernel (glibc's ``M_TRIM_THRESHOLD``, see ``actors/_malloc.py``); 0 keeps
    glibc's defaults, under which every large pull faults its buffers in anew."""
    metrics_enable: bool = True
    """Export ``raymq_*`` metrics through ``ray.util.metrics`` (``actors/metrics.py``)."""
    metrics_export_interval_s: float = 1.0
    metrics_lag_interval_s: float = 5.0
    # --- high availability (actors/_ha.py, actors/dledger.py): RocketMQ's names
    broker_role: str = "ASYNC_MASTER"
    """The group's master role, ``ASYNC_MASTER`` or ``SYNC_MASTER``; a broker with id >= 1
    is a slave of it (``SLAVE`` is accepted there, as in a RocketMQ broker.conf)."""
    sync_replication_timeout_s: float = 2.0
    """SYNC_MASTER (and DLedger): how long a put waits for a slave (a majority)."""
    ha_transfer_batch_bytes: int = 4 << 20
    ha_max_gap_not_in_sync: int = 256 << 20
    ha_slave_timeout_s: float = 5.0
    ha_poll_s: float = 1.0
    slave_sync_interval_s: float = 2.0
    slave_read_enable: bool = False
    slave_read_window_bytes: int | None = None
    """A pull this far behind the CommitLog's end is sent to a slave (``slave_read_enable``);
    None: RocketMQ's 40% of the node's memory."""
    enable_dledger: bool = False
    dledger_peers: tuple[int, ...] = ()
    """Broker ids of the DLedger group's members (``start_cluster`` fills it in)."""
    dledger_tick_ms: int = 100
    dledger_heartbeat_ms: int = 300
    dledger_election_timeout_ms: int = 1000

    def __post_init__(self) -> None:
        _check_name("BrokerConfig", "broker_name", self.broker_name)
        _check_name("BrokerConfig", "cluster_name", self.cluster_name)
        _check_name("BrokerConfig", "namespace", self.namespace)
        if not isinstance(self.broker_id, int) or self.broker_id < 0:
            raise InvalidConfigError(
                f"BrokerConfig.broker_id={self.broker_id!r}: must be an int >= 0"
            )
        if not 0 < self.listen_port < 65536:
            raise InvalidConfigError(
                f"BrokerConfig.listen_port={self.listen_port}: must be in 1..65535"
            )
        if not 1 <= self.default_topic_queue_nums <= 1024:
            raise InvalidConfigError(
                f"BrokerConfig.default_topic_queue_nums={self.default_topic_queue_nums}: "
                "must be in 1..1024"
            )
        _check_positive(
            "BrokerConfig",
            heartbeat_interval_s=self.heartbeat_interval_s,
            register_timeout_s=self.register_timeout_s,
            flush_consumer_offset_interval_s=self.flush_consumer_offset_interval_s,
            max_pull_suspend_s=self.max_pull_suspend_s,
            channel_expired_s=self.channel_expired_s,
            io_threads=self.io_threads,
            metrics_export_interval_s=self.metrics_export_interval_s,
            metrics_lag_interval_s=self.metrics_lag_interval_s,
        )
        if not isinstance(self.malloc_trim_threshold, int) or self.malloc_trim_threshold < 0:
            raise InvalidConfigError(
                f"BrokerConfig.malloc_trim_threshold={self.malloc_trim_threshold!r}: "
                "must be an int >= 0"
            )
        unknown = set(self.store) - _STORE_FIELDS
        if unknown:
            raise InvalidConfigError(
                f"BrokerConfig.store: unknown StoreConfig field(s) {sorted(unknown)}; "
                f"known: {sorted(_STORE_FIELDS)}"
            )
        # fail here, in the caller's process, rather than in the actor
        StoreConfig(store_dir="/nonexistent", **self.store)
        object.__setattr__(self, "nameservers", tuple(self.nameservers))
        object.__setattr__(self, "store", dict(self.store))
        object.__setattr__(self, "dledger_peers", tuple(sorted(set(self.dledger_peers))))
        _check_ha(self)

    @property
    def actor_name(self) -> str:
        return broker_actor_name(self.broker_name, self.broker_id)

    @property
    def is_master(self) -> bool:
        return self.broker_id == MASTER_ID

    @property
    def role(self) -> str:
        """The configured role: ``SLAVE`` for ids >= 1, else the master role (DLedger members
        start as ``SLAVE`` and the elected leader becomes the master)."""
        if self.enable_dledger or self.broker_id != MASTER_ID:
            return "SLAVE"
        return self.broker_role

    @property
    def master_role(self) -> str:
        """The role this broker takes when it is (or becomes) the master."""
        return "ASYNC_MASTER" if self.broker_role == "SLAVE" else self.broker_role

    def replace(self, **changes: Any) -> BrokerConfig:
        return dataclasses.replace(self, **changes)

    def store_config(self, store_dir: str, store_host: str) -> StoreConfig:
        return StoreConfig(store_dir=store_dir, store_host=store_host, **self.store)

    @classmethod
    def from_broker_conf(cls, path: str | os.PathLike[str], **overrides: Any) -> BrokerConfig:
        """A RocketMQ ``broker.conf``: broker keys here, store keys into ``store``."""
        conf = parse_broker_conf(path)
        values: dict[str, Any] = {}
        store: dict[str, Any] = {}
        for key, text in conf.items():
            try:
                if key in _BROKER_CONF_KEYS:
                    name, convert = _BROKER_CONF_KEYS[key]
                    values[name] = convert(text)
                elif key in _STORE_CONF_KEYS:
                    name, convert = _STORE_CONF_KEYS[key]
                    if name == "store_dir":
                        values["store_dir"] = convert(text)
                    else:
                        store[name] = convert(text)
            except ValueError as exc:
                raise InvalidConfigError(f"{path}: {key}={text!r}: {exc}") from exc
        values["store"] = {**store, **dict(overrides.pop("store", {}))}
        values.update(overrides)
        return cls(**values)


BROKER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")


def _check_ha(c: BrokerConfig) -> None:
    if c.broker_role not in BROKER_ROLES:
        raise InvalidConfigError(
            f"BrokerConfig.broker_role={c.broker_role!r}: must be one of {BROKER_ROLES}"
        )
    if c.broker_role == "SLAVE" and c.broker_id == MASTER_ID and not c.enable_dledger:
        raise InvalidConfigError(
            "BrokerConfig.broker_role='SLAVE' with broker_id=0: id 0 is the master; "
            "give a slave an id >= 1"
        )
    _check_positive(
        "BrokerConfig",
        sync_replication_timeout_s=c.sync_replication_timeout_s,
        ha_transfer_batch_bytes=c.ha_transfer_batch_bytes,
        ha_max_gap_not_in_sync=c.ha_max_gap_not_in_sync,
        ha_slave_timeout_s=c.ha_slave_timeout_s,
        ha_poll_s=c.ha_poll_s,
        slave_sync_interval_s=c.slave_sync_interval_s,
        dledger_tick_ms=c.dledger_tick_ms,
        dledger_heartbeat_ms=c.dledger_heartbeat_ms,
        dledger_election_timeout_ms=c.dledger_election_timeout_ms,
    )
    if c.slave_read_window_bytes is not None and c.slave_read_window_bytes < 0:
        raise InvalidConfigError(
            f"BrokerConfig.slave_read_window_bytes={c.slave_read_window_bytes}: must be >= 0"
        )
    if c.enable_dledger:
        if not c.dledger_peers:
            raise InvalidConfigError(
                "BrokerConfig.dledger_peers: a DLedger member needs its group's broker ids "
                "(start_cluster fills them in from the brokers of the same name)"
            )
        if c.broker_id not in c.dledger_peers:
            raise InvalidConfigError(
                f"BrokerConfig.dledger_peers={c.dledger_peers}: must include this broker's "
                f"id {c.broker_id}"
            )
        if any(not isinstance(p, int) or p < 0 for p in c.dledger_peers):
            raise InvalidConfigError(
                f"BrokerConfig.dledger_peers={c.dledger_peers}: ids must be ints >= 0"
            )
        if c.dledger_heartbeat_ms * 2 > c.dledger_election_timeout_ms:
            raise InvalidConfigError(
                f"BrokerConfig.dledger_heartbeat_ms={c.dledger_heartbeat_ms}: must be at most "
                f"half of dledger_election_timeout_ms={c.dledger_election_timeout_ms}"
            )
        if c.dledger_tick_ms > c.dledger_heartbeat_ms:
            raise InvalidConfigError(
                f"BrokerConfig.dledger_tick_ms={c.dledger_tick_ms}: must be <= "
                f"dledger_heartbeat_ms={c.dledger_heartbeat_ms}"
            )


def _bool(text: str) -> bool:
    return text.strip().lower() == "true"


def _dledger_peers(text: str) -> tuple[int, ...]:
    """RocketMQ's ``dLegerPeers`` (``n0-host:port;n1-host:port``) as member ids."""
    ids = []
    for part in text.split(";"):
        name = part.strip().split("-", 1)[0]
        if not (name[:1] == "n" and name[1:].isdigit()):
            raise ValueError(f"member {part!r} is not n<id>-host:port")
        ids.append(int(name[1:]))
    return tuple(ids)


_BROKER_CONF_KEYS: dict[str, tuple[str, Any]] = {
    "brokerClusterName": ("cluster_name", str),
    "brokerName": ("broker_name", str),
    "brokerId": ("broker_id", int),
    "brokerIP1": ("broker_ip", str),
    "listenPort": ("listen_port", int),
    "autoCreateTopicEnable": ("auto_create_topic_enable", _bool),
    "defaultTopicQueueNums": ("default_topic_queue_nums", int),
    "longPollingEnable": ("long_polling_enable", _bool),
    "flushConsumerOffsetInterval": ("flush_consumer_offset_interval_s", lambda v: int(v) / 1000),
    "registerNameServerPeriod": ("heartbeat_interval_s", lambda v: int(v) / 1000),
    "brokerRole": ("broker_role", lambda v: v.strip().upper()),
    "slaveReadEnable": ("slave_read_enable", _bool),
    "haTransferBatchSize": ("ha_transfer_batch_bytes", int),
    "haMaxGapNotInSync": ("ha_max_gap_not_in_sync", int),
    "enableDLegerCommitLog": ("enable_dledger", _bool),
    "dLegerPeers": ("dledger_peers", _dledger_peers),
}


@dataclass(frozen=True)
class ProducerConfig:
    """Client settings of a producer (RocketMQ's names and defaults where they exist)."""

    send_timeout_s: float = 3.0
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
    leave together in the next call (``actors._send_lanes``)."""
    async_send_max_messages: int = 65536
    async_send_max_bytes: int = 64 << 20
    """What ``send_async`` may hold unanswered, in messages and encoded bytes
    (RocketMQ's ``backPressureForAsyncSendNum`` / ``Size``): past it a send waits for
    room up to ``send_timeout_s`` and then raises ``ProducerBusyError``."""
    shared_memory_send: bool = True
    """Send calls of 256 KiB or more to a broker on this producer's own Ray node go
    through a shared memory ring instead of Ray's object store (``actors._shared_ring``);
    brokers on other nodes, and any broker that cannot read the ring, get Ray's path."""

    def __post_init__(self) -> None:
        _check_positive(
            "ProducerConfig",
            max_in_flight_per_broker=self.max_in_flight_per_broker,
            async_send_max_messages=self.async_send_max_messages,
            async_send_max_bytes=self.async_send_max_bytes,
            send_timeout_s=self.send_timeout_s,
            max_message_size=self.max_message_size,
            max_batch_bytes=self.max_batch_bytes,
            max_batch_messages=self.max_batch_messages,
            default_topic_queue_nums=self.default_topic_queue_nums,
            route_refresh_s=self.route_refresh_s,
            fault_isolation_s=self.fault_isolation_s,
        )
        for name in ("retry_times_when_send_failed", "retry_times_when_send_async_failed"):
            if getattr(self, name) < 0:
                raise InvalidConfigError(
                    f"ProducerConfig.{name}={getattr(self, name)}: must be >= 0"
                )


@dataclass(frozen=True)
class CoordinatorConfig:
    """Settings of a consumer group's :class:`actors.GroupCoordinator`; whoever creates
    the coordinator (the group's first consumer, or :func:`actors.coordinator_for`)
    sets them, later joiners find it as it is.

    ``revoke_timeout_s``: an owner told to give a queue up has this long to confirm
    before the queue is fenced and handed on. ``route_refresh_s``: routes are
    re-read this often besides on every NameServer route change.
    ``fence_timeout_s``: the limit of one fencing call on a broker. ``log_size``:
    how many events the generation log keeps.
    """

    revoke_timeout_s: float = 10.0
    route_refresh_s: float = 30.0
    fence_timeout_s: float = 5.0
    log_size: int = 10_000

    def __post_init__(self) -> None:
        _check_positive(
            "CoordinatorConfig",
            revoke_timeout_s=self.revoke_timeout_s,
            route_refresh_s=self.route_refresh_s,
            fence_timeout_s=self.fence_timeout_s,
            log_size=self.log_size,
        )


@dataclass(frozen=True)
class ConsumerConfig:
    """Client settings of a pull consumer."""

    pull_timeout_s: float = 10.0
    route_refresh_s: float = 30.0
    check_crc: bool = False

    def __post_init__(self) -> None:
        _check_positive(
            "ConsumerConfig",
            pull_timeout_s=self.pull_timeout_s,
            route_refresh_s=self.route_refresh_s,
        )


@dataclass(frozen=True)
class BrokerSpec:
    """Where and how to start one broker of a cluster. ``node`` names a Ray node by
    node id, IP address, node name or a custom resource only it has."""

    broker_name: str
    broker_id: int = MASTER_ID
    node: str | None = None
    store_dir: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterConfig:
    """A whole deployment: NameServers, brokers and topics (``raymq up --config``).

    ``broker`` holds :class:`BrokerConfig` fields shared by every broker; a
    :class:`BrokerSpec`'s ``overrides`` win over them. Loaded from a file,
    ``auto_create_topic_enable`` defaults to off (on for :func:`start_cluster`).
    """

    namespace: str = DEFAULT_NAMESPACE
    cluster_name: str = DEFAULT_CLUSTER
    nameservers: int = 2
    nameserver: NameServerConfig = field(default_factory=NameServerConfig)
    broker: Mapping[str, Any] = field(default_factory=dict)
    brokers: tuple[BrokerSpec, ...] = (BrokerSpec("broker-a"), BrokerSpec("broker-b"))
    topics: tuple[TopicConfig, ...] = ()
    store_root: str | None = None
    max_restarts: int = -1

    def __post_init__(self) -> None:
        _check_name("ClusterConfig", "namespace", self.namespace)
        if not isinstance(self.nameservers, int) or not 1 <= self.nameservers <= 16:
            raise InvalidConfigError(
                f"ClusterConfig.nameservers={self.nameservers!r}: must be 1..16"
            )
        if not self.brokers:
            raise InvalidConfigError("ClusterConfig.brokers: at least one broker is needed")
        seen = set()
        for spec in self.brokers:
            key = (spec.broker_name, spec.broker_id)
            if key in seen:
                raise InvalidConfigError(f"ClusterConfig.brokers: {key} appears twice")
            seen.add(key)
        unknown = set(self.broker) - {f.name for f in dataclasses.fields(BrokerConfig)}
        if unknown:
            raise InvalidConfigError(
                f"ClusterConfig.broker: unknown BrokerConfig field(s) {sorted(unknown)}"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterConfig:
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise InvalidConfigError(
                f"cluster config: unknown key(s) {sorted(unknown)}; known: {sorted(known)}"
            )
        if "nameserver" in data:
            data["nameserver"] = NameServerConfig(**dict(data["nameserver"] or {}))
        if "brokers" in data:
            specs = []
            for item in data["brokers"]:
                if isinstance(item, str):
                    item = {"broker_name": item}
                item = dict(item)
                overrides = dict(item.pop("overrides", None) or {})
                overrides.update({k: item.pop(k) for k in list(item) if k not in _SPEC_FIELDS})
                specs.append(BrokerSpec(**item, overrides=overrides))
            data["brokers"] = tuple(specs)
        if "topics" in data:
            data["topics"] = tuple(
                TopicConfig.from_dict(t) if isinstance(t, Mapping) else TopicConfig(t)
                for t in data["topics"]
            )
        try:
            return cls(**data)
        except TypeError as exc:
            raise InvalidConfigError(f"cluster config: {exc}") from exc

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ClusterConfig:
        """YAML (``.yaml``/``.yml``) or TOML (``.toml``)."""
        p = Path(path)
        text = p.read_text(encoding="utf-8")
        if p.suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10
                import tomli as tomllib  # type: ignore[no-redef]
            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
        if not isinstance(data, Mapping):
            raise InvalidConfigError(f"{p}: expected a mapping at the top level")
        data = dict(data)
        # a deployment file creates its topics explicitly: auto-create is off unless it says so
        data["broker"] = {"auto_create_topic_enable": False, **dict(data.get("broker") or {})}
        return cls.from_dict(data)


_SPEC_FIELDS = {f.name for f in dataclasses.fields(BrokerSpec)}
