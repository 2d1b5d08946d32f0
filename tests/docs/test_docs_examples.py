"""Every fenced Python block of README.md and docs/ runs, page by page, against a local
cluster, so the docs cannot drift from the code (blocks marked ``<!-- norun -->`` are
fragments: see ``raymq_docs_pages.py``)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from raymq_docs_pages import pages, program, python_blocks, relative

import actors

RUNNING = {
    relative(p): [b for b in python_blocks(p) if b.runs]
    for p in pages()
    if any(b.runs for b in python_blocks(p))
}


def _clean_up(namespace: dict[str, Any], shared: actors.Cluster) -> None:
    """What a page left behind when it failed before its own clean-up."""
    for value in namespace.values():
        if isinstance(value, actors.Cluster) and value.namespace != shared.namespace:
            value.shutdown(timeout_s=10.0)
    for value in namespace.values():
        if isinstance(value, tempfile.TemporaryDirectory):
            value.cleanup()


@pytest.mark.parametrize("page", sorted(RUNNING))
def test_the_pages_python_blocks_run(page: str, docs_cluster: actors.Cluster) -> None:
    """A page's blocks run in order as one program; ``cluster`` is the shared one unless
    the page starts its own."""
    code = compile(program(RUNNING[page]), page, "exec")
    namespace: dict[str, Any] = {"__name__": "__docs__", "cluster": docs_cluster}
    try:
        exec(code, namespace)
    finally:
        _clean_up(namespace, docs_cluster)


def test_the_pages_that_must_run_do(tmp_path: Path) -> None:
    """The getting-started example and the how-to pages with examples are not all marked
    as fragments (a marker added by mistake would skip a page in silence)."""
    for page in (
        "README.md",
        "docs/getting-started/first-steps.md",
        "docs/how-to/consume.md",
        "docs/how-to/transactions.md",
        "docs/how-to/ha.md",
        "docs/how-to/delayed-timer.md",
        "docs/explanation/store.md",
    ):
        assert page in RUNNING, f"{page} has no Python block that runs"
