"""The storage package's modules import one another one way: no cycle, and in layers.

Counted as imports: TYPE_CHECKING blocks and imports inside functions too (a cycle
hidden in a function is still a cycle). ``storage.record`` imports the C module
``storage._native``, which an import graph of .py files reads as an import of the
package itself; that one edge is dropped.
"""

from __future__ import annotations

import itertools

import pytest

grimp = pytest.importorskip("grimp")

LAYERS = [  # from the facade down to the values and errors
    "lite",
    "store",
    {"recovery", "replica"},
    {"schedule", "timer"},
    "services",
    "producer_state",
    {
        "commitlog",
        "consume_queue_store",
        "index_file",
        "subscription",
        "_fast_encode",
        "quarantine",
        "transaction",
        "pop",
        "put_result",
    },
    "consume_queue",
    {"mapped_file", "codec"},
    "batch",
    {"record", "java_hash", "seq_slots"},
    "message",
    {"message_id", "properties"},
    {"checkpoint", "config", "config_files", "_crc", "raft", "txn_log"},
    "atomic_file",
    "errors",
]


@pytest.fixture(scope="module")
def graph():
    g = grimp.build_graph("storage", exclude_type_checking_imports=False, cache_dir=None)
    g.remove_import(importer="storage.record", imported="storage")
    return g


def test_no_two_modules_of_storage_import_each_other(graph) -> None:
    cycles = [
        (a, b)
        for a, b in itertools.combinations(sorted(graph.modules), 2)
        if graph.find_shortest_chain(a, b) and graph.find_shortest_chain(b, a)
    ]
    assert cycles == []


def test_each_module_imports_only_the_layers_below_it(graph) -> None:
    named = set().union(*({x} if isinstance(x, str) else x for x in LAYERS))
    children = {m.rpartition(".")[2] for m in graph.find_children("storage")}
    assert children == named, "a module of storage is missing from LAYERS"
    assert graph.find_illegal_dependencies_for_layers(LAYERS, containers={"storage"}) == set()


def test_the_package_loads_the_store_only_when_a_name_of_it_is_used() -> None:
    """A NameServer's process imports ``storage`` for its codec and errors: ``import
    storage`` loads the batch encoder (it registers itself) but not the store; the names
    mypy sees are the names served, from the same modules."""
    import ast
    import inspect
    import subprocess
    import sys

    import storage

    code = (
        "import sys, storage\n"
        "print('storage.store' in sys.modules)\n"
        "storage.MessageStore\n"
        "print('storage.store' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
    tree = ast.parse(inspect.getsource(storage))
    typed = {
        alias.name: f"storage.{node.module}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        for alias in node.names
    }
    assert typed == storage._EXPORTS
    for name in storage.__all__:
        assert getattr(storage, name) is not None
