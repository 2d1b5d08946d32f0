"""A broker's settings, RocketMQ's defaults; a RocketMQ ``broker.conf`` loads into them.

``BrokerConfig`` holds the broker's own keys and, in ``store``, keyword
arguments for :class:`storage.StoreConfig` (all but ``store_dir`` and
``store_host``, which the broker works out on its node). A RocketMQ
``broker.conf`` loads into both (:meth:`BrokerConfig.from_broker_conf`); a key of
it that neither reads is named in a warning (logger ``raymq.actors.config``), with
the reason where RayMQ leaves a RocketMQ key alone on purpose, or the key it may
have meant.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from actors.config.options import (
    check_broker_name,
    check_name,
    check_positive,
    check_process_nice,
)
from actors.protocol.names import (
    DEFAULT_CLUSTER,
    DEFAULT_NAMESPACE,
    MASTER_ID,
    broker_actor_name,
    nameserver_actor_name,
)
from storage.config import _CONF_KEYS as _STORE_CONF_KEYS
from storage.config import StoreConfig, parse_broker_conf
from storage.errors import InvalidConfigError

_STORE_FIELDS = {f.name for f in dataclasses.fields(StoreConfig)} - {"store_dir", "store_host"}

log = logging.getLogger("raymq.actors.config")


@dataclass(frozen=True)
class BrokerConfig:
    """One broker's settings. ``store_dir=None`` means ``~/raymq/store/<namespace>/<actor name>``
    on the broker's node; ``broker_ip=None`` means the node's IP address.
    ``broker_name`` may name the broker's machine room, ``<room>@<name>`` (RocketMQ's
    convention, read by the machine-room rebalance strategies; see
    :func:`actors.config.options.check_broker_name` for why it is in the name)."""

    broker_name: str = "broker-a"
    broker_id: int = MASTER_ID
    cluster_name: str = DEFAULT_CLUSTER
    namespace: str = DEFAULT_NAMESPACE
    nameservers: tuple[str, ...] = (nameserver_actor_name(0),)
    store_dir: str | None = None
    broker_ip: str | None = None
    listen_port: int = 10911
    """RocketMQ's listenPort: with the node's IP, the store host written into every record
    and message id; a broker's identity, not where it listens (``data_port`` is)."""
    data_port: int = 0
    """The TCP port of the broker's data path (``actors/broker/listener.py``) on its node;
    0: any free port. Clients find it through the NameServers' routes, again after a
    restart; only connections that prove they belong to the cluster are served."""
    data_bind: str | None = None
    """The address the data path listens on; None: the node's IP (Ray's node address)."""
    data_path_enable: bool = True
    data_local_socket: bool = True
    """Serve clients on the broker's node over a Unix socket too (none with TLS): they
    take it instead of the TCP port (``actors/protocol/frame_server.py``)."""
    max_frame_bytes: int = 128 << 20
    """The largest data-path frame a broker reads; a larger one closes its connection."""
    max_requests_per_connection: int = 4096
    """Requests one data-path connection may have in flight (held pulls included); past
    it the broker reads that connection no further until some end, so TCP pushes back
    on a client that floods it (RocketMQ bounds its request pools the same way)."""
    data_tls_cert: str | None = None
    data_tls_key: str | None = None
    """TLS for the data path (a PEM certificate chain and its key on the broker's node);
    clients then connect with TLS (``ProducerConfig.data_tls_ca`` to check the chain)."""
    grpc_enable: bool = False
    """Serve RocketMQ 5's gRPC protocol (``apache.rocketmq.v2.MessagingService``) so the
    official clients work unchanged (``actors/broker/grpc``, docs/rocketmq5.md)."""
    grpc_port: int = 0
    """The gRPC endpoint's TCP port on the broker's node; 0: any free port (clients find it
    through ``QueryRoute`` and ``Cluster.grpc_endpoints()``)."""
    grpc_bind: str | None = None
    """The address the gRPC endpoint listens on; None: the node's IP (Ray's node address)."""
    grpc_access_key: str = ""
    grpc_secret_key: str = field(default="", repr=False)
    """The credentials every gRPC call must be signed with (RocketMQ's ACL signature,
    ``MQv2-HMAC-SHA1``); both required with ``grpc_enable``. ``start_cluster`` generates
    them when not given (read them with ``Cluster.grpc_credentials()``)."""
    grpc_auth_window_s: float = 900.0
    """How far a call's signed ``x-mq-date-time`` may be from the broker's clock (UTC)."""
    grpc_max_receive_bytes: int = 16 << 20
    """The largest gRPC request the endpoint reads (a larger one is refused by grpcio)."""
    grpc_max_pending_calls: int = 10_000
    """Calls the endpoint lets wait for its event loop. gRPC's core otherwise sheds
    arrivals at random once 1,000 wait (and all past 3,000), answering them
    ``CANCELLED``, which the official clients retry and then fail; within this bound a
    burst waits its turn (each call still bounded by its own deadline)."""
    grpc_renew_invisible_s: float = 60.0
    """A push consumer's receive (``auto_renew``, no invisible time of its own): how long
    its messages are invisible, and how much each renewal adds (RocketMQ's proxy's
    ``renewSliceTimeMillis``)."""
    grpc_renew_ahead_s: float = 10.0
    """Renew such a message's invisible time this long before it would lapse, while its
    client is alive and has not acked it (``renewAheadTimeMillis``)."""
    grpc_renew_max_s: float = 3 * 3600.0
    """Stop renewing a message this long after it was received (the listener is stuck):
    it lapses and is delivered again."""
    store: Mapping[str, Any] = field(default_factory=dict)
    auto_create_topic_enable: bool = True
    default_topic_queue_nums: int = 8
    heartbeat_interval_s: float = 30.0
    register_timeout_s: float = 6.0
    cluster_lease_s: float = 10.0
    """A broker that has reached no NameServer for this long takes no writes until one
    answers again (it may be cut off from the cluster: ``actors/broker/lease.py``);
    shorter than Ray's verdict on a node it cannot hear. 0: no lease."""
    lease_renew_interval_s: float = 2.0
    """How often the broker pings its NameServers to renew its lease."""
    flush_consumer_offset_interval_s: float = 5.0
    long_polling_enable: bool = True
    max_pull_suspend_s: float = 30.0
    channel_expired_s: float = 120.0
    io_threads: int = 8
    # transactional messages (actors/broker/transaction/service.py), RocketMQ's defaults
    transaction_check_interval_s: float = 60.0
    transaction_timeout_s: float = 6.0
    """A half message is checked with its producer once it is this old (born time)."""
    transaction_check_max: int = 15
    """Checks without an answer before a half message is discarded."""
    # POP consumption (actors/broker/processor/pop.py, storage/pop.py)
    pop_max_reconsume_times: int = 16
    """Deliveries of a POP message after its first before it goes to ``%DLQ%<group>``."""
    pop_revive_interval_s: float = 0.1
    """How often the broker looks for POP messages whose invisible time lapsed."""
    inline_async_puts: bool = True
    inline_reads: bool = True
    malloc_trim_threshold: int = 256 << 20
    """Freed memory the broker's process keeps for its next calls instead of giving it
    back to the kernel (glibc's ``M_TRIM_THRESHOLD``, see ``actors/broker/memory.py``); 0 keeps
    glibc's defaults, under which every large pull faults its buffers in anew."""
    process_nice: int | None = 0
    """The highest niceness the broker's process keeps: it lowers itself to this at start
    where it runs above (``actors/broker/priority.py``). Ray starts its workers at nice
    15; a broker waiting for a CPU makes every message wait, so it asks for 0. Lowering
    needs ``CAP_SYS_NICE`` (root) or ``RLIMIT_NICE``: without, the broker keeps Ray's and
    logs a warning. None leaves Ray's."""
    metrics_enable: bool = True
    """Export ``raymq_*`` metrics through ``ray.util.metrics`` (``actors/broker/metrics.py``)."""
    metrics_export_interval_s: float = 1.0
    metrics_lag_interval_s: float = 5.0
    # --- lite topics (actors/broker/lite/, storage/lite/)
    lite_expire_interval_ms: int = 10_000
    """How often lite topics past their parent's TTL are looked for and deleted (in a
    Raft group: proposed by the leader through the group's log)."""
    # --- high availability (actors/broker/ha/master_slave.py, actors/broker/ha/dledger.py): RocketMQ's names
    broker_role: str = "ASYNC_MASTER"
    """The group's master role, ``ASYNC_MASTER`` or ``SYNC_MASTER``; a broker with id >= 1
    is a slave of it (``SLAVE`` is accepted there, as in a RocketMQ broker.conf)."""
    sync_replication_timeout_s: float = 2.0
    """SYNC_MASTER (and DLedger): how long a put waits for a slave (a majority)."""
    ha_transfer_batch_bytes: int = 4 << 20
    ha_max_gap_not_in_sync: int = 256 << 20
    ha_slave_timeout_s: float = 5.0
    ha_poll_s: float = 1.0
    ha_ask_slaves_s: float = 30.0
    """A master (re)starting asks its registered slaves where their logs end, again while
    one does not answer, for this long at most before it registers (a slave whose log
    holds a newer epoch makes it a slave; ``actors/broker/ha/master_slave.py``)."""
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
        check_broker_name("BrokerConfig", "broker_name", self.broker_name)
        check_name("BrokerConfig", "cluster_name", self.cluster_name)
        check_name("BrokerConfig", "namespace", self.namespace)
        if not isinstance(self.broker_id, int) or self.broker_id < 0:
            raise InvalidConfigError(
                f"BrokerConfig.broker_id={self.broker_id!r}: must be an int >= 0"
            )
        if not 0 < self.listen_port < 65536:
            raise InvalidConfigError(
                f"BrokerConfig.listen_port={self.listen_port}: must be in 1..65535"
            )
        if not isinstance(self.data_port, int) or not 0 <= self.data_port < 65536:
            raise InvalidConfigError(
                f"BrokerConfig.data_port={self.data_port!r}: must be in 0..65535 (0: any free)"
            )
        if (
            not isinstance(self.max_requests_per_connection, int)
            or self.max_requests_per_connection < 1
        ):
            raise InvalidConfigError(
                f"BrokerConfig.max_requests_per_connection={self.max_requests_per_connection!r}: "
                "must be an int >= 1"
            )
        if not isinstance(self.max_frame_bytes, int) or self.max_frame_bytes < 1 << 16:
            raise InvalidConfigError(
                f"BrokerConfig.max_frame_bytes={self.max_frame_bytes!r}: must be an int >= 65536"
            )
        if (self.data_tls_cert is None) != (self.data_tls_key is None):
            raise InvalidConfigError(
                "BrokerConfig.data_tls_cert and data_tls_key: give both or neither"
            )
        if not isinstance(self.grpc_port, int) or not 0 <= self.grpc_port < 65536:
            raise InvalidConfigError(
                f"BrokerConfig.grpc_port={self.grpc_port!r}: must be in 0..65535 (0: any free)"
            )
        if self.grpc_enable and not (self.grpc_access_key and self.grpc_secret_key):
            raise InvalidConfigError(
                "BrokerConfig.grpc_enable needs grpc_access_key and grpc_secret_key: the "
                "endpoint serves only signed calls (start_cluster generates a pair)"
            )
        if (
            not isinstance(self.grpc_max_receive_bytes, int)
            or self.grpc_max_receive_bytes < 1 << 16
        ):
            raise InvalidConfigError(
                f"BrokerConfig.grpc_max_receive_bytes={self.grpc_max_receive_bytes!r}: "
                "must be an int >= 65536"
            )
        if not isinstance(self.grpc_max_pending_calls, int) or self.grpc_max_pending_calls < 1:
            raise InvalidConfigError(
                f"BrokerConfig.grpc_max_pending_calls={self.grpc_max_pending_calls!r}: "
                "must be an int >= 1"
            )
        if (
            isinstance(self.grpc_renew_invisible_s, (int, float))
            and isinstance(self.grpc_renew_ahead_s, (int, float))
            and not 0 < self.grpc_renew_ahead_s < self.grpc_renew_invisible_s <= 12 * 3600
        ):
            raise InvalidConfigError(
                f"BrokerConfig.grpc_renew_ahead_s={self.grpc_renew_ahead_s!r} and "
                f"grpc_renew_invisible_s={self.grpc_renew_invisible_s!r}: need "
                "0 < ahead < invisible <= 12 h"
            )
        interval = self.lite_expire_interval_ms
        if isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0:
            raise InvalidConfigError(
                f"BrokerConfig.lite_expire_interval_ms={interval!r}: must be an int > 0"
            )
        if not 1 <= self.default_topic_queue_nums <= 1024:
            raise InvalidConfigError(
                f"BrokerConfig.default_topic_queue_nums={self.default_topic_queue_nums}: "
                "must be in 1..1024"
            )
        if not (
            isinstance(self.cluster_lease_s, (int, float))
            and isinstance(self.lease_renew_interval_s, (int, float))
            and self.lease_renew_interval_s > 0
            and (self.cluster_lease_s == 0 or self.cluster_lease_s > self.lease_renew_interval_s)
        ):
            raise InvalidConfigError(
                f"BrokerConfig.cluster_lease_s={self.cluster_lease_s!r} and "
                f"lease_renew_interval_s={self.lease_renew_interval_s!r}: need "
                "0 < renew interval < lease (or a lease of 0: none)"
            )
        check_positive(
            "BrokerConfig",
            heartbeat_interval_s=self.heartbeat_interval_s,
            register_timeout_s=self.register_timeout_s,
            flush_consumer_offset_interval_s=self.flush_consumer_offset_interval_s,
            max_pull_suspend_s=self.max_pull_suspend_s,
            channel_expired_s=self.channel_expired_s,
            grpc_auth_window_s=self.grpc_auth_window_s,
            grpc_renew_invisible_s=self.grpc_renew_invisible_s,
            grpc_renew_ahead_s=self.grpc_renew_ahead_s,
            grpc_renew_max_s=self.grpc_renew_max_s,
            io_threads=self.io_threads,
            transaction_check_interval_s=self.transaction_check_interval_s,
            transaction_timeout_s=self.transaction_timeout_s,
            transaction_check_max=self.transaction_check_max,
            pop_revive_interval_s=self.pop_revive_interval_s,
            metrics_export_interval_s=self.metrics_export_interval_s,
            metrics_lag_interval_s=self.metrics_lag_interval_s,
        )
        if (
            not isinstance(self.pop_max_reconsume_times, int)
            or isinstance(self.pop_max_reconsume_times, bool)
            or self.pop_max_reconsume_times < 0
        ):
            raise InvalidConfigError(
                f"BrokerConfig.pop_max_reconsume_times={self.pop_max_reconsume_times!r}: "
                "must be an int >= 0"
            )
        if not isinstance(self.malloc_trim_threshold, int) or self.malloc_trim_threshold < 0:
            raise InvalidConfigError(
                f"BrokerConfig.malloc_trim_threshold={self.malloc_trim_threshold!r}: "
                "must be an int >= 0"
            )
        check_process_nice("BrokerConfig", self.process_nice)
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
            if key not in _BROKER_CONF_KEYS and key not in _STORE_CONF_KEYS:
                _warn_unread(path, key)
                continue
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


