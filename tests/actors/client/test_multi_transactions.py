"""Multi-message transactions with consumer offsets through a real cluster (issue #24,
"beyond RocketMQ"): messages of three topics on two brokers and a consumer group's
offset become visible and move together on commit, neither on abort, never before;
the coordinator crashing after logging COMMIT and before telling a broker ends
committed after its restart; a second instance with the same transactional id fences
the first (its sends and its commit refused, its open transaction aborted); a
consume-transform-produce loop killed (its process exits) at random points a few
times writes every input exactly once; the half messages of a producer that vanished
without ending its transaction are aborted through the brokers' check service asking
the coordinator; a commit while a broker is down is applied after the broker's restart."""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from raymq_testkit import SMALL_STORE, drain, unique_namespace, wait_until

import actors
from actors import TransactionalProducer, TransactionState
from actors.protocol import frames, rpc
from actors.protocol.connection import BrokerConnection
from actors.protocol.data_path import DataPath
from actors.tools.cli import main
from rebalance import MessageQueue
from storage import Message, codec, transaction
from storage.errors import (
    BrokerUnavailableError,
    InvalidMessageError,
    ProducerFencedError,
    RayMQError,
)

GROUP_IN = "mtx-in"  # the consumer group whose offsets the transactions commit
EO_INPUTS = 60
ORPHAN_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = actors.start_cluster(
        namespace=unique_namespace("mtx"),
        nameservers=1,
        brokers=2,
        store_root=str(tmp_path_factory.mktemp("mtx")),
        broker_options={
            "store": SMALL_STORE,
            "heartbeat_interval_s": 1.0,
            "transaction_check_interval_s": 0.3,
            "transaction_timeout_s": 1.0,
        },
    )
    admin = c.admin
    admin.create_topic("MtA", 2, 2, brokers=["broker-a"])
    admin.create_topic("MtB", 2, 2, brokers=["broker-b"])
    admin.create_topic("MtC", 2, 2)  # on both
    admin.create_topic("MtIn", 1, 1, brokers=["broker-b"])
    admin.create_topic("EoIn", 1, 1, brokers=["broker-b"])
    admin.create_topic("EoOut", 2, 2)
    feed = c.producer("mtx-feed")
    feed.send_batch([Message("MtIn", b"in%d" % i) for i in range(20)])
    feed.send_batch([Message("EoIn", b"%d" % i) for i in range(EO_INPUTS)])
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("txnlog"))


def producer(
    cluster: actors.Cluster, log_dir: str, tid: str, **options: Any
) -> TransactionalProducer:
    return cluster.transactional_producer(
        "mtx-producer",
        tid,
        coordinator_log_dir=log_dir,
        txn_timeout_s=ORPHAN_TIMEOUT_S,  # counts where the coordinator is created: the first
        flush_messages=16,
        send_timeout_s=10.0,
        **options,
    )


def bodies(cluster: actors.Cluster, topic: str) -> list[bytes]:
    consumer = cluster.pull_consumer("mtx-reader")
    return sorted(m.body for msgs in drain(consumer, topic).values() for m in msgs)


def nameservers(cluster: actors.Cluster) -> list[Any]:
    return [ray.get_actor(n, namespace=cluster.namespace) for n in cluster.nameserver_names]


def input_queue() -> MessageQueue:
    return MessageQueue("MtIn", "broker-b", 0)


def committed_offset(cluster: actors.Cluster) -> int:
    return int(cluster.pull_consumer(GROUP_IN).fetch_offset(input_queue()))


def pending_of(cluster: actors.Cluster, broker: str) -> int:
    return len(ray.get(cluster.broker(broker).pending_transactions.remote()))


def batch(tag: str, n: int) -> list[Message]:
    topics = ("MtA", "MtB", "MtC")
    return [Message(topics[i % 3], f"{tag}-{i}".encode()) for i in range(n)]


