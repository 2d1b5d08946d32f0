"""The stubs' classes, derived from the request declarations: a method per socket
request, the actor's other Ray methods named one by one, nothing else."""

from __future__ import annotations

import inspect

import pytest

from actors.broker.broker import Broker
from actors.coordinator.txn import TransactionCoordinator
from actors.protocol import requests
from actors.protocol.data_path import (
    BROKER_RAY_ONLY,
    COORDINATOR_RAY_ONLY,
    BrokerStub,
    CoordinatorStub,
    DataPath,
    _Declared,
    _stub_class,
    _ThroughRay,
)


def _ray_methods(actor: type) -> set[str]:
    return {n for n, v in vars(actor).items() if not n.startswith("_") and inspect.isfunction(v)}


@pytest.mark.parametrize(
    ("stub", "actor", "declared", "ray_only"),
    [
        (BrokerStub, Broker, requests.BROKER, BROKER_RAY_ONLY),
        (CoordinatorStub, TransactionCoordinator, requests.COORDINATOR, COORDINATOR_RAY_ONLY),
    ],
    ids=["broker", "coordinator"],
)
def test_a_stub_has_a_method_per_declared_request_and_names_the_actors_others(
    stub: type, actor: type, declared: tuple[requests.Request, ...], ray_only: frozenset[str]
) -> None:
    """Every Ray method of the actor is on its stub: over the socket when declared,
    through Ray otherwise (a Ray method added to the actor and not to the stub fails
    here)."""
    methods = {r.method for r in declared}
    assert ray_only == _ray_methods(actor) - methods
    for r in declared:
        assert isinstance(vars(stub)[r.method], _Declared)
        assert vars(stub)[r.method].request is r
    for name in ray_only:
        assert isinstance(vars(stub)[name], _ThroughRay)


def test_a_name_the_actor_does_not_serve_is_no_attribute_of_its_stub() -> None:
    stub = BrokerStub(DataPath("socket"), "broker-x-0", handle=None)
    with pytest.raises(AttributeError):
        stub.no_such_method  # noqa: B018
    with pytest.raises(AttributeError):
        stub.end  # the coordinator's request, not a broker's  # noqa: B018
    assert repr(stub) == "BrokerStub(broker-x-0)"


def test_a_method_declared_and_named_ray_only_is_refused() -> None:
    with pytest.raises(ValueError, match="send"):
        _stub_class("Bad", requests.BROKER, frozenset({"send"}), "")


def test_wrap_takes_only_a_table_it_has_a_stub_for() -> None:
    dp = DataPath("socket")
    with pytest.raises(ValueError, match="COORDINATOR_REQUESTS"):
        dp.wrap("broker-x-0", None, requests.by_method(requests.BROKER[:1]))
    dp.close()
