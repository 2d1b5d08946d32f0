"""The transaction coordinator's answer to a waiting commit while a participant broker is
down (docs/transactions.md, "A commit, step by step", item 5): the broker is retried
every ``retry_interval_s`` and the commit waits for those retries, up to
``apply_wait_s``. A broker back in time (restarted, its store recovered) makes it answer
``done: True`` as soon as a retry applied it there; one still down, ``done: False`` at
``apply_wait_s``, the transaction committed all the same."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
import ray
from raymq_testkit import drain

import actors
from actors import transaction_coordinator
from storage import Message

RESTART_WAIT_S = 60.0  # a commit's wait, long enough for a broker to restart on a busy machine
SHORT_WAIT_S = 2.0  # a commit's wait shorter than a broker that never comes back
LATER = "a broker applies it later"  # what the producer logs for ``done: False``


def two_brokers(make_cluster: Any, tmp_path: Path, apply_wait_s: float) -> tuple[Any, Any]:
    """A cluster of two brokers, TxA on broker-a and TxB on broker-b, and its coordinator
    made first, so that its ``apply_wait_s`` counts (a producer finds it)."""
    cluster = make_cluster(nameservers=1, brokers=2)
    cluster.admin.create_topic("TxA", 1, 1, brokers=["broker-a"])
    cluster.admin.create_topic("TxB", 1, 1, brokers=["broker-b"])
    coordinator = transaction_coordinator(
        cluster.namespace, log_dir=str(tmp_path / "txn"), apply_wait_s=apply_wait_s
    )
    ray.get(coordinator.ping.remote())
    return cluster, coordinator


def bodies(cluster: actors.Cluster, topic: str) -> list[bytes]:
    consumer = cluster.pull_consumer("txn-reader")
    return sorted(m.body for msgs in drain(consumer, topic).values() for m in msgs)


def prepared(cluster: actors.Cluster, tid: str, tmp_path: Path) -> Any:
    """A transaction with four half messages on each broker, sent and answered."""
    p = cluster.transactional_producer(
        "txn-producer", tid, coordinator_log_dir=str(tmp_path / "txn"), send_timeout_s=10.0
    )
    txn = p.begin()
    txn.send([Message("TxA", b"a-%d" % i) for i in range(4)])
    txn.send([Message("TxB", b"b-%d" % i) for i in range(4)])
    txn.flush()
    return p, txn


def test_a_commit_waits_for_a_restarting_broker_and_answers_done_once_it_applied(
    make_cluster: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cluster, coordinator = two_brokers(make_cluster, tmp_path, RESTART_WAIT_S)
    p, txn = prepared(cluster, "tid-back", tmp_path)
    try:
        ray.kill(cluster.broker("broker-b"), no_restart=False)  # Ray restarts it from its store
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="raymq.actors.client.transactional"):
            txn.commit()
        took = time.monotonic() - started
        # answered done: True, once broker-b was back and a retry applied it there
        assert LATER not in caplog.text
        assert ray.get(coordinator.transaction.remote(txn.txn_id))["done"]
        assert took < RESTART_WAIT_S
        assert bodies(cluster, "TxA") == [b"a-%d" % i for i in range(4)]
        assert bodies(cluster, "TxB") == [b"b-%d" % i for i in range(4)]
        for broker in ("broker-a", "broker-b"):  # every half message ended
            assert ray.get(cluster.broker(broker).pending_transactions.remote()) == []
        stats = ray.get(coordinator.status.remote())["stats"]
        assert stats["commit_done"] == 1
    finally:
        p.close()


def test_a_commit_answers_not_done_after_apply_wait_s_while_a_broker_stays_down(
    make_cluster: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cluster, coordinator = two_brokers(make_cluster, tmp_path, SHORT_WAIT_S)
    p, txn = prepared(cluster, "tid-gone", tmp_path)
    try:
        ray.kill(cluster.broker("broker-b"), no_restart=True)  # gone for good
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="raymq.actors.client.transactional"):
            txn.commit()
        took = time.monotonic() - started
        assert LATER in caplog.text  # answered done: False ...
        assert took >= SHORT_WAIT_S * 0.9  # ... after waiting for the retries
        assert not ray.get(coordinator.transaction.remote(txn.txn_id))["done"]
        assert ray.get(coordinator.transaction.remote(txn.txn_id))["state"] == "commit"
        assert bodies(cluster, "TxA") == [b"a-%d" % i for i in range(4)]
    finally:
        p.close()
