"""Values that cross Ray between clients and brokers: small, array-backed, one per batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from storage.message import PutStatus


@dataclass(frozen=True, slots=True)
class SendAck:
    """A broker's answer to one batch: per message its queue and commitlog offsets."""

    status: PutStatus
    broker_name: str
    store_host: str
    queue_offsets: np.ndarray
    commitlog_offsets: np.ndarray
