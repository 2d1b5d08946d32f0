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


def check_process_nice(owner: str, value: object) -> None:
    """A ``process_nice`` (the niceness an actor lowers its process to): None or -20..19."""
    if value is not None and (
        not isinstance(value, int) or isinstance(value, bool) or not -20 <= value <= 19
    ):
        raise InvalidConfigError(
            f"{owner}.process_nice={value!r}: must be None or an int in -20..19"
        )


def check_name(owner: str, name: str, value: object) -> None:
    if not _plain(value):
        raise InvalidConfigError(
            f"{owner}.{name}={value!r}: must be non-empty letters, digits, '_' or '-'"
        )


def check_broker_name(owner: str, name: str, value: object) -> None:
    """A broker name: a plain name, or ``<room>@<name>`` with both parts plain names.

    A broker's machine room is part of its name, as RocketMQ's machine-room strategies
    read it (``AllocateMessageQueueByMachineRoom``, the resolvers of
    ``AllocateMachineRoomNearby``), rather than a separate setting: the name travels
    with every queue (routes, ``MessageQueue``, offsets, fences), so a strategy stays a
    pure function of queues and consumers and needs no second lookup that could
    disagree with the routes; and a RocketMQ ``broker.conf`` with
    ``brokerName=hz@broker-a`` means here what it means there. ``@`` is safe wherever
    the name goes: Ray actor names, store directories and metrics labels.
    """
    if isinstance(value, str) and value.count("@") == 1:
        room, _, plain = value.partition("@")
        if _plain(room) and _plain(plain):
            return
    elif _plain(value):
        return
    raise InvalidConfigError(
        f"{owner}.{name}={value!r}: must be a name of letters, digits, '_' or '-', "
        "optionally after its machine room and '@' (room@name)"
    )


def _plain(value: object) -> bool:
    return isinstance(value, str) and bool(value) and all(c.isalnum() or c in "_-" for c in value)


DATA_PATHS = ("socket", "ray")


def check_data_path(owner: str, value: object) -> None:
    if value not in DATA_PATHS:
        raise InvalidConfigError(f"{owner}.data_path={value!r}: must be one of {DATA_PATHS}")


ISOLATION_LEVELS = ("read_committed",)


def check_isolation(owner: str, value: object) -> None:
    """A consumer's ``isolation``: only ``"read_committed"``, what every consumer reads.
    ``"read_uncommitted"`` is refused with the reason (see ``docs/transactions.md``)."""
    if value == "read_uncommitted":
        raise InvalidConfigError(
            f"{owner}.isolation='read_uncommitted' is not offered: a transaction's messages "
            "wait as half messages in RMQ_SYS_TRANS_HALF_TOPIC until its commit writes them "
            "to their queues, so no consumer can read them before it (every consumer is "
            "read_committed; see docs/transactions.md)"
        )
    if value not in ISOLATION_LEVELS:
        raise InvalidConfigError(f"{owner}.isolation={value!r}: must be 'read_committed'")