def test_commit_shows_three_topics_and_the_offset_together_abort_neither(
    cluster: actors.Cluster, log_dir: str
) -> None:
    p = producer(cluster, log_dir, "tid-commit")
    try:
        txn = p.begin()
        txn.send(batch("c", 30))
        txn.flush()
        txn.send_offsets(GROUP_IN, {input_queue(): 7})
        # stored as half messages on both brokers, and nobody sees them yet
        assert pending_of(cluster, "broker-a") > 0 and pending_of(cluster, "broker-b") > 0
        assert [bodies(cluster, t) for t in ("MtA", "MtB", "MtC")] == [[], [], []]
        assert committed_offset(cluster) <= 0
        txn.commit()
        assert txn.state is TransactionState.COMMITTED
        want = sorted(m.body for m in batch("c", 30))
        got = bodies(cluster, "MtA") + bodies(cluster, "MtB") + bodies(cluster, "MtC")
        assert sorted(got) == want  # every one, once
        assert committed_offset(cluster) == 7
        a = cluster.pull_consumer("mtx-reader2")
        one = next(m for msgs in drain(a, "MtC").values() for m in msgs)
        assert transaction.PROP_GLOBAL_TXN not in one.properties
        assert transaction.transaction_type(one.sys_flag) == transaction.TRANSACTION_COMMIT_TYPE
        assert pending_of(cluster, "broker-a") == pending_of(cluster, "broker-b") == 0

        # an exception inside the block aborts: nothing shown, the offset stays
        with pytest.raises(RuntimeError, match="local failure"), p.begin() as t2:
            t2.send(batch("x", 12))
            t2.flush()
            t2.send_offsets(GROUP_IN, {input_queue(): 15})
            raise RuntimeError("local failure")
        assert t2.state is TransactionState.ABORTED
        got = bodies(cluster, "MtA") + bodies(cluster, "MtB") + bodies(cluster, "MtC")
        assert sorted(got) == want
        assert committed_offset(cluster) == 7
        assert pending_of(cluster, "broker-a") == pending_of(cluster, "broker-b") == 0

        # commit(wait=False) answers once decided; the brokers show it a moment later
        t4 = p.begin()
        t4.send(batch("w", 6))
        t4.commit(wait=False)
        assert t4.state is TransactionState.COMMITTED
        wait_until(
            lambda: (
                sum(b.startswith(b"w-") for t in ("MtA", "MtB", "MtC") for b in bodies(cluster, t))
                == 6
            ),
            what="a commit(wait=False) applied",
        )

        # bad input is refused and changes nothing
        t3 = p.begin()
        with pytest.raises(InvalidMessageError):
            t3.send_offsets(GROUP_IN, {input_queue(): -1})
        with pytest.raises(InvalidMessageError):
            t3.send([Message("MtA", b"late", delay_level=2)])
        with pytest.raises(InvalidMessageError):
            t3.send([Message("MtA", b"fine"), Message("bad topic!", b"x")])
        t3.commit()  # empty: nothing to do
        assert committed_offset(cluster) == 7
        assert b"fine" not in bodies(cluster, "MtA")
    finally:
        p.close()


def test_coordinator_crash_after_logging_commit_recovers_to_committed(
    cluster: actors.Cluster, log_dir: str
) -> None:
    p = producer(cluster, log_dir, "tid-crash")
    try:
        before = ray.get(p.coordinator.status.remote())
        txn = p.begin()
        txn.send(batch("r", 9))
        txn.send_offsets(GROUP_IN, {input_queue(): 11})
        txn.flush()
        ray.get(p.coordinator.inject_fault.remote("crash_after_decision"))
        txn.commit()  # the coordinator dies inside; the call is answered by its successor
        after = ray.get(p.coordinator.status.remote())
        assert after["pid"] != before["pid"] and after["recovered"] >= 1
        assert ray.get(p.coordinator.transaction.remote(txn.txn_id))["state"] == "commit"
        want = sorted(m.body for m in batch("r", 9))
        wait_until(
            lambda: (
                sorted(
                    b for t in ("MtA", "MtB", "MtC") for b in bodies(cluster, t) if b[:2] == b"r-"
                )
                == want
            ),
            what="the recovered commit applied",
        )
        assert committed_offset(cluster) == 11
    finally:
        p.close()


