"""Queue allocation for consumer groups: RocketMQ's rebalance strategies.

Pure Python, never imports Ray. For one group's queues and members, every
strategy but ``config`` gives each eligible queue exactly one owner, and the
result depends only on the strategy's options and the sets of queues and
consumer ids, never on the order they are given in. Results equal RocketMQ's
client strategies for the same inputs.
"""

from rebalance.assignment import assign
from rebalance.machine_room import room_of_broker
from rebalance.message_queue import MessageQueue
from rebalance.registry import STRATEGY_NAMES, get_strategy
from rebalance.strategy import AllocateStrategy

__all__ = [
    "STRATEGY_NAMES",
    "AllocateStrategy",
    "MessageQueue",
    "assign",
    "get_strategy",
    "room_of_broker",
]
