"""The flat module paths of RayMQ 0.1 (``actors.producer``, ``actors.spark``, ...), kept
working for one release after the move into rooms, each with a DeprecationWarning
that names the new path. Nothing in RayMQ imports through them."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

# old module -> its new home; names that moved elsewhere when a module was split
MOVED: dict[str, str] = {
    "admin": "actors.client.admin",
    "bench": "actors.tools.bench",
    "cli": "actors.tools.cli",
    "consumer": "actors.client.pull_consumer",
    "datasource": "actors.bridge.datasource",
    "dledger": "actors.broker.ha.dledger",
    "metrics": "actors.broker.metrics",
    "nameserver": "actors.namesrv.nameserver",
    "producer": "actors.client.producer",
    "push_consumer": "actors.client.push.consumer",
    "route": "actors.protocol.route",
    "send_result": "actors.client.send_result",
    "spark": "actors.bridge.spark",
    "streaming": "actors.bridge.streaming",
    "topic": "actors.protocol.topic",
}
SPLIT: dict[str, dict[str, str]] = {
    "route": {"RouteInfoManager": "actors.namesrv.route_info"},
    "topic": {"SENT_TO_RETRY": "actors.protocol.wire", "SENT_TO_DLQ": "actors.protocol.wire"},
}


class _MovedModule(types.ModuleType):
    """Stands in for an old module: every name is looked up in its new home."""

    def __init__(self, old: str) -> None:
        super().__init__(f"actors.{old}", f"Moved to {MOVED[old]} (deprecated alias).")
        self._old = old

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        target = SPLIT.get(self._old, {}).get(name, MOVED[self._old])
        return getattr(importlib.import_module(target), name)

    def __dir__(self) -> list[str]:
        return sorted(
            set(dir(importlib.import_module(MOVED[self._old]))) | set(SPLIT.get(self._old, {}))
        )


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        prefix, _, old = fullname.rpartition(".")
        if prefix != "actors" or old not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        old = spec.name.rpartition(".")[2]
        warnings.warn(
            f"{spec.name} moved to {MOVED[old]}; the old path goes away in the next release",
            DeprecationWarning,
            stacklevel=2,  # warnings skips importlib's frames: 2 is the import statement
        )
        return _MovedModule(old)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