def test_a_zombie_producer_is_fenced_and_its_open_transaction_aborted(
    cluster: actors.Cluster, log_dir: str
) -> None:
    old = producer(cluster, log_dir, "tid-zombie")
    new = None
    try:
        t1 = old.begin()
        t1.send([Message("MtA", b"z-old-%d" % i) for i in range(3)])
        t1.flush()
        new = producer(cluster, log_dir, "tid-zombie")
        assert new.epoch == old.epoch + 1
        assert pending_of(cluster, "broker-a") == 0  # rolled back by the fence
        assert ray.get(new.coordinator.resolve.remote(t1.txn_id, "tid-zombie", old.epoch)) == (
            "abort"
        )
        # the old instance: its sends refused by the broker, its commit by the coordinator
        t1.send([Message("MtA", b"z-old-late")])
        with pytest.raises(ProducerFencedError):
            t1.flush()
        t1.abort()
        t2 = old.begin()
        t2.send_offsets(GROUP_IN, {input_queue(): 19})
        with pytest.raises(ProducerFencedError):
            t2.commit()
        assert committed_offset(cluster) < 19
        # nor does the one broker holding a whole transaction commit it alone
        t4 = old.begin()
        t4.send(Message("MtA", b"z-old-one-phase"))
        with pytest.raises(ProducerFencedError):
            t4.commit()
        assert t4.state is TransactionState.ABORTED and old.one_phase_commits == 0
        # the new instance goes on
        with new.begin() as t3:
            t3.send(Message("MtA", b"z-new"))
        zs = [b for b in bodies(cluster, "MtA") if b.startswith(b"z-")]
        assert zs == [b"z-new"]
    finally:
        old.close()
        if new is not None:
            new.close()


def transform(
    namespace: str, nameservers: list[str], log_dir: str, crash_at: int | None, seed: int
) -> int:
    """One instance of a consume-transform-produce loop (run as a Ray task: its own
    process): reads ``EoIn`` from the group's committed offset, writes ``out-<body>`` to
    ``EoOut`` and the new offset in one transaction per few messages. ``crash_at``: the
    process exits (no commit, no abort, no close) at that step."""
    import os

    from actors import PullConsumer, PullStatus, TransactionalProducer

    rng = random.Random(seed)
    producer = TransactionalProducer(
        "eo-producer",
        transactional_id="eo-1",
        namespace=namespace,
        nameservers=nameservers,
        coordinator_log_dir=log_dir,
        flush_messages=3,
    )
    consumer = PullConsumer("eo-group", namespace=namespace, nameservers=nameservers)
    mq = MessageQueue("EoIn", "broker-b", 0)
    steps = 0

    def step() -> None:
        nonlocal steps
        steps += 1
        if crash_at is not None and steps >= crash_at:
            os._exit(1)

    offset = max(0, consumer.fetch_offset(mq))
    done = 0
    while True:
        got = consumer.pull(mq, offset, rng.randint(1, 6))
        if got.status is not PullStatus.FOUND:
            break
        txn = producer.begin()
        txn.send([Message("EoOut", b"out-" + m.body) for m in got.messages])
        step()
        txn.flush()
        step()
        txn.send_offsets("eo-group", {mq: got.next_offset})
        txn.commit()
        step()
        offset = got.next_offset
        done += len(got.messages)
    producer.close()
    consumer.close()
    return done


def test_consume_transform_produce_killed_at_random_points_is_exactly_once(
    cluster: actors.Cluster, log_dir: str
) -> None:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers can't import tests
    task = ray.remote(max_retries=0, num_cpus=0)(transform)
    rng = random.Random(24)
    crashes = 0
    for run in range(4):
        ref = task.remote(
            cluster.namespace, cluster.nameserver_names, log_dir, rng.randint(1, 9), run
        )
        with pytest.raises(ray.exceptions.WorkerCrashedError):  # its process exited
            ray.get(ref, timeout=60)
        crashes += 1
    last = ray.get(
        task.remote(cluster.namespace, cluster.nameserver_names, log_dir, None, 99), timeout=60
    )
    assert 0 < last < EO_INPUTS  # the killed ones had committed some, and not all
    out = bodies(cluster, "EoOut")
    assert crashes == 4
    assert sorted(out) == sorted(b"out-%d" % i for i in range(EO_INPUTS))  # each once
    consumer = cluster.pull_consumer("eo-group")
    assert consumer.fetch_offset(MessageQueue("EoIn", "broker-b", 0)) == EO_INPUTS


