"""Fault runs on real Ray nodes in network namespaces (``harness.FaultLab``).

Building a lab of five Ray nodes takes half a minute (one node at a time: see
``FaultLab._build``). Modules whose tests can share a lab say so with the same
``LAB_GROUP``; their tests run next to each other, after this folder's other tests. A
test that passed hands its lab on to the next test of its group (:meth:`FaultLab.reuse`
heals it and removes what the test left); the group's last test, a test that failed, or
a lab that cannot be made as new, takes it down.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import FaultLab, can_admin_network, missing_tools

log = logging.getLogger("raymq.tests.faults")


class LabPool:
    """At most one lab kept between tests: the last Ray lab, by its nodes and options."""

    def __init__(self) -> None:
        self.lab: FaultLab | None = None
        self.key = ""

    def get(self, nodes: list[str], options: dict[str, Any]) -> tuple[FaultLab, bool]:
        """A lab for those nodes and options: (the lab, whether the pool keeps it). A Ray
        lab is kept; a lab without Ray (the harness's own tests) is the test's own, and
        the kept one goes first (the labs of one machine share its names and lock)."""
        key = json.dumps([nodes, options], sort_keys=True, default=str)
        if self.lab is not None and key == self.key:
            return self.lab, True
        self.close()
        lab = FaultLab(nodes, **options).__enter__()
        if not options.get("ray", True) or options.get("keep"):
            return lab, False
        self.lab, self.key = lab, key
        return lab, True

    def handed_back(self, keep: bool) -> None:
        """After a test: keep the lab for the next if ``keep`` (the test passed and the
        next test is of its group) and the lab can be made as new, else take it down."""
        if self.lab is None:
            return
        why = "its test failed or the next is not of its group" if not keep else self.lab.reuse()
        if why is not None:
            log.info("fault lab taken down: %s", why)
            self.close()

    def close(self) -> None:
        if self.lab is not None:
            lab, self.lab, self.key = self.lab, None, ""
            lab.close()


@pytest.fixture(scope="package")
def lab_pool() -> Iterator[LabPool]:
    pool = LabPool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[CALL_PASSED] = report.passed
    return report


CALL_PASSED = pytest.StashKey[bool]()


@pytest.fixture
def lab_factory(request: pytest.FixtureRequest, lab_pool: LabPool) -> Iterator[Any]:
    """``lab_factory(nodes, **options)``: a :class:`FaultLab`, made as new for the test
    (shared with the tests before and after it that ask for the same). Skipped only where
    the platform forbids it (not root / no CAP_NET_ADMIN); a missing tool fails the
    test, as CI must have it."""
    if not can_admin_network():
        pytest.skip("needs root with CAP_NET_ADMIN to make network namespaces")
    if missing := missing_tools():
        pytest.fail(f"missing {missing}: .ci/run installs iproute2 and nftables")
    own: list[FaultLab] = []
    pooled = False

    def make(nodes: list[str], **options: Any) -> FaultLab:
        nonlocal pooled
        lab, kept = lab_pool.get(list(nodes), options)
        if kept:
            pooled = True
        else:
            own.append(lab)
        return lab

    try:
        yield make
    finally:
        for lab in own:
            lab.close()
        if pooled:
            passed = request.node.stash.get(CALL_PASSED, False)
            lab_pool.handed_back(passed and _next_shares(request.node))


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
    # the tests of one LAB_GROUP next to each other, after this folder's tests that build
    # no lab (the session's other tests keep their places)
    folder = Path(__file__).parent
    mine = [i for i, item in enumerate(items) if folder in Path(item.path).parents]
    if not mine:
        return
    block = [items[i] for i in mine]
    labs = [i for i in block if "lab_factory" in getattr(i, "fixturenames", ())]
    groups: dict[str, int] = {}
    for item in labs:
        groups.setdefault(_group(item), len(groups))
    labs.sort(key=lambda i: groups[_group(i)])
    ordered = [i for i in block if i not in labs] + labs
    for i, item in zip(mine, ordered):
        items[i] = item


def _next_shares(item: pytest.Item) -> bool:
    """Whether the test run after ``item`` builds a lab of ``item``'s group: otherwise the
    lab goes now, not at the end of the session (a folder without ``__init__.py`` ends
    its package-scoped fixtures only there), so no idle Ray nodes outlive their tests."""
    items = item.session.items
    i = items.index(item)
    after = items[i + 1] if i + 1 < len(items) else None
    return (
        after is not None
        and "lab_factory" in getattr(after, "fixturenames", ())
        and _group(after) == _group(item)
    )


def _group(item: pytest.Item) -> str:
    module = getattr(item, "module", None)
    return str(getattr(module, "LAB_GROUP", item.nodeid))
