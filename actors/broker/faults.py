"""Faults injected into a live broker, for tests and failure drills.

``Broker.inject_fault(kind, count)`` arms the next ``count`` sends:

* ``"drop_answer"``: the batch is stored, then the answer is lost: the data path
  closes the client's connection instead of answering (a Ray call fails with
  :class:`AnswerDroppedError`). What a network cut right after the store does.
* ``"crash_after_store"``: the batch is stored, then the broker's process exits
  at once (``os._exit``) without answering: a SIGKILL at the worst moment. Ray
  restarts the actor, which recovers its store.
* ``"hang_after_store"``: the batch is stored, and the answer never comes (the
  request waits forever): a broker that stops answering while it still holds its
  connections, for a failover drill.
* ``"crash_mid_commit"`` (counts multi-message transaction commits, not sends): the
  commit's append stops after the first half of its committed copies, before its op
  message, and the process exits: a SIGKILL in the middle of the append.
* ``"lose_cluster"`` (counts the pings of the broker's cluster lease,
  ``actors/broker/lease.py``): they go unanswered, as in a partition that cuts the
  broker off from Ray's GCS and every NameServer while its clients still reach it.
* ``"stall_status"`` (counts ``status`` calls): the call answers only once the broker
  shuts down: a member alive but not answering (a stalled disk, a long pause), as an
  operator's promotion may meet one.

Only callers holding the broker's Ray handle (the cluster) can arm them.
"""

from __future__ import annotations

import logging
import os
import threading

from actors.protocol.errors import AnswerDroppedError
from storage.errors import InvalidConfigError

log = logging.getLogger("raymq.actors.broker.faults")

SEND_KINDS = ("drop_answer", "crash_after_store", "hang_after_store")
KINDS = (
    *SEND_KINDS,
    "crash_mid_commit",
    "stall_status",
    "crash_after_one_phase",
    "lose_cluster",
)


class Faults:
    def __init__(self, broker: str) -> None:
        self.broker = broker
        self._armed: dict[str, int] = {}
        self._lock = threading.Lock()

    def arm(self, kind: str, count: int = 1) -> None:
        if kind not in KINDS:
            raise InvalidConfigError(f"fault {kind!r}: must be one of {KINDS}")
        if not isinstance(count, int) or count < 0:
            raise InvalidConfigError(f"fault count={count!r}: must be an int >= 0")
        with self._lock:
            self._armed[kind] = count
        log.warning("broker %s: fault %s armed for the next %d time(s)", self.broker, kind, count)

    @property
    def armed(self) -> bool:
        """Whether any fault is armed (a send then takes the general path, which injects it)."""
        return bool(self._armed) and any(n > 0 for n in self._armed.values())

    def after_store(self) -> bool:
        """Called once a send is stored, before it is answered: True when the answer is
        to hang (the caller waits forever)."""
        if not self._armed:
            return False
        with self._lock:
            kind = next((k for k, n in self._armed.items() if n > 0 and k in SEND_KINDS), None)
            if kind is None:
                return False
            self._armed[kind] -= 1
        log.warning("broker %s: injected fault %s", self.broker, kind)
        if kind == "crash_after_store":
            logging.shutdown()
            os._exit(137)
        if kind == "hang_after_store":
            return True
        raise AnswerDroppedError(f"broker {self.broker}: the answer was dropped (injected)")

    def take(self, kind: str) -> bool:
        """Whether ``kind`` (not a send's) is armed; counts it off when it is."""
        if not self._armed.get(kind):
            return False
        with self._lock:
            if not self._armed.get(kind):
                return False
            self._armed[kind] -= 1
        log.warning("broker %s: injected fault %s", self.broker, kind)
        return True

    @staticmethod
    def crash() -> None:
        """Exit the process now, as a SIGKILL would leave it."""
        logging.shutdown()
        os._exit(137)
