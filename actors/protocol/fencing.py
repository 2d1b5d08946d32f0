"""Fencing tokens: a consumer that lost a queue cannot commit it any more.

A consumer group's coordinator hands each queue out with a fencing token, the
pair ``(coordinator epoch, generation)`` at which the owner was given the
queue; tokens of one queue only grow from owner to owner. Push consumers send
their token with every offset commit. When the coordinator takes a queue from
an owner that did not confirm the handover (silent, dead, too slow), it first
raises the queue's fence here to the next owner's token; from then on a commit
carrying an older token is refused, so a stale owner cannot move the group's
offset backwards (or forwards past messages it never consumed).

The broker's table of fences is ``actors.broker.offset.fence_table``.
"""

from __future__ import annotations

from storage.errors import InvalidMessageError, RayMQError

FencingToken = tuple[int, int]  # (coordinator epoch, generation), compared as a tuple


class OffsetFencedError(RayMQError):
    """An offset commit carried a fencing token older than the queue's fence: the
    committer no longer owns the queue (nothing of the commit was applied)."""


def check_token(value: object, where: str) -> FencingToken:
    """``value`` as a fencing token, or InvalidMessageError naming ``where``."""
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        return (int(value[0]), int(value[1]))
    raise InvalidMessageError(
        f"fencing token {where}={value!r}: must be a pair (epoch, generation) of ints >= 0"
    )
