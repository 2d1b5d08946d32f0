"""The store file sizes the storage tests run with: their small ones (``small_config``)
and the defaults users run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from storage import StoreConfig

_SIZE_FIELDS = (
    "commitlog_file_size",
    "consume_queue_file_entries",
    "index_hash_slots",
    "index_max_entries",
    "max_message_size",
)
DEFAULT_SIZES = {
    f.name: f.default for f in dataclasses.fields(StoreConfig) if f.name in _SIZE_FIELDS
}
"""The file sizes users run: a 1 GiB CommitLog file, a ~420 MB index file."""

STORE_SIZES = [
    pytest.param("small"),
    pytest.param("default", marks=pytest.mark.default_sizes, id="default-sizes"),
]
"""For ``@pytest.mark.parametrize("sizes", STORE_SIZES, indirect=True)``: the test with small files
and again with ``DEFAULT_SIZES`` (marked ``default_sizes``); ``config``, ``store`` and
``make_config`` follow it."""


def small_config(path: Path, **overrides: object) -> StoreConfig:
    """Tiny files so tests roll, fill and expire them quickly."""
    values: dict[str, object] = dict(
        store_dir=str(path),
        commitlog_file_size=64 * 1024,
        consume_queue_file_entries=64,
        index_hash_slots=97,
        index_max_entries=400,
        max_message_size=16 * 1024,
        flush_interval_commitlog_ms=50,
        flush_interval_consume_queue_ms=50,
        store_host="10.1.2.3:10911",
    )
    values.update(overrides)
    return StoreConfig(**values)  # type: ignore[arg-type]
