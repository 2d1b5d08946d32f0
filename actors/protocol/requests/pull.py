"""Pulls: several queues of one broker in one call, held until one has a message
(``actors.broker.processor.pull``)."""

from __future__ import annotations

from typing import Any

from actors.protocol.requests.declare import Answer, Request, body
from storage.errors import InvalidMessageError, TopicNotFoundError


def _reply_pulls(answer: Any) -> tuple[dict[str, Any], list[Any]]:
    return {}, answer if isinstance(answer, list) else [answer]


def _read_pulls(h: Any, body: Any) -> Any:
    return body


PULL = Request(
    "PULL",
    11,
    "pull_packed",
    (body("request"),),
    # the answer's blob, in parts (records out of band): joined again by the socket
    served_by=("puller", "pull_packed"),
    answer=Answer(_reply_pulls, _read_pulls),
    ordered=False,  # a read the broker may hold: it neither waits for nor holds others
    errors=(InvalidMessageError, TopicNotFoundError),
    doc="``pull_request_to_wire``'s blob; answers ``pulls_to_wire``'s.",
)

REQUESTS = (PULL,)