def test_an_orphans_half_messages_are_aborted_by_the_check_asking_the_coordinator(
    cluster: actors.Cluster, log_dir: str
) -> None:
    p = producer(cluster, log_dir, "tid-orphan")
    txn = p.begin()
    txn.send([Message("MtB", b"orphan-%d" % i) for i in range(5)])
    txn.flush()  # and then the producer is gone: no commit, no abort, no new instance
    assert pending_of(cluster, "broker-b") == 5
    young = int(time.time() * 1000)
    assert ray.get(p.coordinator.resolve.remote(txn.txn_id, "tid-orphan", p.epoch, young)) == (
        "open"  # undecided and young: the check asks again later
    )
    wait_until(
        lambda: pending_of(cluster, "broker-b") == 0,
        timeout_s=ORPHAN_TIMEOUT_S + 10,
        what="the check service to resolve the orphan's half messages",
    )
    assert ray.get(p.coordinator.transaction.remote(txn.txn_id))["state"] == "abort"
    assert not [b for b in bodies(cluster, "MtB") if b.startswith(b"orphan")]
    with pytest.raises(actors.TransactionStateError):  # too late now
        txn.commit()
    p.close()


def test_a_commit_naming_halves_by_id_leaves_a_failed_attempts_halves_out(
    cluster: actors.Cluster, log_dir: str
) -> None:
    """Two attempts send into one shared transaction (a Spark task and its retry). The
    one counted hands its halves back partly by message id, as a retried send that no
    longer learns its offsets does: the commit takes exactly those, not every half of
    the transaction, and the failed attempt's are rolled back by the check."""
    p = producer(cluster, log_dir, "tid-byid")
    sender = cluster.producer("mtx-attempts")
    try:
        txn = p.begin()
        marks = txn.context().properties()
        sender.send_batch([Message("MtB", b"failed-%d" % i, properties=marks) for i in range(3)])
        counted = sender.send_batch(
            [Message("MtB", b"counted-%d" % i, properties=marks) for i in range(3)]
        )
        assert counted.halves_by_broker() == counted.commitlog_offsets_by_broker()  # all known
        [first, *_] = counted.halves_by_broker()["broker-b"]
        assert pending_of(cluster, "broker-b") == 6
        with pytest.raises(InvalidMessageError, match="half offset"):
            txn.add_halves({"broker-b": [first, None]}, 2)  # type: ignore[list-item]
        with pytest.raises(InvalidMessageError, match="half message id"):
            txn.add_halves({"broker-b": [first, ""]}, 2)
        txn.add_halves({"broker-b": [first, counted[1].msg_id, counted[2].msg_id]}, 3)
        txn.commit()
        mine = [b for b in bodies(cluster, "MtB") if b.startswith((b"failed-", b"counted-"))]
        assert mine == [b"counted-%d" % i for i in range(3)]
        wait_until(
            lambda: pending_of(cluster, "broker-b") == 0,
            timeout_s=ORPHAN_TIMEOUT_S + 10,
            what="the failed attempt's halves rolled back",
        )
        assert not [b for b in bodies(cluster, "MtB") if b.startswith(b"failed-")]
    finally:
        sender.close()
        p.close()


