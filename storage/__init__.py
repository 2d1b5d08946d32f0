"""RayMQ's message store: RocketMQ's CommitLog, ConsumeQueue and IndexFile in Python.

Pure Python (numpy for the batch arithmetic); never imports Ray.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from . import _fast_encode  # noqa: F401  (registers the plain-batch encoder with batch)

if _typing.TYPE_CHECKING:
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
    from .message import (
        GetResult,
        GetStatus,
        Message,
        MessageExt,
        PutResult,
        PutStatus,
        RawGetResult,
    )
    from .put_result import PutBatchResult, PutResults
    from .store import MessageStore

# Imported from its module when first used (PEP 562): a NameServer's process, which
# needs the codec and the errors, does not load the store and its services.
_EXPORTS: dict[str, str] = {
    "EncodedBatch": "storage.batch",
    "encode_batch": "storage.batch",
    "StoreConfig": "storage.config",
    "BrokerUnavailableError": "storage.errors",
    "DiskFullError": "storage.errors",
    "InvalidConfigError": "storage.errors",
    "InvalidMessageError": "storage.errors",
    "OffsetOutOfRangeError": "storage.errors",
    "PermissionDeniedError": "storage.errors",
    "RayMQError": "storage.errors",
    "StoreClosedError": "storage.errors",
    "StoreCorruptedError": "storage.errors",
    "StoreLockedError": "storage.errors",
    "TopicNotFoundError": "storage.errors",
    "GetResult": "storage.message",
    "GetStatus": "storage.message",
    "Message": "storage.message",
    "MessageExt": "storage.message",
    "PutResult": "storage.message",
    "PutStatus": "storage.message",
    "RawGetResult": "storage.message",
    "PutBatchResult": "storage.put_result",
    "PutResults": "storage.put_result",
    "MessageStore": "storage.store",
}


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'storage' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


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
