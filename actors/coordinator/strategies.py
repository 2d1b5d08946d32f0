"""A consumer group's rebalance strategy as its members configure it.

Both ways a group rebalances build their strategy here: a group's coordinator for all
its members (``actors.coordinator.state``), and each consumer of an uncoordinated group
for itself (``actors.client.push.rebalance``). So a strategy name means the same in both
modes, every built-in strategy works in both, and the errors name what would work.

Machine rooms. A broker's room is in its name, ``<room>@<name>`` (RocketMQ's convention;
why, in :func:`actors.config.options.check_broker_name`); a broker without one is in
room ``DEFAULT``. A consumer's room is its ``machine_room``: a coordinator has every
member's from its join; an uncoordinated consumer sees the others only as the client
ids the brokers list, so a consumer with a room carries it at the end of its client id
(``...@room=<room>``, :func:`client_id_with_room`), where every member reads it.

'config'. Every member consumes the queues it lists (its own ``queues`` option), as in
RocketMQ. A coordinated group gives a queue one owner, so there the lists must not
overlap; uncoordinated members may list the same queues. A topic that no member lists
(the group's retry topic, usually) is split averagely among them, so its messages are
consumed once rather than never.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rebalance import STRATEGY_NAMES, AllocateStrategy, MessageQueue, assign, get_strategy
from rebalance import room_of_broker as _room_of_broker_name
from storage.errors import InvalidConfigError

log = logging.getLogger("raymq.actors.coordinator")

MACHINE_ROOM_STRATEGIES = ("machine_room", "machine_room_nearby")
DEFAULT_ROOM = "DEFAULT"
ROOM_TAG = "@room="

__all__ = [
    "DEFAULT_ROOM",
    "MACHINE_ROOM_STRATEGIES",
    "StrategySpec",
    "broker_room",
    "build_strategy",
    "client_id_room",
    "client_id_with_room",
    "config_shares",
    "configured_queues",
    "warn_roomless",
]


@dataclass(frozen=True)
class StrategySpec:
    """A strategy by name and options, as members give it at join."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def same_as(self, other: StrategySpec) -> bool:
        """Whether two members agree; under 'config' each lists its own queues."""
        if self.name == other.name == "config":
            return True
        return self.name == other.name and _comparable(self.options) == _comparable(other.options)

    def describe(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in sorted(_comparable(self.options).items()))
        return f"{self.name!r}" + (f" ({opts})" if opts else "")


def _comparable(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options with callables (a room resolver, an inner strategy) named, not compared
    by identity: the same function pickled to two members is two objects."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if callable(value) and not isinstance(value, type):
            value = (
                f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', repr(value))}"
            )
        elif isinstance(value, (set, frozenset, list, tuple)):
            value = tuple(sorted(map(str, value)))
        out[key] = value
    return out


# ---------------------------------------------------------------- machine rooms
def broker_room(mq: MessageQueue) -> str:
    """A queue's machine room: the room of its ``<room>@<name>`` broker, else ``DEFAULT``."""
    return _room_of_broker_name(mq.broker_name) or DEFAULT_ROOM


def warn_roomless(
    group: str, strategy: str, queues: Iterable[MessageQueue], warned: set[str]
) -> None:
    """Under a machine-room strategy, say (once per broker: ``warned`` remembers) that a
    broker's name carries no room, rather than let the strategy pass it over silently."""
    if strategy not in MACHINE_ROOM_STRATEGIES:
        return
    roomless = {mq.broker_name for mq in queues if not _room_of_broker_name(mq.broker_name)}
    for name in sorted(roomless - warned):
        warned.add(name)
        log.warning(
            "group %s: broker %s has no machine room (name it <room>@%s): %s",
            group,
            name,
            name,
            "machine_room gives its queues to nobody"
            if strategy == "machine_room"
            else "machine_room_nearby shares its queues among every member",
        )


def client_id_with_room(client_id: str, room: str | None) -> str:
    """``client_id`` carrying ``room`` where an uncoordinated group's members read it."""
    return f"{client_id}{ROOM_TAG}{room}" if room else client_id


def client_id_room(client_id: str) -> str | None:
    """The room a client id carries (:func:`client_id_with_room`), or ``None``."""
    _, tag, room = client_id.rpartition(ROOM_TAG)
    return room if tag and room else None


# ---------------------------------------------------------------- building the strategy
def build_strategy(spec: StrategySpec, rooms: Mapping[str, str | None]) -> AllocateStrategy:
    """The strategy object for ``spec`` over members with ``rooms`` (client id -> room),
    filled in where the strategy needs them. Raises InvalidConfigError for a bad name,
    bad options, or a machine-room strategy with a member that has no room."""
    if spec.name not in STRATEGY_NAMES:
        raise InvalidConfigError(
            f"rebalance strategy={spec.name!r}: unknown; one of {', '.join(STRATEGY_NAMES)}"
        )
    options = dict(spec.options)
    if spec.name in MACHINE_ROOM_STRATEGIES:
        missing = sorted(cid for cid, room in rooms.items() if not room)
        if missing:
            raise InvalidConfigError(
                f"rebalance strategy={spec.name!r} needs each member's machine_room; "
                f"none given by {missing[:5]}"
            )
    if spec.name == "machine_room":
        options.setdefault("consumer_idcs", sorted({r for r in rooms.values() if r}))
    elif spec.name == "machine_room_nearby":
        options.setdefault("inner", "averagely")
        options.setdefault("broker_room", broker_room)
        member_rooms = dict(rooms)
        options["consumer_room"] = lambda cid: member_rooms.get(cid) or DEFAULT_ROOM
    try:
        return get_strategy(spec.name, **options)
    except (TypeError, ValueError) as exc:
        raise InvalidConfigError(f"rebalance strategy={spec.name!r}: {exc}") from None


def configured_queues(spec: StrategySpec) -> frozenset[MessageQueue]:
    """The queues a 'config' member lists (its options checked)."""
    strategy = build_strategy(spec, {})
    return frozenset(getattr(strategy, "queues", ()))


def config_shares(
    group: str,
    topic: str,
    queues: Collection[MessageQueue],
    configured: Mapping[str, Collection[MessageQueue]],
) -> dict[str, list[MessageQueue]]:
    """'config' over one topic's ``queues``: each member of ``configured`` (client id ->
    the queues it lists) gets those of ``queues`` it lists; a topic none of them lists is
    split averagely among them."""
    if any(q.topic == topic for listed in configured.values() for q in listed):
        shares = {}
        for cid, listed in configured.items():
            chosen = set(listed)
            shares[cid] = sorted(q for q in queues if q in chosen)
        return shares
    if not queues or not configured:
        return {cid: [] for cid in configured}
    return assign("averagely", group, queues, list(configured))
