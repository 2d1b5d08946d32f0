"""The store file sizes the storage tests run with besides their small ones."""

from __future__ import annotations

import dataclasses

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