def _warn_unread(path: str | os.PathLike[str], key: str) -> None:
    """A ``broker.conf`` key RayMQ does not read: say so, and why or what was meant."""
    reason = _UNREAD_CONF_KEYS.get(key)
    if reason is None:
        close = difflib.get_close_matches(key, [*_BROKER_CONF_KEYS, *_STORE_CONF_KEYS], n=1)
        reason = f"not a key RayMQ knows{f'; did you mean {close[0]}?' if close else ''}"
    log.warning("%s: %s is ignored: %s", path, key, reason)


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
    check_positive(
        "BrokerConfig",
        sync_replication_timeout_s=c.sync_replication_timeout_s,
        ha_transfer_batch_bytes=c.ha_transfer_batch_bytes,
        ha_max_gap_not_in_sync=c.ha_max_gap_not_in_sync,
        ha_slave_timeout_s=c.ha_slave_timeout_s,
        ha_poll_s=c.ha_poll_s,
        ha_ask_slaves_s=c.ha_ask_slaves_s,
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
    "transactionCheckInterval": ("transaction_check_interval_s", lambda v: int(v) / 1000),
    "transactionTimeOut": ("transaction_timeout_s", lambda v: int(v) / 1000),
    "transactionCheckMax": ("transaction_check_max", int),
}

_UNREAD_CONF_KEYS: dict[str, str] = {
    "namesrvAddr": (
        "a broker finds its NameServers as Ray actors by name in its namespace "
        "(BrokerConfig.nameservers), not by address"
    ),
    "storePathCommitLog": "the CommitLog is always in <storePathRootDir>/commitlog",
    "storePathConsumeQueue": "ConsumeQueues are always in <storePathRootDir>/consumequeue",
    "storePathIndex": "index files are always in <storePathRootDir>/index",
    "brokerIP2": "a slave replicates from its master through Ray actor calls",
    "haListenPort": "a slave replicates from its master through Ray actor calls",
    "sendMessageThreadPoolNums": (
        "the broker actor serves sends on its event loop (blocking store work: io_threads)"
    ),
    "pullMessageThreadPoolNums": (
        "the broker actor serves pulls on its event loop (blocking store work: io_threads)"
    ),
}
"""RocketMQ ``broker.conf`` keys RayMQ leaves alone on purpose, and why."""
