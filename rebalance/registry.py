"""Built-in strategies by name, as a consumer group's configuration names them."""

from __future__ import annotations

import inspect

from rebalance.averagely import AveragelyStrategy
from rebalance.by_config import ConfigStrategy
from rebalance.circle import CircleStrategy
from rebalance.consistent_hash import ConsistentHashStrategy
from rebalance.machine_room import MachineRoomStrategy
from rebalance.machine_room_nearby import MachineRoomNearbyStrategy
from rebalance.strategy import AllocateStrategy, BaseStrategy

_STRATEGIES: dict[str, type[BaseStrategy]] = {
    cls.name: cls
    for cls in (
        AveragelyStrategy,
        CircleStrategy,
        ConsistentHashStrategy,
        MachineRoomStrategy,
        MachineRoomNearbyStrategy,
        ConfigStrategy,
    )
}

STRATEGY_NAMES: tuple[str, ...] = tuple(_STRATEGIES)


def get_strategy(name: str, **options: object) -> AllocateStrategy:
    """The built-in strategy ``name`` configured with ``options``.

    Raises ``ValueError`` for an unknown name and ``TypeError`` for a missing or
    unknown option; each strategy checks its options' values itself.
    """
    if not isinstance(name, str):
        raise TypeError(f"strategy name must be a str, got {type(name).__name__}")
    cls = _STRATEGIES.get(name)
    if cls is None:
        raise ValueError(
            f"unknown rebalance strategy {name!r}; valid names are {', '.join(STRATEGY_NAMES)}"
        )
    parameters = inspect.signature(cls).parameters
    unknown = sorted(set(options) - set(parameters))
    if unknown:
        accepted = ", ".join(parameters) or "no options"
        raise TypeError(
            f"strategy {name!r} got unknown option(s) {', '.join(unknown)}; it accepts {accepted}"
        )
    missing = [
        option
        for option, parameter in parameters.items()
        if parameter.default is inspect.Parameter.empty and option not in options
    ]
    if missing:
        raise TypeError(f"strategy {name!r} needs option(s) {', '.join(missing)}")
    inner = options.get("inner")
    if isinstance(inner, str):
        # A wrapping strategy's inner strategy may be given by name.
        options["inner"] = get_strategy(inner)
    return cls(**options)
