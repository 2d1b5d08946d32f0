"""An offset reset of a coordinated group, RocketMQ's ``RESET_CONSUMER_CLIENT_OFFSET``.

RocketMQ's broker tells every online client of the group to drop its offsets and take
the reset ones. Here the group's coordinator does it in three steps, so that no commit
an owner sends from before the reset can land after it:

1. :meth:`GroupState.begin_reset`: a new generation, whose token is the reset's fence,
   above every token handed out so far; no queue of the topic is assigned until step 3;
2. every broker holding the topic writes the new offsets and raises the queues' fences
   to that token in one step (``Broker.reset_offsets(..., fence=token)``), so every
   commit carrying an older token is refused from then on;
3. :meth:`GroupState.end_reset`: each owner is given its queues again under a newer
   token; seeing the token change, it drops each of them without a commit and starts
   it again from the committed offset, the reset one (``actors.client.push.coordinated``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from actors.coordinator.state import GroupState
from actors.protocol import rpc as _rpc
from rebalance import MessageQueue
from storage.errors import BrokerUnavailableError, InvalidConfigError, RayMQError

log = logging.getLogger("raymq.actors.coordinator.coordinator")


async def reset_topic(
    state: GroupState,
    brokers: Mapping[str, Any],
    topic: str,
    timestamp_ms: int | None,
    offsets: Mapping[MessageQueue, int] | None,
    timeout_s: float,
) -> dict[MessageQueue, int]:
    """Reset ``state``'s group on ``topic`` to ``timestamp_ms`` on every broker of
    ``brokers`` (name -> master handle), or to explicit ``offsets`` on their brokers;
    return the offsets written. A broker that fails leaves its queues as they were:
    its error is raised after the others' are done."""
    per_broker = None if offsets is None else _by_broker(topic, offsets, brokers)
    token = state.begin_reset(topic)
    done: dict[MessageQueue, int] = {}
    failed: dict[str, BaseException] = {}
    try:
        names = sorted(per_broker if per_broker is not None else brokers)
        results = await asyncio.gather(
            *(
                asyncio.wait_for(
                    brokers[name].reset_offsets.remote(
                        state.group,
                        topic,
                        timestamp_ms,
                        per_broker[name] if per_broker is not None else None,
                        token,
                    ),
                    timeout_s,
                )
                for name in names
            ),
            return_exceptions=True,
        )
        for name, result in zip(names, results):
            if isinstance(result, BaseException):
                failed[name] = _rpc.cause_of(result)
            else:
                done.update({MessageQueue(topic, name, q): off for q, off in result.items()})
    finally:
        told = state.end_reset(topic, done)
    log.info(
        "group %s: offsets of %s reset on %d queue(s) (fence %s); owners %s start again",
        state.group,
        topic,
        len(done),
        token,
        told,
    )
    if failed:
        if len(failed) == 1 and not done:
            raise next(iter(failed.values()))
        raise RayMQError(
            f"group {state.group!r}: offsets of {topic} reset on {len(done)} queue(s), "
            "failed on "
            + "; ".join(f"{n}: {type(e).__name__}: {e}" for n, e in sorted(failed.items()))
        )
    return done


def _by_broker(
    topic: str, offsets: Mapping[MessageQueue, int], brokers: Mapping[str, Any]
) -> dict[str, dict[int, int]]:
    """Explicit offsets by broker name and queue id, every queue of ``topic`` on a broker
    of ``brokers``."""
    out: dict[str, dict[int, int]] = {}
    for mq, off in offsets.items():
        if mq.topic != topic:
            raise InvalidConfigError(f"reset_offsets of {topic}: {mq} is another topic's")
        out.setdefault(mq.broker_name, {})[mq.queue_id] = off
    missing = sorted(set(out) - set(brokers))
    if missing:
        raise BrokerUnavailableError(
            f"reset_offsets of {topic}: broker(s) {missing} hold none of its queues or are "
            f"down; live: {sorted(brokers)}"
        )
    return out
