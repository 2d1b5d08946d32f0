from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from store_sizes import DEFAULT_SIZES

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
def sizes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """ "small" unless a test is parametrized over ``STORE_SIZES``. With "default", what
    the test wrote under ``tmp_path`` (gigabytes) is deleted after it."""
    value = getattr(request, "param", "small")
    yield value
    if value == "default":
        for child in tmp_path.iterdir():
            shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()


@pytest.fixture
def make_config(sizes: str) -> Callable[..., StoreConfig]:
    """``make_config(path, **overrides)``: a small config for a store at ``path`` (with
    the default file sizes when the test runs over ``STORE_SIZES``' "default")."""
    if sizes == "small":
        return small_config

    def default_sized(path: Path, **overrides: object) -> StoreConfig:
        return small_config(path, **{**DEFAULT_SIZES, **overrides})

    return default_sized


@pytest.fixture
def config(tmp_path: Path, make_config: Callable[..., StoreConfig]) -> StoreConfig:
    return make_config(tmp_path / "store")


@pytest.fixture
def store(config: StoreConfig) -> Iterator[MessageStore]:
    s = MessageStore(config)
    yield s
    s.close()
