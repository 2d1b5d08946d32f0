"""Building a config from keyword options, and the checks every config shares."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from storage.errors import InvalidConfigError

C = TypeVar("C")


def with_options(config: C, options: Mapping[str, Any]) -> C:
    """``config`` with some fields replaced; unknown names are an InvalidConfigError."""
    known = {f.name for f in dataclasses.fields(config)}  # type: ignore[arg-type]
    unknown = set(options) - known
    if unknown:
        raise InvalidConfigError(
            f"{type(config).__name__}: unknown option(s) {sorted(unknown)}; known: {sorted(known)}"
        )
    return dataclasses.replace(config, **options)  # type: ignore[type-var]


def check_positive(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise InvalidConfigError(f"{owner}.{name}={value!r}: must be a number > 0")


def check_name(owner: str, name: str, value: object) -> None:
    if not isinstance(value, str) or not value or not all(c.isalnum() or c in "_-" for c in value):
        raise InvalidConfigError(
            f"{owner}.{name}={value!r}: must be non-empty letters, digits, '_' or '-'"
        )
