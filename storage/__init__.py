"""RayMQ's message store: RocketMQ's CommitLog, ConsumeQueue and IndexFile in Python.

Pure Python (numpy for the batch arithmetic); never imports Ray.
"""

from . import _fast_encode  # noqa: F401  (registers the plain-batch encoder with batch)
from .batch import EncodedBatch, encode_batch
from .config import StoreConfig
from .errors import (
    BrokerUnavailableError,
    DiskFullError,
    InvalidConfigError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    PermissionDeniedError,
    RayMQError,
    StoreClosedError,
    StoreCorruptedError,
    StoreLockedError,
    TopicNotFoundError,
)
from .message import GetResult, GetStatus, Message, MessageExt, PutResult, PutStatus, RawGetResult
from .put_result import PutBatchResult, PutResults
from .store import MessageStore

__all__ = [
    "BrokerUnavailableError",
    "DiskFullError",
    "EncodedBatch",
    "GetResult",
    "GetStatus",
    "InvalidConfigError",
    "InvalidMessageError",
    "Message",
    "MessageExt",
    "MessageStore",
    "OffsetOutOfRangeError",
    "PermissionDeniedError",
    "PutBatchResult",
    "PutResult",
    "PutResults",
    "PutStatus",
    "RawGetResult",
    "RayMQError",
    "StoreClosedError",
    "StoreConfig",
    "StoreCorruptedError",
    "StoreLockedError",
    "TopicNotFoundError",
    "encode_batch",
]
