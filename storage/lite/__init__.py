"""Lite topics (RocketMQ 5's LiteTopic): millions of ordered, expiring sub-channels of a
parent topic, kept in the store's one CommitLog with one shared index
(:mod:`storage.lite.store`). Pure Python and numpy; never imports Ray."""

from .errors import IllegalLiteTopicError, LiteTopicQuotaExceededError, NotALiteParentError
from .names import MAX_NAME_LEN, validate_lite_name
from .state import STATE_TOPIC, encode_state
from .store import PROP_LITE_TOPIC, LiteConfig, LiteProposal, LitePutResult, LiteStore

__all__ = [
    "MAX_NAME_LEN",
    "PROP_LITE_TOPIC",
    "STATE_TOPIC",
    "IllegalLiteTopicError",
    "LiteConfig",
    "LiteProposal",
    "LitePutResult",
    "LiteStore",
    "LiteTopicQuotaExceededError",
    "NotALiteParentError",
    "encode_state",
    "validate_lite_name",
]
