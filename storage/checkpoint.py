"""StoreCheckpoint: how far the store is known to be durable.

Layout (big-endian): RocketMQ's three timestamps ``physicMsgTimestamp i8 |
logicsMsgTimestamp i8 | indexMsgTimestamp i8``, then RayMQ's
``physic offset i8`` (CommitLog flushed up to here), ``logics offset i8``
(ConsumeQueues and index durable for every record below here), ``clean end i8``
(the exact CommitLog end at a clean stop, -1 while running) and a CRC32 of
what precedes it, so a torn checkpoint is detected and ignored.

Invariant: a checkpoint on disk never claims more than was durable when it
was written; recovery may always start scanning from ``min(physic, logics)``.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

_LAYOUT = struct.Struct(">qqqqqq")
_CRC = struct.Struct(">I")


@dataclass
class Checkpoint:
    physic_timestamp: int = 0
    logics_timestamp: int = 0
    index_timestamp: int = 0
    physic_offset: int = 0
    logics_offset: int = 0
    clean_end: int = -1

    @property
    def recovery_start(self) -> int:
        return min(self.physic_offset, self.logics_offset)


class CheckpointFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.valid = False
        self.value = Checkpoint()
        if path.exists():
            raw = path.read_bytes()
            size = _LAYOUT.size
            if len(raw) >= size + 4 and _CRC.unpack_from(raw, size)[0] == zlib.crc32(raw[:size]):
                self.value = Checkpoint(*_LAYOUT.unpack_from(raw, 0))
                self.valid = True
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def write(self, cp: Checkpoint) -> None:
        body = _LAYOUT.pack(
            cp.physic_timestamp,
            cp.logics_timestamp,
            cp.index_timestamp,
            cp.physic_offset,
            cp.logics_offset,
            cp.clean_end,
        )
        os.pwrite(self._fd, body + _CRC.pack(zlib.crc32(body)), 0)
        os.fdatasync(self._fd)
        self.value = cp

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
