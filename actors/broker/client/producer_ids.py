"""Producer ids for idempotent producers (``storage.producer_state``), handed out by brokers.

An id is ``<broker actor name>:<n>``: the broker's actor name (broker name and id)
is unique in the cluster, and ``n`` never repeats on that broker. ``n`` comes from
a counter kept in the store (``config/producerIds.json``) a block at a time: the
block's end is written (and fsynced) before any id in it is handed out, so after a
restart the broker goes on past it. The counter never starts below the wall clock in
microseconds, so even a broker whose store was wiped does not hand an old id out
again (unless its clock went back).
"""

from __future__ import annotations

import logging
import threading
import time

from storage.config_files import JsonConfigFile

log = logging.getLogger("raymq.actors.broker.client.producer_ids")

BLOCK = 1000


class ProducerIdAllocator:
    def __init__(self, file: JsonConfigFile, owner: str) -> None:
        self.file = file
        self.owner = owner
        self._lock = threading.Lock()
        self._next = max(int(file.load().get("reserved", 0)), time.time_ns() // 1000)
        self._reserved = self._next  # nothing of the block handed out is written yet

    def allocate(self) -> str:
        """A producer id never handed out before by this broker."""
        with self._lock:
            if self._next >= self._reserved:
                self._reserved = self._next + BLOCK
                self.file.save({"reserved": self._reserved})
            n = self._next
            self._next += 1
        return f"{self.owner}:{n}"
