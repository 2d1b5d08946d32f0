"""A queue's offsets, for consumers that place themselves: its bounds, and the first
offset stored at or after a time (RocketMQ's ``GET_MIN_OFFSET``/``GET_MAX_OFFSET`` and
``SEARCH_OFFSET_BY_TIMESTAMP``; ``actors.broker.processor.admin``)."""

from __future__ import annotations

from actors.protocol.requests.declare import Field, Request, result_as
from actors.protocol.requests.fields import QUEUE_ID, TOPIC
from storage.errors import InvalidMessageError, TopicNotFoundError

GET_MAX_OFFSET = Request(
    "GET_MAX_OFFSET",
    24,
    "min_max_offset",
    (TOPIC, QUEUE_ID),
    served_by=("admin", "min_max_offset"),
    answer=result_as(tuple),  # (min offset, max offset), as the Ray method answers
    errors=(InvalidMessageError, TopicNotFoundError),
    doc="A queue's min and max offset in one round trip (a pull consumer's "
    "``min_offset`` and ``max_offset``).",
)

SEARCH_OFFSET = Request(
    "SEARCH_OFFSET",
    25,
    "offset_by_time",
    (TOPIC, QUEUE_ID, Field("timestamp_ms", "s")),
    served_by=("admin", "offset_by_time"),
    errors=(InvalidMessageError, TopicNotFoundError),
    doc="The first offset of a queue stored at or after ``timestamp_ms`` "
    "(a pull consumer's ``search_offset``).",
)

REQUESTS = (GET_MAX_OFFSET, SEARCH_OFFSET)
