"""A whole deployment: ``ClusterConfig`` is what ``raymq up`` reads from YAML or TOML."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.config.broker import BrokerConfig
from actors.config.namesrv import NameServerConfig
from actors.config.options import check_name
from actors.protocol.names import DEFAULT_CLUSTER, DEFAULT_NAMESPACE, MASTER_ID
from actors.protocol.topic import TopicConfig
from storage.errors import InvalidConfigError

LOCAL_RAY_WORKER_NICENESS = 0
"""The niceness of the workers of a Ray that RayMQ starts itself (:func:`actors.start_cluster`
with no Ray running, ``raymq up --local``; ``cluster.yaml`` sets the same). Ray's default,
15, makes a broker, a consumer or a Spark executor wait whenever a process at nice 0 (a
driver, Ray's daemons, anything else on the node) wants the CPU: on two cores, at 1,000
msg/s, p99 2.6–2.9 ms and p99.9 5.9–7.2 ms against 1.7–2.0 and 3.9–4.5 at 0
(``docs/latency.md``)."""


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
    keeper: bool = True
    """Run the keeper (``actors/keeper/keeper.py``): a broker whose node died starts again
    on a node that joins with the resource (address, name) its spec names. It starts only
    where it may act: some broker's spec names its node that way, or ``auto_promote``."""
    keeper_interval_s: float = 2.0
    auto_promote: bool = False
    """The keeper also promotes a slave when a master/slave group's master died with its
    node (with the checks of ``raymq broker promote``). Off by default, as RocketMQ's
    controller mode."""

    def __post_init__(self) -> None:
        check_name("ClusterConfig", "namespace", self.namespace)
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
        if not isinstance(self.keeper_interval_s, (int, float)) or not self.keeper_interval_s > 0:
            raise InvalidConfigError(
                f"ClusterConfig.keeper_interval_s={self.keeper_interval_s!r}: must be > 0"
            )
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