def test_the_cli_shows_the_coordinators_producers_and_counters(
    cluster: actors.Cluster, log_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    p = producer(cluster, log_dir, "tid-cli")
    try:
        with p.begin() as txn:  # one broker holds it: committed there alone
            txn.send([Message("MtA", b"cli")])
        with p.begin() as txn:  # two brokers: the coordinator decides
            txn.send([Message("MtA", b"cli-a"), Message("MtB", b"cli-b")])
        assert p.one_phase_commits == 1
        assert main(["txn", "coordinator", "--namespace", cluster.namespace, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        mine = {"transactional_id": "tid-cli", "producer_id": p.producer_id, "epoch": p.epoch}
        assert mine in data["producers"]
        assert data["stats"]["committed"] >= 1 and data["log"].startswith(log_dir)
        assert set(data["one_phase"]) == {"broker-a", "broker-b"}
        assert data["one_phase"]["broker-a"] >= 1
        assert main(["txn", "coordinator", "--namespace", cluster.namespace]) == 0
        out = capsys.readouterr().out
        assert "tid-cli" in out and "committed" in out and "TRANSACTIONAL_ID" in out
        assert "committed by one broker alone (one-phase): broker-a " in out
    finally:
        p.close()


def _incarnation(broker: Any) -> str | None:
    try:
        return str(ray.get(broker.ping.remote(), timeout=5))
    except Exception:  # noqa: BLE001 - restarting
        return None


def test_a_decision_over_a_brokers_socket_is_checked_then_applied_with_its_offsets(
    cluster: actors.Cluster, log_dir: str
) -> None:
    """The coordinator tells a broker its decision over the broker's own socket
    (END_TRANSACTION_BATCH, as ``actors.coordinator.txn`` sends it): a bad one is refused
    and changes nothing (no half message ended, no offset moved), a good one ends the
    transaction's half messages there and commits the offsets with them."""
    p = producer(cluster, log_dir, "tid-socket")
    handle = cluster.broker("broker-b")
    dp = DataPath()
    stub = dp.wrap("broker-b", handle)
    try:
        wait_until(lambda: dp.connection("broker-b", handle) is not None, what="broker-b's socket")
        txn = p.begin()
        txn.send([Message("MtB", b"sock-%d" % i) for i in range(4)])
        txn.flush()
        halves = txn._halves["broker-b"]
        assert halves is not None and len(halves) == 4
        group, mq = "mtx-sock", input_queue()
        good = {group: {(mq.topic, mq.queue_id): 9}}
        before = pending_of(cluster, "broker-b")

        def decide(*args: Any) -> int:
            return int(rpc.get(stub.end_transaction_batch.remote(*args), 10))

        for bad in (
            (txn.txn_id, "yes", halves, good),
            (txn.txn_id, True, [-5], good),
            ("another-txn", True, halves, good),  # not this transaction's half messages
            (txn.txn_id, True, halves, {group: {(mq.topic, mq.queue_id): -1}}),
            (txn.txn_id, True, halves, {group: {(mq.topic, mq.queue_id): 10**9}}),
            (txn.txn_id, True, halves, {"bad group!": {(mq.topic, mq.queue_id): 9}}),
            (txn.txn_id, True, halves, {group: {("NoSuchTopic", 0): 1}}),
        ):
            with pytest.raises(RayMQError):  # answered as raised: InvalidMessageError,
                decide(*bad)  # OffsetOutOfRangeError, TopicNotFoundError
        assert pending_of(cluster, "broker-b") == before
        assert not [b for b in bodies(cluster, "MtB") if b.startswith(b"sock-")]
        assert int(cluster.pull_consumer(group).fetch_offset(mq)) <= 0

        assert decide(txn.txn_id, True, halves, good, p.transactional_id, p.epoch) == 4
        assert decide(txn.txn_id, True, halves, good, p.transactional_id, p.epoch) == 0
        assert [b for b in bodies(cluster, "MtB") if b.startswith(b"sock-")] == [
            b"sock-%d" % i for i in range(4)
        ]
        assert int(cluster.pull_consumer(group).fetch_offset(mq)) == 9
        assert pending_of(cluster, "broker-b") == before - 4
        # applied again (a coordinator restarted before it logged the decision done):
        # the group went on meanwhile, and the old decision does not move it back
        cluster.pull_consumer(group).commit_offsets({mq: 15})
        assert decide(txn.txn_id, True, halves, good, p.transactional_id, p.epoch, True) == 0
        assert int(cluster.pull_consumer(group).fetch_offset(mq)) == 15
        txn.abort()  # the coordinator never decided it: its abort finds nothing left to end
    finally:
        dp.close()
        p.close()


def test_commits_reach_the_coordinator_over_its_own_socket_where_strangers_are_refused(
    cluster: actors.Cluster, log_dir: str
) -> None:
    """A producer's commits go over the coordinator's own socket (TXN_END), not Ray. A
    client without the coordinator's secret is refused at the handshake; a proved one
    sending a bad TXN_END gets the error, nothing is logged, and its connection goes on
    serving; a good one commits."""
    p = producer(cluster, log_dir, "tid-door", one_phase=False)  # the coordinator decides
    try:
        coordinator = p.coordinator

        def door() -> dict[str, Any]:
            return dict(ray.get(coordinator.status.remote())["door"])

        wait_until(
            lambda: p._data_path.connection("txn-coordinator", coordinator) is not None,
            what="the producer's connection to the coordinator",
        )
        before = door()
        for i in range(3):
            with p.begin() as txn:
                txn.send([Message("MtA", b"door-%d" % i)])
        assert door()["requests"] >= before["requests"] + 3
        assert [b for b in bodies(cluster, "MtA") if b.startswith(b"door-")] == [
            b"door-%d" % i for i in range(3)
        ]

        info = ray.get(coordinator.data_path.remote())
        assert info["addr"] == before["addr"]
        stranger = BrokerConnection(info["addr"], b"not-the-secret" * 3, name="stranger")
        with pytest.raises(BrokerUnavailableError):
            stranger.open()
        stranger.close()
        assert door()["refused"] == before["refused"] + 1

        conn = BrokerConnection(info["addr"], info["secret"], name="coordinator")
        conn.open()
        try:

            def decided() -> tuple[int, int]:
                stats = ray.get(coordinator.status.remote())["stats"]
                return stats.get("committed", 0), stats.get("aborted", 0)

            before_bad = decided()
            end = {"c": int(frames.Code.TXN_END), "x": "t-bad", "i": p.transactional_id}
            for bad in (
                {**end, "e": p.epoch, "m": "yes"},  # commit must be a bool
                {**end, "e": "zero", "m": True},  # so must the epoch be an int
                {**end, "e": p.epoch, "m": True, "h": ["broker-a"]},  # halves by broker
                {**end, "i": "nobody", "e": 0, "m": True},  # an unknown transactional id
            ):
                with pytest.raises(InvalidMessageError):
                    conn.request(bad).result(10)
            assert ray.get(coordinator.transaction.remote("t-bad")) is None
            assert decided() == before_bad
            ok = {**end, "x": "t-empty", "e": p.epoch, "m": True, "h": {}, "k": {}, "w": True}
            header, _ = conn.request(ok).result(10)
            assert header["r"] == {"state": "commit", "done": True}
        finally:
            conn.close()
    finally:
        p.close()


def test_a_commit_while_a_broker_is_down_is_applied_after_its_restart(
    cluster: actors.Cluster, log_dir: str
) -> None:
    """Next to last in the module: it restarts broker-b."""
    p = producer(cluster, log_dir, "tid-down")
    try:
        txn = p.begin()
        txn.send([Message("MtA", b"down-a-%d" % i) for i in range(4)])
        txn.send([Message("MtB", b"down-b-%d" % i) for i in range(4)])
        txn.flush()
        txn.send_offsets(GROUP_IN, {input_queue(): 20})
        broker_b = cluster.broker("broker-b")
        before = ray.get(broker_b.ping.remote())
        ray.kill(broker_b, no_restart=False)  # Ray restarts it; its store recovers
        txn.commit()  # decided; broker-a applies it now, broker-b when it is back
        assert txn.state is TransactionState.COMMITTED
        assert sorted(b for b in bodies(cluster, "MtA") if b.startswith(b"down-")) == [
            b"down-a-%d" % i for i in range(4)
        ]
        wait_until(
            lambda: _incarnation(broker_b) not in (None, before),
            timeout_s=60,
            interval_s=0.2,
            what="broker-b's restart",
        )
        wait_until(
            lambda: ray.get(p.coordinator.transaction.remote(txn.txn_id))["done"],
            timeout_s=30,
            interval_s=0.2,
            what="the decision applied on broker-b",
        )

        def routed_again() -> bool:  # its route left the NameServers while it was down
            routes = [ray.get(ns.get_route.remote("MtB")) for ns in nameservers(cluster)]
            return all(
                r is not None and any(q.broker_name == "broker-b" for q in r.queue_datas)
                for r in routes
            )

        wait_until(routed_again, timeout_s=30, interval_s=0.2, what="broker-b's route back")
        assert sorted(b for b in bodies(cluster, "MtB") if b.startswith(b"down-")) == [
            b"down-b-%d" % i for i in range(4)
        ]
        assert committed_offset(cluster) == 20
    finally:
        p.close()


def test_a_broker_killed_midway_through_a_commits_append_shows_each_message_once(
    cluster: actors.Cluster, log_dir: str
) -> None:
    """It kills broker-a (the tests after it run on the restarted one). The broker dies in
    the middle of writing a
    commit (half of the committed copies written, not the op message: recovery keeps
    them). Ray restarts it, the coordinator tells it the decision again, and the broker
    finds the copies written before the crash by their unique keys: each message shows
    once, none twice."""
    p = producer(cluster, log_dir, "tid-midway")
    broker = cluster.broker("broker-a")
    try:
        txn = p.begin()
        txn.send([Message("MtA", b"mid-%d" % i) for i in range(10)])
        txn.flush()
        before = ray.get(broker.ping.remote())
        ray.get(broker.inject_fault.remote("crash_mid_commit"))
        txn.commit(wait=False)  # decided; the broker dies applying it
        wait_until(
            lambda: _incarnation(broker) not in (None, before),
            timeout_s=60,
            interval_s=0.2,
            what="broker-a's restart",
        )
        wait_until(
            lambda: ray.get(p.coordinator.transaction.remote(txn.txn_id))["done"],
            timeout_s=30,
            interval_s=0.2,
            what="the decision applied after the restart",
        )
        assert sorted(b for b in bodies(cluster, "MtA") if b.startswith(b"mid-")) == sorted(
            b"mid-%d" % i for i in range(10)
        )
        assert pending_of(cluster, "broker-a") == 0
    finally:
        p.close()


def coordinator_stats(p: TransactionalProducer) -> dict[str, int]:
    return dict(ray.get(p.coordinator.status.remote())["stats"])


def broker_stats(cluster: actors.Cluster, broker: str) -> dict[str, Any]:
    return dict(ray.get(cluster.broker(broker).status.remote()))


def test_a_transaction_one_broker_holds_is_committed_there_alone(
    cluster: actors.Cluster, log_dir: str
) -> None:
    """No half copy, no coordinator: the broker's one append is the commit. A transaction
    over two brokers, or with offsets, keeps the two phases."""
    p = producer(cluster, log_dir, "tid-one-phase")
    try:
        before, a_before = coordinator_stats(p), broker_stats(cluster, "broker-a")
        txn = p.begin()
        # MtA lives on broker-a only, MtC on both: the plan keeps MtC's messages there too
        txn.send([Message("MtA" if i % 2 else "MtC", b"op-%d" % i) for i in range(10)])
        assert not any(
            b.startswith(b"op-") for b in bodies(cluster, "MtA") + bodies(cluster, "MtC")
        )
        txn.commit()
        assert txn.state is TransactionState.COMMITTED and p.one_phase_commits == 1
        got = [b for b in bodies(cluster, "MtA") + bodies(cluster, "MtC") if b.startswith(b"op-")]
        assert sorted(got) == sorted(b"op-%d" % i for i in range(10))
        a_after = broker_stats(cluster, "broker-a")
        assert a_after["txn_one_phase"] == a_before["txn_one_phase"] + 1
        assert coordinator_stats(p).get("committed", 0) == before.get("committed", 0)
        assert pending_of(cluster, "broker-a") == 0  # no half message was ever written
        # the broker's record of it: the marker, found by the transaction's id
        markers = ray.get(
            cluster.broker("broker-a").query_by_key.remote(transaction.COMMIT_TOPIC, txn.txn_id)
        )
        assert [transaction.marker_fields(m.body) for m in markers] == [
            {"txn": txn.txn_id, "tid": "tid-one-phase", "epoch": p.epoch, "count": 10}
        ]
        # over two brokers: the coordinator decides
        with p.begin() as two:
            two.send([Message("MtA", b"tp-a"), Message("MtB", b"tp-b")])
        assert p.one_phase_commits == 1
        assert coordinator_stats(p)["committed"] == before.get("committed", 0) + 1
        assert b"tp-b" in bodies(cluster, "MtB") and b"tp-a" in bodies(cluster, "MtA")
    finally:
        p.close()


def test_a_one_phase_commit_sent_again_is_answered_not_written_twice(
    cluster: actors.Cluster, log_dir: str
) -> None:
    """What a producer whose answer was lost does: the same commit again, to the same
    broker, over its socket or through Ray. And what the broker refuses: an epoch it
    cannot know, a malformed batch; neither writes anything."""
    p = producer(cluster, log_dir, "tid-one-phase-again")
    try:
        stub = p.ns.broker_by_name("broker-a-0")
        raw = cluster.broker("broker-a")
        blob = codec.encode_batch(
            [Message("MtA", b"again-%d" % i, queue_id=i % 2) for i in range(3)]
        )
        wire = blob.to_bytes()
        wire4 = codec.encode_batch([Message("MtA", b"twice-%d" % i) for i in range(2)]).to_bytes()
        first = rpc.get(stub.commit_one_phase.remote("again-1", p.transactional_id, p.epoch, wire))
        assert first == {"count": 3, "again": False}
        for handle in (stub, raw):
            again = rpc.get(
                handle.commit_one_phase.remote("again-1", p.transactional_id, p.epoch, wire)
            )
            assert again == {"count": 3, "again": True}
        # sent twice at once (a retry racing its first attempt): stored once
        twice = [
            stub.commit_one_phase.remote("again-4", p.transactional_id, p.epoch, wire4)
            for _ in range(2)
        ]
        answers = rpc.get(twice)
        assert sorted(a["again"] for a in answers) == [False, True]
        assert {a["count"] for a in answers} == {2}
        with pytest.raises(BrokerUnavailableError, match="not known here"):
            rpc.get(stub.commit_one_phase.remote("again-2", p.transactional_id, p.epoch + 5, wire))
        with pytest.raises(InvalidMessageError):
            rpc.get(
                stub.commit_one_phase.remote("again-3", p.transactional_id, p.epoch, b"\x00" * 40)
            )
        assert sorted(b for b in bodies(cluster, "MtA") if b.startswith(b"again-")) == [
            b"again-0",
            b"again-1",
            b"again-2",
        ]
        assert sorted(b for b in bodies(cluster, "MtA") if b.startswith(b"twice-")) == [
            b"twice-0",
            b"twice-1",
        ]
    finally:
        p.close()


def test_a_broker_crashing_after_a_one_phase_append_keeps_the_commit_and_its_offsets_once(
    cluster: actors.Cluster, log_dir: str
) -> None:
    """Last in the module: it kills broker-b. A consume-transform-produce step whose
    input (MtIn) and output (MtB) are both on broker-b commits there alone, with its
    offset. The broker dies right after the append, before it saved its offset table or
    answered. The producer sends the same commit again until the restarted broker
    answers: it was committed (read back from the marker), so nothing is written twice,
    and the offset, re-applied from the marker at the restart, has moved."""
    p = producer(cluster, log_dir, "tid-one-phase-crash")
    group = "mtx-one-phase-in"
    mq = input_queue()
    broker = cluster.broker("broker-b")
    try:
        before = _incarnation(broker)
        ray.get(broker.inject_fault.remote("crash_after_one_phase"))
        txn = p.begin()
        txn.send([Message("MtB", b"crash-op-%d" % i) for i in range(5)])
        txn.send_offsets(group, {mq: 7})
        txn.commit()  # the first attempt dies with the broker; a later one is answered
        assert txn.state is TransactionState.COMMITTED and p.one_phase_commits == 1
        assert _incarnation(broker) not in (None, before)
        status = broker_stats(cluster, "broker-b")
        assert status["txn_one_phase_repeated"] == 1 and status["txn_one_phase"] == 0
        got = sorted(b for b in bodies(cluster, "MtB") if b.startswith(b"crash-op-"))
        assert got == sorted(b"crash-op-%d" % i for i in range(5))
        assert int(cluster.pull_consumer(group).fetch_offset(mq)) == 7
    finally:
        p.close()
