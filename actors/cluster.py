"""Starting a RayMQ cluster on the current Ray cluster, and attaching to one.

Actors are detached and named in a Ray namespace (default ``raymq``):
``nameserver-<i>`` for NameServers and ``<broker name>-<broker id>`` (for
example ``broker-a-0``) for brokers, so any job finds them with
``ray.get_actor(name, namespace=...)`` or :func:`connect`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.client.admin import Admin
from actors.client.producer import Producer
from actors.client.pull_consumer import PullConsumer
from actors.client.simple_consumer import SimpleConsumer
from actors.client.transactional import TransactionalProducer
from actors.config.broker import BrokerConfig
from actors.config.cluster import LOCAL_RAY_WORKER_NICENESS, BrokerSpec, ClusterConfig
from actors.config.console import ConsoleConfig
from actors.config.namesrv import NameServerConfig
from actors.console.server import console_url, start_console
from actors.coordinator.txn import transaction_coordinator
from actors.keeper import (
    ACTOR_MAX_CONCURRENCY,
    KEEPER_ACTOR_NAME,
    KeptBroker,
    resolve_node,
    start_broker_actor,
    start_keeper,
)
from actors.keeper import (  # also read from here (tests, benchmarks)
    BROKER_RUNTIME_ENV as BROKER_RUNTIME_ENV,
)
from actors.namesrv.client import NAMESERVER_PREFIX, discover_nameservers, named_actors
from actors.namesrv.nameserver import NameServer
from actors.protocol import rpc as _rpc
from actors.protocol.names import DEFAULT_NAMESPACE, broker_actor_name, nameserver_actor_name
from actors.protocol.topic import TopicConfig
from storage.errors import BrokerUnavailableError, InvalidConfigError, RayMQError

log = logging.getLogger("raymq.actors.cluster")

STARTUP_TIMEOUT_S = 120.0


class Cluster:
    """A handle on a running RayMQ cluster: clients, admin and shutdown."""

    def __init__(
        self, namespace: str = DEFAULT_NAMESPACE, nameservers: Sequence[str] | None = None
    ) -> None:
        self.namespace = namespace
        self.nameserver_names = list(nameservers or discover_nameservers(namespace))
        self._admin: Admin | None = None

    def producer(self, group: str = "DEFAULT_PRODUCER", **options: Any) -> Producer:
        return Producer(
            group, namespace=self.namespace, nameservers=self.nameserver_names, **options
        )

    def transactional_producer(
        self, group: str, transactional_id: str, **options: Any
    ) -> TransactionalProducer:
        """A producer of multi-message transactions (``actors.client.transactional``)."""
        return TransactionalProducer(
            group,
            transactional_id=transactional_id,
            namespace=self.namespace,
            nameservers=self.nameserver_names,
            **options,
        )

    def pull_consumer(self, group: str, **options: Any) -> PullConsumer:
        return PullConsumer(
            group, namespace=self.namespace, nameservers=self.nameserver_names, **options
        )

    def simple_consumer(self, group: str, topic: str, **options: Any) -> SimpleConsumer:
        """A POP consumer of ``topic`` for ``group`` (``actors.client.simple_consumer``)."""
        return SimpleConsumer(
            group, topic, namespace=self.namespace, nameservers=self.nameserver_names, **options
        )

    @property
    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.namespace, self.nameserver_names)
        return self._admin

    def nameserver(self, index: int) -> Any:
        return ray.get_actor(nameserver_actor_name(index), namespace=self.namespace)

    def broker(self, broker_name: str, broker_id: int = 0) -> Any:
        return ray.get_actor(broker_actor_name(broker_name, broker_id), namespace=self.namespace)

    def actor_names(self) -> list[str]:
        return named_actors(self.namespace)

    def grpc_endpoints(self) -> dict[str, dict[str, Any]]:
        """Each broker's RocketMQ 5 gRPC endpoint (``grpc_enable``) by actor name: its
        ``addr``, ``tls``, the ``access_key`` and ``secret_key`` calls must be signed with
        and call ``stats``. A RocketMQ 5 client's ``endpoints`` is any of the addresses."""
        names = [n for n in named_actors(self.namespace) if not n.startswith(NAMESERVER_PREFIX)]
        out: dict[str, dict[str, Any]] = {}
        for name in names:
            with contextlib.suppress(Exception):  # not a broker, or one without gRPC
                handle = ray.get_actor(name, namespace=self.namespace)
                info = _rpc.get(handle.grpc_endpoint.remote(), 10.0)
                if info is not None:
                    out[name] = info
        return out

    def grpc_credentials(self) -> tuple[str, str]:
        """The access key and secret key of the cluster's gRPC endpoints."""
        for info in self.grpc_endpoints().values():
            return info["access_key"], info["secret_key"]
        raise RayMQError(f"no broker of namespace {self.namespace!r} serves gRPC")

    def console_url(self) -> str | None:
        """The URL of the web console (the ``console`` actor), or None when none runs."""
        return console_url(self.namespace)

    def start_console(self, config: ConsoleConfig | None = None) -> str:
        """Start the web console on the head node (or find the running one); its URL."""
        cfg = config or ConsoleConfig(namespace=self.namespace)
        if cfg.namespace != self.namespace:
            raise InvalidConfigError(
                f"console namespace {cfg.namespace!r} is not the cluster's {self.namespace!r}"
            )
        return start_console(cfg)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop brokers cleanly (offsets saved, stores closed), then every RayMQ actor of
        the namespace."""
        names = named_actors(self.namespace)
        if KEEPER_ACTOR_NAME in names:  # first: it must not start a broker being stopped
            with contextlib.suppress(ValueError):  # (it holds nothing to save)
                ray.kill(ray.get_actor(KEEPER_ACTOR_NAME, namespace=self.namespace))
        brokers = {}
        for name in names:
            if name.startswith(NAMESERVER_PREFIX) or name == KEEPER_ACTOR_NAME:
                continue
            try:
                brokers[name] = ray.get_actor(name, namespace=self.namespace)
            except ValueError:
                continue
        refs: dict[str, Any] = {name: h.shutdown.remote() for name, h in brokers.items()}
        deadline = time.monotonic() + timeout_s
        for name, ref in refs.items():
            try:
                ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            except Exception as exc:  # noqa: BLE001 - a dead broker cannot shut down
                log.warning("broker %s did not shut down cleanly: %s", name, type(exc).__name__)
        for name in names:
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(name, namespace=self.namespace), no_restart=True)
        log.info("cluster in namespace %s shut down (%d actors)", self.namespace, len(names))


def connect(namespace: str = DEFAULT_NAMESPACE) -> Cluster:
    """Attach to a cluster another job started (Ray must be initialized)."""
    return Cluster(namespace)


def _broker_specs(brokers: int | Sequence[BrokerSpec | str]) -> list[BrokerSpec]:
    if isinstance(brokers, int):
        if not 1 <= brokers <= 26:
            raise InvalidConfigError(f"brokers={brokers}: must be 1..26 (or a list of BrokerSpec)")
        return [BrokerSpec(f"broker-{chr(ord('a') + i)}") for i in range(brokers)]
    return [BrokerSpec(b) if isinstance(b, str) else b for b in brokers]


def start_cluster(
    config: ClusterConfig | None = None,
    *,
    namespace: str | None = None,
    nameservers: int | None = None,
    brokers: int | Sequence[BrokerSpec | str] | None = None,
    store_root: str | None = None,
    topics: Sequence[TopicConfig | str] = (),
    broker_options: Mapping[str, Any] | None = None,
    nameserver_config: NameServerConfig | None = None,
    max_restarts: int | None = None,
    console: bool | ConsoleConfig = False,
    auto_promote: bool | None = None,
) -> Cluster:
    """Start NameServers and brokers on the current Ray cluster and return a handle.

    Brokers go on the caller's node unless a :class:`BrokerSpec` names a node;
    ``broker_options`` are :class:`BrokerConfig` fields for every broker (for
    example ``{"auto_create_topic_enable": False, "store": {"flush_disk_type":
    "SYNC_FLUSH"}}``). ``store_root`` puts broker stores in ``<store_root>/<actor
    name>`` (default: ``~/raymq/store/<namespace>/<actor name>`` on each node).
    ``console=True`` (or a :class:`ConsoleConfig`) also starts the web console on the
    head node (``Cluster.console_url()``; default http://127.0.0.1:8280/).
    A keeper actor starts a broker again on a node that joins with its spec's resource
    after its own node died (``ClusterConfig.keeper``); ``auto_promote=True`` also
    promotes a slave when a master's node dies (``actors/keeper/keeper.py``).
    """
    cfg = config or ClusterConfig()
    changes: dict[str, Any] = {}
    if namespace is not None:
        changes["namespace"] = namespace
    if nameservers is not None:
        changes["nameservers"] = nameservers
    if brokers is not None:
        changes["brokers"] = tuple(_broker_specs(brokers))
    if store_root is not None:
        changes["store_root"] = store_root
    if topics:
        changes["topics"] = tuple(
            t if isinstance(t, TopicConfig) else TopicConfig(t) for t in topics
        )
    if broker_options:
        changes["broker"] = {**cfg.broker, **broker_options}
    if nameserver_config is not None:
        changes["nameserver"] = nameserver_config
    if max_restarts is not None:
        changes["max_restarts"] = max_restarts
    if auto_promote is not None:
        changes["auto_promote"] = auto_promote
    cfg = dataclasses.replace(cfg, **changes)
    if not ray.is_initialized():
        ray.init(
            address="local",
            include_dashboard=False,
            _system_config={"worker_niceness": LOCAL_RAY_WORKER_NICENESS},
        )
    ns = cfg.namespace
    if any(n.startswith(NAMESERVER_PREFIX) for n in named_actors(ns)):
        raise RayMQError(
            f"a RayMQ cluster already runs in Ray namespace {ns!r}: use actors.connect()"
        )

    if cfg.broker.get("grpc_enable") and not cfg.broker.get("grpc_secret_key"):
        # one pair for the whole cluster (a client signs for every broker alike), known
        # only to the cluster: read it with Cluster.grpc_credentials()
        cfg = dataclasses.replace(
            cfg,
            broker={
                **cfg.broker,
                "grpc_access_key": cfg.broker.get("grpc_access_key") or "raymq",
                "grpc_secret_key": secrets.token_hex(20),
            },
        )
    ns_names = [nameserver_actor_name(i) for i in range(cfg.nameservers)]
    broker_cfgs, placements = [], []
    for i, spec in enumerate(cfg.brokers):
        values: dict[str, Any] = {"listen_port": 10911 + 10 * i, **cfg.broker, **spec.overrides}
        if values.get("enable_dledger") and not values.get("dledger_peers"):
            # a DLedger group is every broker of the same name
            values["dledger_peers"] = tuple(
                s.broker_id for s in cfg.brokers if s.broker_name == spec.broker_name
            )
        values.update(
            broker_name=spec.broker_name,
            broker_id=spec.broker_id,
            cluster_name=cfg.cluster_name,
            namespace=ns,
            nameservers=tuple(ns_names),
        )
        actor = broker_actor_name(spec.broker_name, spec.broker_id)
        values["store_dir"] = (
            spec.store_dir
            or (f"{cfg.store_root}/{actor}" if cfg.store_root else None)
            or values.get("store_dir")
        )
        broker_cfgs.append(BrokerConfig(**values))
        placements.append(resolve_node(spec.node))

    common = dict(
        namespace=ns,
        lifetime="detached",
        num_cpus=0,
        max_concurrency=ACTOR_MAX_CONCURRENCY,
        max_restarts=cfg.max_restarts,
    )
    # NameServers run on the caller's node (usually the head, which Ray cannot lose
    # without losing the cluster); a soft preference was seen to land them on nodes
    # that later leave.
    here = NodeAffinitySchedulingStrategy(resolve_node(None), soft=False)
    ns_handles: list[Any] = [
        ray.remote(NameServer)
        .options(name=name, scheduling_strategy=here, **common)
        .remote(cfg.nameserver, i)
        for i, name in enumerate(ns_names)
    ]
    cluster = Cluster(ns, ns_names)
    try:
        # the brokers start while the NameServers do (each start is a new worker
        # process: seconds); a broker's first registration waits for its NameServer
        handles: list[Any] = [
            start_broker_actor(bc, node_id, cfg.max_restarts)
            for bc, node_id in zip(broker_cfgs, placements)
        ]
        _rpc.get([h.ping.remote() for h in [*ns_handles, *handles]], STARTUP_TIMEOUT_S)
        # a DLedger group registers its elected leader as id 0 (its members as id + 1)
        expected = {
            (bc.broker_name, 0 if bc.enable_dledger else bc.broker_id) for bc in broker_cfgs
        }
        wait_for_brokers(ns_handles, sorted(expected))
        kept = [
            KeptBroker(bc, spec.node, node_id)
            for bc, spec, node_id in zip(broker_cfgs, cfg.brokers, placements)
        ]
        # with nothing to move (every broker pinned to the caller's node or by node id)
        # and no promotions to make, a keeper would never act: no process for it
        if cfg.keeper and (cfg.auto_promote or any(k.movable for k in kept)):
            start_keeper(
                ns,
                kept,
                resolve_node(None),
                max_restarts=cfg.max_restarts,
                interval_s=cfg.keeper_interval_s,
                auto_promote=cfg.auto_promote,
            )
        for tc in cfg.topics:
            _rpc.get([h.create_topic.remote(tc) for h in handles], STARTUP_TIMEOUT_S)
        tls_cert, tls_key = cfg.broker.get("data_tls_cert"), cfg.broker.get("data_tls_key")
        if tls_cert and tls_key:
            # the transaction coordinator's socket is sealed as the brokers' are: it is
            # made now, with their pair, rather than by the first transactional producer
            coordinator = transaction_coordinator(
                ns,
                log_dir=f"{cfg.store_root}/txn-coordinator" if cfg.store_root else None,
                nameservers=ns_names,
                tls_cert=tls_cert,
                tls_key=tls_key,
            )
            _rpc.get(coordinator.data_path.remote(), STARTUP_TIMEOUT_S)
        if console:
            cluster.start_console(
                dataclasses.replace(console, namespace=ns)
                if isinstance(console, ConsoleConfig)
                else ConsoleConfig(namespace=ns)
            )
    except BaseException:
        cluster.shutdown(timeout_s=5.0)
        raise
    log.info(
        "RayMQ cluster up in namespace %s: %d NameServers, brokers %s",
        ns,
        len(ns_names),
        [bc.actor_name for bc in broker_cfgs],
    )
    return cluster


def wait_for_brokers(
    nameservers: Sequence[Any], brokers: Sequence[tuple[str, int]], timeout_s: float = 30.0
) -> None:
    """Wait until every NameServer lists every given broker (their first registration)."""
    deadline = time.monotonic() + timeout_s
    while True:
        infos = _rpc.get([h.get_cluster_info.remote() for h in nameservers], timeout_s)
        missing = [
            (name, bid)
            for info in infos
            for name, bid in brokers
            if bid not in info["brokers"].get(name, {}).get("members", {})
        ]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise BrokerUnavailableError(
                f"brokers {sorted(set(missing))} did not register in {timeout_s}s"
            )
        time.sleep(0.05)
