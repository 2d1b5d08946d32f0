"""The errors of lite topics, named after the v2 protocol's codes."""

from __future__ import annotations

from ..errors import InvalidMessageError, RayMQError


class IllegalLiteTopicError(InvalidMessageError):
    """A lite topic's name breaks the naming rule (``ILLEGAL_LITE_TOPIC``)."""


class LiteTopicQuotaExceededError(RayMQError):
    """A parent topic already holds its quota of lite topics (``LITE_TOPIC_QUOTA_EXCEEDED``)."""


class NotALiteParentError(RayMQError, LookupError):
    """The topic was not declared as a parent of lite topics (type LITE)."""
