"""Fault runs on real Ray nodes in network namespaces (``harness.FaultLab``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from harness import FaultLab, can_admin_network, missing_tools


@pytest.fixture
def lab_factory() -> Iterator[Any]:
    """``lab_factory(nodes, **options)``: a :class:`FaultLab`, taken down after the test.
    Skipped only where the platform forbids it (not root / no CAP_NET_ADMIN); a missing
    tool fails the test, as CI must have it."""
    if not can_admin_network():
        pytest.skip("needs root with CAP_NET_ADMIN to make network namespaces")
    if missing := missing_tools():
        pytest.fail(f"missing {missing}: .ci/run installs iproute2 and nftables")
    labs: list[FaultLab] = []

    def make(nodes: list[str], **options: Any) -> FaultLab:
        lab = FaultLab(nodes, **options)
        labs.append(lab)
        return lab.__enter__()

    try:
        yield make
    finally:
        for lab in labs:
            lab.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "long: a long fault run (a seed of benchmarks.faults, minutes each); left out of the "
        "default run, selected with -m long",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave ``long`` tests out unless the run selects them by marker (``-m long``)."""
    if "long" in (config.getoption("markexpr") or ""):
        return
    kept = [i for i in items if i.get_closest_marker("long") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
