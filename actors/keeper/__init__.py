"""Keeping a cluster's brokers where their disks are: starting a broker actor on its node
(:mod:`actors.keeper.placement`), and the keeper actor that starts it again on a node
that joins with its resource after its own node died (:mod:`actors.keeper.keeper`)."""

from actors.keeper.keeper import KEEPER_ACTOR_NAME, BrokerKeeper, KeptBroker, start_keeper
from actors.keeper.placement import (
    ACTOR_MAX_CONCURRENCY,
    BROKER_RUNTIME_ENV,
    resolve_node,
    start_broker_actor,
)

__all__ = [
    "ACTOR_MAX_CONCURRENCY",
    "BROKER_RUNTIME_ENV",
    "KEEPER_ACTOR_NAME",
    "BrokerKeeper",
    "KeptBroker",
    "resolve_node",
    "start_broker_actor",
    "start_keeper",
]
