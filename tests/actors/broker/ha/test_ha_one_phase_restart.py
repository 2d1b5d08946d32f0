"""A transactional producer's one-phase commit whose broker dies for good in the middle
of it (its process gone, no Ray restart: as when its node loses power) and is started
again under its name, as an operator or the fault lab does.

The dead actor's handle never answers again: the commit looks the broker up by name
and sends the same commit to the new actor, which finds it in its log (the append
was made before the crash) and answers it without writing it twice. The commit ends a
moment after the broker is back, not at the 30 s deadline. (It tried the dead handle
until then, and failed.) And the other way a broker comes back: Ray restarting its
actor in place, where the commit's tries meet ``ActorUnavailableError`` until it is.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import ray
from raymq_ha_testkit import broker_config, is_dead, read_all, start_broker, status_of
from raymq_testkit import wait_until

import actors
from actors import BrokerSpec, TransactionState
from storage import Message

TOPIC = "OnePhaseRestart"
BACK_WITHIN_S = 10.0
"""How soon after the broker answers again the commit must end (the tries pause 1 s at
most; the rest is the new broker registering, on a loaded machine)."""


class Retrying(logging.Handler):
    """Set once the producer logs that it tries a commit again."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "commit on" in record.getMessage():
            self.seen.set()


def test_a_one_phase_commit_reaches_its_broker_started_again_under_its_name(
    make_cluster: Any, tmp_path: Path
) -> None:
    root = str(tmp_path / "one-phase-restart")
    cluster = make_cluster(
        nameservers=1,
        brokers=[BrokerSpec("broker-a", 0)],
        topics=[actors.TopicConfig(TOPIC, 2, 2)],
        store_root=root,
        max_restarts=0,  # a crash is the end of the actor: no handle of it answers again
    )
    p = cluster.transactional_producer(
        "p-one-phase-restart",
        "tid-one-phase-restart",
        coordinator_log_dir=str(tmp_path / "coordinator"),
    )
    retrying = Retrying()
    logger = logging.getLogger("raymq.actors.client.transactional")
    logger.addHandler(retrying)
    try:
        with p.begin() as warm:  # the routes cached, and the one-phase path taken
            warm.send(Message(TOPIC, b"warm"))
        assert p.one_phase_commits == 1
        # the append is made, then the process exits before it answers
        old = cluster.broker("broker-a")
        ray.get(old.inject_fault.remote("crash_after_one_phase"))
        txn = p.begin()
        txn.send([Message(TOPIC, b"op-%d" % i) for i in range(5)])
        ended: dict[str, Any] = {}

        def commit() -> None:
            try:
                txn.commit()
                ended["at"] = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - asserted below
                ended["error"] = exc

        thread = threading.Thread(target=commit, daemon=True)
        thread.start()
        assert retrying.seen.wait(30), "the commit was never tried again"
        wait_until(lambda: is_dead(old), what="the broker's actor dead")
        started = time.monotonic()
        broker = start_broker(broker_config(cluster, root, "broker-a", 0))
        back = time.monotonic()
        thread.join(timeout=40)
        assert not thread.is_alive()
        assert "error" not in ended, ended.get("error")
        logging.getLogger(__name__).info(
            "commit ended %.2f s after the broker answered (%.2f s to restart it)",
            ended["at"] - back,
            back - started,
        )
        assert ended["at"] - back < BACK_WITHIN_S
        assert txn.state is TransactionState.COMMITTED and p.one_phase_commits == 2
        status = status_of(broker)
        assert status["txn_one_phase_repeated"] == 1 and status["txn_one_phase"] == 0
        bodies = read_all(cluster.pull_consumer("g-one-phase-restart"), TOPIC)
        assert sorted(bodies) == [b"op-%d" % i for i in range(5)] + [b"warm"]
    finally:
        logger.removeHandler(retrying)
        p.close()


class Unavailable(logging.Handler):
    """Counts the producer's tries after an ``ActorUnavailableError`` (Ray restarting the
    broker's actor: the call in flight may or may not have run)."""

    def __init__(self) -> None:
        super().__init__()
        self.tries = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "commit on" in message and "ActorUnavailableError" in message:
            self.tries += 1


def test_a_one_phase_commit_whose_broker_ray_restarts_in_place_is_answered_once(
    make_cluster: Any, tmp_path: Path
) -> None:
    """The broker's process dies after the append and before its answer; Ray restarts
    the actor (``max_restarts`` -1, the default), which recovers its store. The call in
    flight fails with ``ActorUnavailableError``: the commit pauses and tries the same
    handle again (within ``UNAVAILABLE_GRACE_S`` the actor may be coming back, so
    nothing is looked up), Ray holds the try until the actor is back, and the restarted
    broker finds the commit in its log: committed once, nothing written twice."""
    root = str(tmp_path / "one-phase-in-place")
    cluster = make_cluster(
        nameservers=1,
        brokers=[BrokerSpec("broker-a", 0)],
        topics=[actors.TopicConfig(TOPIC, 2, 2)],
        store_root=root,
    )
    p = cluster.transactional_producer(
        "p-one-phase-in-place",
        "tid-one-phase-in-place",
        coordinator_log_dir=str(tmp_path / "coordinator"),
    )
    unavailable = Unavailable()
    logger = logging.getLogger("raymq.actors.client.transactional")
    logger.addHandler(unavailable)
    try:
        with p.begin() as warm:
            warm.send(Message(TOPIC, b"warm"))
        broker = cluster.broker("broker-a")
        ray.get(broker.inject_fault.remote("crash_after_one_phase"))
        txn = p.begin()
        txn.send([Message(TOPIC, b"ip-%d" % i) for i in range(5)])
        txn.commit()
        assert txn.state is TransactionState.COMMITTED and p.one_phase_commits == 2
        assert unavailable.tries >= 1, "the commit never met the restarting actor"
        status = status_of(broker)  # the same handle: Ray restarted the actor in place
        assert status, "the restarted broker does not answer on its handle"
        assert status["txn_one_phase_repeated"] == 1 and status["txn_one_phase"] == 0
        bodies = read_all(cluster.pull_consumer("g-one-phase-in-place"), TOPIC)
        assert sorted(bodies) == [b"ip-%d" % i for i in range(5)] + [b"warm"]
    finally:
        logger.removeHandler(unavailable)
        p.close()
