from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import MessageStore, StoreConfig


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


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return small_config(tmp_path / "store")


@pytest.fixture
def store(config: StoreConfig) -> Iterator[MessageStore]:
    s = MessageStore(config)
    yield s
    s.close()


@pytest.fixture
def make_config() -> object:
    """``make_config(path, **overrides)``: a small config for a store at ``path``."""
    return small_config
