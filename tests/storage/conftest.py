from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from store_sizes import DEFAULT_SIZES, small_config

from storage import MessageStore, StoreConfig


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
