"""The public API stays what it was before ``actors/`` moved into rooms, and the old
flat module paths still import, each with a DeprecationWarning naming its new home."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import warnings

import pytest

import actors
import actors.client
from actors._compat import MOVED

PUBLIC_0_1 = {
    "DEFAULT_NAMESPACE", "PERM_READ", "PERM_WRITE", "Admin", "BatchSendResult", "Broker",
    "BrokerConfig", "BrokerData", "BrokerSpec", "Cluster", "ClusterConfig", "ConsumeFromWhere",
    "ConsumeStatus", "ConsumerConfig", "ConsumerFleet", "CoordinatorConfig", "FleetConfig",
    "GroupCoordinator", "MessageModel", "NameServer", "NameServerConfig", "OffsetFencedError",
    "Producer", "ProducerBusyError", "ProducerConfig", "PromotionRefusedError", "PullConsumer",
    "PullResult", "PullStatus", "PushConsumer", "PushConsumerConfig", "QueueData", "SendResult",
    "SendStatus", "TopicConfig", "TopicRouteData", "broker_actor_name", "connect",
    "coordinator_actor_name", "coordinator_for", "discover_nameservers", "fleet_actor_name",
    "nameserver_actor_name", "start_cluster",
}  # fmt: skip
ADDED_SINCE_0_1 = {
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncHalf",
    "AsyncLiteConsumer",
    "AsyncLiteProducer",
    "AsyncProducer",
    "AsyncSimpleConsumer",
    "AsyncTransaction",
    "AsyncTransactionalProducer",
    "LocalTransactionState",
    "TransactionProducer",
    "TransactionSendResult",
    "SimpleConsumer",
    "Transaction",
    "TransactionCoordinator",
    "TransactionState",
    "TransactionStateError",
    "TransactionalProducer",
    "transaction_coordinator",
}
"""Names the top level gained after 0.1, and only these (none may go): transactional
messages (issue #24, with its multi-message transactions), POP consumption (issue #25),
the asyncio clients (issue #47)."""


def test_the_top_level_api_is_what_it_was() -> None:
    public = PUBLIC_0_1 | ADDED_SINCE_0_1
    assert set(actors.__all__) == public
    for name in public:
        assert getattr(actors, name) is not None
    # nothing else public leaks out of the package's namespace but the rooms themselves
    rooms = {"aio", "bridge", "broker", "client", "cluster", "config", "console", "coordinator"}
    rooms |= {"fleet", "keeper", "namesrv", "protocol", "tools"}
    extra = {
        n
        for n, v in vars(actors).items()
        if not n.startswith("_") and n not in public and not inspect.ismodule(v)
    }
    assert extra == set()
    assert {n for n, v in vars(actors).items() if inspect.ismodule(v) and n[0] != "_"} <= rooms


def test_the_top_level_imports_its_rooms_only_when_a_name_is_used() -> None:
    """``import actors`` (what every actor's process runs first) loads no room; a name
    loads its own room and not the others; the names mypy sees (the TYPE_CHECKING
    imports) are the names served, from the same modules."""
    code = (
        "import sys, actors\n"
        "print(sorted(m for m in sys.modules if m.startswith('actors.')))\n"
        "actors.NameServer\n"
        "print(sorted(m.split('.')[1] for m in sys.modules if m.startswith('actors.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    first, after = done.stdout.splitlines()
    assert ast.literal_eval(first) == ["actors._compat"]
    loaded = set(ast.literal_eval(after))
    assert "namesrv" in loaded and not loaded & {"client", "console", "bridge", "fleet"}
    tree = ast.parse(inspect.getsource(actors))
    typed = {
        alias.name: node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module != "actors"
        for alias in node.names
    }
    assert typed == actors._EXPORTS


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_still_imports_with_a_deprecation_warning(old: str) -> None:
    # in a fresh interpreter: this one may have imported the old path already
    code = (
        "import warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n"
        f"    import actors.{old}\n"
        "except DeprecationWarning as w:\n"
        "    print(w)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert f"actors.{old} moved to {MOVED[old]}" in out.stdout


def test_an_old_path_gives_the_same_objects_as_the_new_one() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from actors.producer import Producer  # type: ignore[import-not-found]
        from actors.route import RouteInfoManager, TopicRouteData  # type: ignore[import-not-found]
        from actors.spark import write_to_topic  # type: ignore[import-not-found]

    assert Producer is actors.Producer
    assert TopicRouteData is actors.TopicRouteData
    assert RouteInfoManager is importlib.import_module("actors.namesrv").RouteInfoManager
    assert write_to_topic is importlib.import_module("actors.bridge.spark").write_to_topic
    with pytest.raises(AttributeError):
        importlib.import_module("actors.producer").NoSuchThing  # noqa: B018


def test_the_bridge_loads_spark_only_when_asked() -> None:
    code = "import actors, actors.bridge, sys; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert callable(importlib.import_module("actors.bridge").read_topic)


def test_the_clients_package_imports_a_client_only_when_its_name_is_used() -> None:
    """A keeper's process needs ``Admin`` (``actors.client.admin``), not the push or
    simple consumers; ``import actors.client`` loads none of its modules, and the names
    mypy sees are the names served, from the same modules."""
    code = (
        "import sys, actors.client\n"
        "print(sorted(m for m in sys.modules if m.startswith('actors.client.')))\n"
        "actors.client.PullConsumer\n"
        "print(sorted(m for m in sys.modules if m.startswith('actors.client.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    first, after = done.stdout.splitlines()
    assert ast.literal_eval(first) == []
    loaded = set(ast.literal_eval(after))
    assert "actors.client.pull_consumer" in loaded
    assert not loaded & {"actors.client.simple_consumer", "actors.client.transactional"}
    tree = ast.parse(inspect.getsource(actors.client))
    typed = {
        alias.name: node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__"
        for alias in node.names
    }
    assert typed == actors.client._EXPORTS
    for name in actors.client.__all__:
        assert getattr(actors.client, name) is not None
