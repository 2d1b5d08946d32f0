"""A transactional producer instance is fenced by another instance only, never by its
own tries of ``init_producer``. Every try carries the instance's token, and the
coordinator answers a token it knows with the epoch it gave that token: Ray runs an
async actor's calls in any order, so a try the producer gave up on (timed out while the
coordinator started) can run after the one whose answer it kept. A token a later
instance took over is refused; a new token fences the one before. The token is logged
with its epoch, so this holds across the coordinator's restart, and a try cut short
after its epoch was logged is completed by the next one (the fence raised)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from raymq_testkit import drain

import actors
from actors import TransactionalProducer, transaction_coordinator
from actors.protocol import rpc
from storage import Message
from storage.errors import ProducerFencedError
from storage.txn_log import KEEP_INSTANCES, ProducerEpoch, TransactionLog

TOPIC = "TxInst"


def test_the_log_keeps_each_instances_epoch_across_a_reopen_and_a_compaction(
    tmp_path: Path,
) -> None:
    log = TransactionLog(tmp_path)
    log.set_epoch("tid", "p", 0, "instance-a")
    log.set_epoch("tid", "p", 1, "instance-b")
    log.set_epoch("unnamed", "q", 4)  # an instance that gave no token
    log.close()
    for _ in ("reopened", "compacted"):
        log = TransactionLog(tmp_path)
        assert log.epoch_of_instance("tid", "instance-a") == 0
        assert log.epoch_of_instance("tid", "instance-b") == 1
        assert log.epoch_of_instance("tid", "instance-c") is None
        assert log.producers["tid"] == ProducerEpoch("p", 1, "instance-b")
        assert log.producers["unnamed"] == ProducerEpoch("q", 4, "")
        assert "unnamed" not in log.instances
        log.compact(0)
        log.close()
    log = TransactionLog(tmp_path)
    for i in range(KEEP_INSTANCES + 2):  # the latest instances are kept
        log.set_epoch("many", "p", i, f"i{i}")
    assert len(log.instances["many"]) == KEEP_INSTANCES
    assert log.epoch_of_instance("many", "i1") is None
    assert log.epoch_of_instance("many", f"i{KEEP_INSTANCES + 1}") == KEEP_INSTANCES + 1
    log.close()


@pytest.fixture(scope="module")
def cluster(one_broker: actors.Cluster) -> actors.Cluster:
    one_broker.admin.create_topic(TOPIC, 1, 1)
    return one_broker


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("txn-instances"))


def producer(cluster: actors.Cluster, log_dir: str, tid: str) -> TransactionalProducer:
    return cluster.transactional_producer(
        "inst-producer", tid, coordinator_log_dir=log_dir, send_timeout_s=10.0
    )


def commit(p: TransactionalProducer, body: bytes) -> None:
    """A two-phase commit of one message: its half message sent, then the coordinator's
    decision (which checks the epoch)."""
    with p.begin() as txn:
        txn.send(Message(TOPIC, body))
        txn.flush()


def epoch_at_coordinator(coordinator: Any, tid: str) -> int:
    return int(ray.get(coordinator.status.remote())["producers"][tid][1])


@pytest.fixture
def producers() -> Iterator[list[TransactionalProducer]]:
    made: list[TransactionalProducer] = []
    yield made
    for p in made:
        p.close()


def test_the_tries_of_one_instance_share_its_epoch_and_only_another_instance_fences_it(
    cluster: actors.Cluster, log_dir: str, producers: list[TransactionalProducer]
) -> None:
    coordinator = transaction_coordinator(cluster.namespace, log_dir=log_dir)
    # one instance's tries, sent together as its retries pile up while the coordinator
    # starts: Ray runs them in any order, and each answers the one epoch it holds
    tries = [coordinator.init_producer.remote("tid-tries", "instance-a") for _ in range(8)]
    answers = ray.get(tries, timeout=60)
    assert {epoch for _, epoch in answers} == {0}
    assert epoch_at_coordinator(coordinator, "tid-tries") == 0

    first = producer(cluster, log_dir, "tid-tries")  # another instance: the next epoch
    producers.append(first)
    assert first.epoch == 1
    commit(first, b"first-1")
    # a try of instance-a run late, after its successor took over: refused, fencing nobody
    with pytest.raises(ProducerFencedError, match="instance-a was given epoch 0"):
        rpc.get(coordinator.init_producer.remote("tid-tries", "instance-a"), 30)
    commit(first, b"first-2")
    assert epoch_at_coordinator(coordinator, "tid-tries") == 1

    second = producer(cluster, log_dir, "tid-tries")  # a real successor fences the first
    producers.append(second)
    assert second.epoch == 2
    with pytest.raises(ProducerFencedError, match="epoch 1 is fenced by epoch 2"):
        commit(first, b"first-3")
    commit(second, b"second-1")
    consumer = cluster.pull_consumer("inst-reader")
    read = sorted(m.body for msgs in drain(consumer, TOPIC).values() for m in msgs)
    assert read == [b"first-1", b"first-2", b"second-1"]


def test_a_try_cut_short_after_its_epoch_was_logged_is_completed_by_the_next(
    cluster: actors.Cluster, log_dir: str, producers: list[TransactionalProducer]
) -> None:
    old = producer(cluster, log_dir, "tid-cut")
    producers.append(old)
    left_open = old.begin()
    left_open.send(Message(TOPIC, b"old-open"))
    left_open.flush()  # a half message of the old epoch pending at the broker
    broker = cluster.broker("broker-a")
    assert len(ray.get(broker.pending_transactions.remote())) == 1
    before = ray.get(old.coordinator.status.remote())["pid"]
    ray.get(old.coordinator.inject_fault.remote("crash_after_epoch"))

    # its first try exits the coordinator once the epoch is logged, before the answer and
    # the fence; Ray restarts it and the producer's next try is answered that epoch
    new = producer(cluster, log_dir, "tid-cut")
    producers.append(new)
    assert new.epoch == old.epoch + 1
    status = ray.get(new.coordinator.status.remote())
    assert status["pid"] != before  # the coordinator did restart
    assert status["producers"]["tid-cut"][1] == new.epoch
    # the fence the cut-short try never raised was raised by the next one
    assert ray.get(broker.pending_transactions.remote()) == []
    left_open.send(Message(TOPIC, b"old-late"))
    with pytest.raises(ProducerFencedError):
        left_open.flush()
    commit(new, b"new-1")
