"""RayMQ's one exception hierarchy.

Every error names the field, the value and the limit, so a caller can act on
the message alone. Errors raised before anything is written guarantee that
nothing was written.
"""

from __future__ import annotations


class RayMQError(Exception):
    """Base of every error RayMQ raises on purpose."""


class InvalidMessageError(RayMQError, ValueError):
    """A message, topic, property or queue id breaks a documented rule."""


class InvalidConfigError(RayMQError, ValueError):
    """A configuration value is out of range or unknown."""


class StoreCorruptedError(RayMQError):
    """Bytes on disk (or handed to the decoder) are not a valid record or file."""


class StoreLockedError(RayMQError):
    """Another process holds the store directory's lock."""


class StoreClosedError(RayMQError):
    """The store was closed; open a new one."""


class TopicNotFoundError(RayMQError, LookupError):
    """The topic does not exist (and auto-create is off)."""


class OffsetOutOfRangeError(RayMQError, IndexError):
    """An offset lies outside what the store holds."""


class BrokerUnavailableError(RayMQError):
    """No broker could take the request (dead, fenced or unreachable)."""


class DiskFullError(BrokerUnavailableError):
    """The store's disk is too full to take writes: over ``disk_space_warning_level_ratio``,
    or a file could not be allocated. Nothing was written; reads go on, and writes
    resume once there is room. A ``BrokerUnavailableError``: a producer sends to
    another broker (RocketMQ answers such a send SERVICE_NOT_AVAILABLE)."""


class PermissionDeniedError(RayMQError):
    """The topic's permission forbids the operation (read or write)."""


class ProducerSequenceError(RayMQError):
    """An idempotent producer's batch does not follow what the broker stored of it
    (``storage.producer_state``). Nothing of the batch was written."""


class OutOfOrderSequenceError(ProducerSequenceError):
    """The batch skips sequence numbers on its queue: one sent before it has not been
    stored yet. The producer sends it again after the missing one (Kafka's
    OUT_OF_ORDER_SEQUENCE_NUMBER)."""


class DuplicateSequenceError(ProducerSequenceError):
    """The batch was stored before, too long ago for its offsets to be remembered: it is
    not written again (Kafka's DUPLICATE_SEQUENCE_NUMBER)."""


class ProducerFencedError(ProducerSequenceError):
    """The batch comes from an older epoch of its producer than one already stored."""


class InvalidReceiptHandleError(RayMQError, ValueError):
    """A receipt handle that is malformed, forged, of another group, topic or broker, or
    of a message no longer in flight under it (superseded by a later receive or change of
    its invisible time). Nothing changed."""


class ReceiptHandleExpiredError(InvalidReceiptHandleError):
    """The handle's invisible time lapsed: the message is (or will be) delivered again
    under a new handle. Nothing changed."""


class TimerRecallError(RayMQError, ValueError):
    """A recall of a timer message refused: its time has come (it was delivered, or is
    being delivered now), it is too far ahead to be one, or this store holds no timer.
    Nothing changed."""
