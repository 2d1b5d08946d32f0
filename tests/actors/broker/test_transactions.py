"""Transactional messages through a real broker (RocketMQ's semantics): a half message is
never seen by a consumer of its topic; commit makes it visible once, rollback never;
UNKNOW leaves it to the broker's check, which asks a live producer of its group; a
second end changes nothing; a half message survives a broker restart and is resolved
after it."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from raymq_testkit import SMALL_STORE, drain, printed_json, unique_namespace, wait_until

import actors
from actors import LocalTransactionState, TransactionProducer
from actors.coordinator.txn import transaction_coordinator
from actors.protocol import rpc as _rpc
from actors.tools.cli import main
from storage import Message, transaction
from storage.errors import InvalidMessageError
from storage.message import MessageExt
from storage.properties import PROP_PRODUCER_GROUP, PROP_TRAN_MSG

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = actors.start_cluster(
        namespace=unique_namespace("txn"),
        nameservers=1,
        brokers=1,
        store_root=str(tmp_path_factory.mktemp("txn")),
        broker_options={
            "store": SMALL_STORE,
            "heartbeat_interval_s": 1.0,
            "transaction_check_interval_s": 0.3,
            "transaction_timeout_s": 1.0,
            "transaction_check_max": 1000,  # the restart must not outlast the checks
        },
        topics=[
            actors.TopicConfig(t, 2, 2) for t in ("TxA", "TxB", "TxC", "TxD", "TxE", "TxF", "TxG")
        ],
    )
    yield c
    c.shutdown()


class Listener:
    """Executes by the ``arg`` it is given; checks by what the test set for the body."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answers: dict[bytes, LocalTransactionState] = {}
        self.checked: list[Message] = []

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        if isinstance(arg, Exception):
            raise arg
        assert isinstance(arg, LocalTransactionState)
        return arg

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        with self.lock:
            self.checked.append(msg)
            return self.answers.get(msg.body, UNKNOW)


def producer_for(
    cluster: actors.Cluster, group: str, listener: Listener, **options: Any
) -> TransactionProducer:
    return TransactionProducer(
        group,
        listener,
        namespace=cluster.namespace,
        check_heartbeat_s=0.5,
        send_timeout_s=5.0,
        **options,
    )


_readers: dict[str, actors.PullConsumer] = {}


def visible(cluster: actors.Cluster, topic: str) -> list[MessageExt]:
    """Every message a consumer of ``topic`` can read, from offset 0."""
    consumer = _readers.get(cluster.namespace)
    if consumer is None:
        consumer = _readers[cluster.namespace] = cluster.pull_consumer("reader")
    return [m for msgs in drain(consumer, topic).values() for m in msgs]


def pending(cluster: actors.Cluster) -> list[dict[str, Any]]:
    return list(ray.get(cluster.broker("broker-a").pending_transactions.remote()))


def test_commit_is_visible_once_and_rollback_never(cluster: actors.Cluster) -> None:
    listener = Listener()
    producer = producer_for(cluster, "pg-a", listener)
    try:
        committed = producer.send_message_in_transaction(
            Message("TxA", b"commit-me", keys="k1"), COMMIT
        )
        rolled = producer.send_message_in_transaction(Message("TxA", b"drop-me"), ROLLBACK)
        assert committed.local_state is COMMIT and rolled.local_state is ROLLBACK
        # the ends went oneway (RocketMQ's endTransactionOneway): applied a moment later
        wait_until(
            lambda: not [p for p in pending(cluster) if p["group"] == "pg-a"],
            interval_s=0.05,
            what="both ends applied",
        )
        got = visible(cluster, "TxA")
        assert [m.body for m in got] == [b"commit-me"]
        m = got[0]
        assert m.msg_id == committed.msg_id
        assert transaction.transaction_type(m.sys_flag) == transaction.TRANSACTION_COMMIT_TYPE
        assert PROP_TRAN_MSG not in m.properties and "REAL_TOPIC" not in m.properties
        assert list(m.keys) == ["k1"]
        assert listener.checked == [], "both were ended before any check"
    finally:
        producer.close()


def test_unknow_is_checked_back_and_committed_never_seen_before(cluster: actors.Cluster) -> None:
    listener = Listener()
    producer = producer_for(cluster, "pg-b", listener)
    try:
        sent = producer.send_message_in_transaction(Message("TxB", b"later"), UNKNOW)
        assert sent.local_state is UNKNOW
        wait_until(lambda: listener.checked, what="a check of the half message")
        assert visible(cluster, "TxB") == [], "a half message is never visible"
        [half] = [p for p in pending(cluster) if p["group"] == "pg-b"]
        assert half["msg_id"] == sent.msg_id and half["topic"] == "TxB"
        assert listener.checked[0].topic == "TxB", "the check shows the real topic"
        with listener.lock:
            listener.answers[b"later"] = COMMIT
        got = wait_until(lambda: visible(cluster, "TxB"), interval_s=0.1, what="the checked commit")
        assert [m.msg_id for m in got] == [sent.msg_id]
        wait_until(
            lambda: not [p for p in pending(cluster) if p["group"] == "pg-b"], interval_s=0.1
        )
        assert [m.msg_id for m in visible(cluster, "TxB")] == [sent.msg_id], "committed once"
    finally:
        producer.close()


def test_an_executor_that_raises_is_unknow_and_the_check_rolls_back(
    cluster: actors.Cluster,
) -> None:
    listener = Listener()
    listener.answers[b"fails"] = ROLLBACK
    producer = producer_for(cluster, "pg-c", listener)
    try:
        sent = producer.send_message_in_transaction(Message("TxC", b"fails"), RuntimeError("db"))
        assert sent.local_state is UNKNOW
        wait_until(
            lambda: not [p for p in pending(cluster) if p["group"] == "pg-c"],
            interval_s=0.1,
            what="the check's rollback",
        )
        assert listener.checked and visible(cluster, "TxC") == []
    finally:
        producer.close()


def test_a_second_end_changes_nothing(cluster: actors.Cluster) -> None:
    listener = Listener()
    producer = producer_for(cluster, "pg-d", listener, end_oneway=False)
    broker = cluster.broker("broker-a")
    try:
        sent = producer.send_message_in_transaction(Message("TxD", b"once"), COMMIT)
        # end_oneway=False: the end was applied before the call returned
        assert [m.body for m in visible(cluster, "TxD")] == [b"once"]
        half_offset = int(sent.send_result.offset_msg_id[16:], 16)
        for commit in (True, False, True):
            again = broker.end_transaction.remote("pg-d", half_offset, sent.msg_id, commit)
            assert ray.get(again) is False
        assert [m.body for m in visible(cluster, "TxD")] == [b"once"]
        with pytest.raises(Exception, match="not transaction"):
            ray.get(broker.end_transaction.remote("other-group", half_offset, sent.msg_id, True))
        # the producer's ends go over the broker's socket, where bad ones are refused too
        stub = producer.ns.broker(producer._selector.route("TxD")[0], "broker-a")
        before = ray.get(broker.status.remote())["data_requests"]
        assert (
            _rpc.get(stub.end_transaction.remote("pg-d", half_offset, sent.msg_id, True), 10)
            is False
        )
        assert ray.get(broker.status.remote())["data_requests"] == before + 1
        for bad in (
            ("pg d", half_offset, sent.msg_id, True),
            ("pg-d", -1, sent.msg_id, True),
            ("pg-d", half_offset, 7, True),
            ("pg-d", half_offset, sent.msg_id, "yes"),
        ):
            with pytest.raises(InvalidMessageError):
                _rpc.get(stub.end_transaction.remote(*bad), 10)
        assert [m.body for m in visible(cluster, "TxD")] == [b"once"]
    finally:
        producer.close()


@pytest.fixture(scope="module")
def unchecked(
    ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[actors.Cluster]:
    """A SYNC_FLUSH broker whose check rounds run only when a test calls one, shared by
    the tests that leave no half message pending: a cluster costs ~5 s to start."""
    c = actors.start_cluster(
        namespace=unique_namespace("txn-unchecked"),
        nameservers=1,
        brokers=1,
        store_root=str(tmp_path_factory.mktemp("txn-unchecked")),
        broker_options={
            "store": {**SMALL_STORE, "flush_disk_type": "SYNC_FLUSH"},
            "heartbeat_interval_s": 2.0,
            "transaction_check_interval_s": 3600.0,  # rounds run when the test says
            "transaction_timeout_s": 0.5,
        },
        topics=[actors.TopicConfig("TxRace", 2, 2), actors.TopicConfig("TxGhost", 2, 2)],
    )
    yield c
    c.shutdown(timeout_s=10.0)


def test_ends_racing_for_the_same_half_messages_end_each_one_once(
    unchecked: actors.Cluster,
) -> None:
    """Ends racing for the same half messages, under SYNC_FLUSH (appends wait for their
    fsync in a thread, so the calls interleave): a producer's answers sent twice,
    overlapping, and a coordinator's decision applied four times at once. Each half
    message is ended once: every message is visible once."""
    cluster = unchecked
    group, n = "pg-race", 40
    broker = cluster.broker("broker-a")
    producer = cluster.producer("p-race")
    single = {PROP_TRAN_MSG: "true", PROP_PRODUCER_GROUP: group}
    single[transaction.PROP_CHECK_IMMUNITY] = "600"  # never checked in this test
    producer.send_batch([Message("TxRace", b"one-%d" % i, properties=single) for i in range(n)])
    multi = {**single, transaction.PROP_GLOBAL_TXN: "race-txn"}
    producer.send_batch([Message("TxRace", b"many-%d" % i, properties=multi) for i in range(n)])
    rows = sorted(pending(cluster), key=lambda p: p["queue_offset"])
    assert len(rows) == 2 * n
    ends = [(p["commitlog_offset"], p["msg_id"], True) for p in rows[:n]]

    answers = [  # all sent at once: windows of 10 every 5, each half message in two
        broker.end_transactions.remote(group, ends[max(0, k - 5) : k + 5]) for k in range(0, n, 5)
    ]
    answers += [broker.end_transaction_batch.remote("race-txn", True) for _ in range(4)]
    counts = ray.get(answers)
    assert sum(counts[: n // 5]) == n and sum(counts[n // 5 :]) == n
    assert not pending(cluster)
    bodies = Counter(m.body for m in visible(cluster, "TxRace"))
    assert bodies == Counter(
        [*(b"one-%d" % i for i in range(n)), *(b"many-%d" % i for i in range(n))]
    )
    producer.close()


def test_a_check_round_aborts_a_backlog_of_transactions_with_one_scan(
    unchecked: actors.Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Old half messages of multi-message transactions the coordinator aborts (here: of a
    producer it never knew) are rolled back by one check round that reads the pending
    half messages once, not once more for every transaction it aborts (which made a
    backlog's rounds quadratic and starved the broker under load)."""
    cluster = unchecked
    # its log outlives the test, as the coordinator does (shut down with the cluster)
    transaction_coordinator(cluster.namespace, log_dir=str(tmp_path_factory.mktemp("txn-log")))
    broker = cluster.broker("broker-a")
    producer = cluster.producer("p-ghost")
    n = 30
    props = {PROP_TRAN_MSG: "true", PROP_PRODUCER_GROUP: "pg-ghost"}
    props[transaction.PROP_TXN_PRODUCER], props[transaction.PROP_TXN_EPOCH] = "ghost", "0"
    producer.send_batch(
        [
            Message(
                "TxGhost",
                b"%d-%d" % (t, i),
                properties={**props, transaction.PROP_GLOBAL_TXN: f"g-{t}"},
            )
            for t in range(n)
            for i in range(2)
        ]
    )
    assert len(pending(cluster)) == 2 * n
    wait_until(lambda: min(p["age_s"] for p in pending(cluster)) > 0.6, what="due for a check")
    before = ray.get(broker.status.remote())
    assert ray.get(broker.check_transactions.remote()) == 2 * n
    after = ray.get(broker.status.remote())
    assert after["txn_resolved"] - before["txn_resolved"] == n
    assert after["txn_rolled_back"] - before["txn_rolled_back"] == 2 * n
    assert after["txn_scans"] - before["txn_scans"] == 1
    assert not pending(cluster) and not visible(cluster, "TxGhost")
    producer.close()


def test_a_half_message_survives_a_broker_restart_and_is_resolved(
    cluster: actors.Cluster,
) -> None:
    listener = Listener()
    producer = producer_for(cluster, "pg-e", listener)
    try:
        sent = producer.send_message_in_transaction(Message("TxE", b"survivor"), UNKNOW)
        wait_until(lambda: listener.checked, what="a check before the restart")
        broker = cluster.broker("broker-a")
        before = ray.get(broker.ping.remote())
        ray.kill(broker, no_restart=False)  # Ray restarts it; the store recovers
        _wait_for_restart(cluster, broker, before, "TxE")
        assert visible(cluster, "TxE") == []
        with listener.lock:
            listener.answers[b"survivor"] = COMMIT
        got = wait_until(
            lambda: visible(cluster, "TxE"),
            timeout_s=30,
            interval_s=0.1,
            what="the commit after the restart",
        )
        assert [m.msg_id for m in got] == [sent.msg_id]
    finally:
        producer.close()


def test_a_backlog_of_half_messages_is_checked_and_ended_in_batches(
    cluster: actors.Cluster,
) -> None:
    """Ends of many single-message transactions are one call and one append
    (``end_transactions``, what a producer answers a check round with); a bad end in it
    refuses all of it. A backlog of 2,000 half messages left without an end is checked
    in batches and the answers come back batched: every one is committed once, and the
    op queue grows by a handful of op messages, not by two per half message (which is
    what made a backlog of 10,000 take 87 check intervals; ``benchmarks/txn_bench.py``
    measures it)."""
    group, n = "pg-bulk", 2000
    listener = Listener()
    listener.answers.update({b"bulk-%d" % i: COMMIT for i in range(n)})
    producer = producer_for(cluster, group, listener)
    broker = cluster.broker("broker-a")
    try:
        held = {PROP_TRAN_MSG: "true", PROP_PRODUCER_GROUP: group}
        held[transaction.PROP_CHECK_IMMUNITY] = "600"  # never checked in this test
        producer.send_batch([Message("TxG", b"hold-%d" % i, properties=held) for i in range(3)])
        rows = sorted(
            (p for p in pending(cluster) if p["group"] == group), key=lambda p: p["queue_offset"]
        )
        (o0, id0), (o1, id1), (o2, id2) = [(p["commitlog_offset"], p["msg_id"]) for p in rows]

        def end(g: str, ends: list[Any]) -> int:
            return int(ray.get(broker.end_transactions.remote(g, ends)))

        # the producer's answers go over the broker's socket (END_TRANSACTIONS), where
        # bad ones are refused alike
        stub = producer.ns.broker(producer._selector.route("TxG")[0], "broker-a")
        wait_until(lambda: stub._dp.connection(stub.actor_name, stub.handle), what="the socket")
        requests = ray.get(broker.status.remote())["data_requests"]
        for g, bad in (
            (group, [(o0, id0, False), (o1, "nope", True)]),
            (group, [(o0, id0)]),
            (group, "not rows"),
        ):
            with pytest.raises(InvalidMessageError):
                _rpc.get(stub.end_transactions.remote(g, bad), 10)
        assert ray.get(broker.status.remote())["data_requests"] >= requests + 3
        for g, bad in (
            (group, [(o0, id0, False), (o1, "nope", True)]),  # one bad end refuses them all
            ("other-group", [(o0, id0, False)]),
            (group, [(o0, id0, "yes")]),
            (group, [(o0, id0)]),
            (group, [(o1 + 1, id1, True)]),  # no record starts there
        ):
            with pytest.raises(InvalidMessageError):
                try:
                    end(g, bad)
                except ray.exceptions.RayTaskError as exc:
                    raise exc.cause from None
        assert len([p for p in pending(cluster) if p["group"] == group]) == 3
        # a repeated end counts once (the first: a rollback); a second call changes nothing
        assert end(group, [(o0, id0, False), (o1, id1, True), (o0, id0, True)]) == 2
        assert end(group, [(o0, id0, True), (o1, id1, False)]) == 0
        assert end(group, [(o2, id2, True)]) == 1
        assert sorted(m.body for m in visible(cluster, "TxG")) == [b"hold-1", b"hold-2"]
        assert not [p for p in pending(cluster) if p["group"] == group]

        ops_before = ray.get(broker.min_max_offset.remote(transaction.OP_HALF_TOPIC, 0))[1]
        props = {PROP_TRAN_MSG: "true", PROP_PRODUCER_GROUP: group}  # left UNKNOW: no end
        for start in range(0, n, 500):
            producer.send_batch(
                [
                    Message("TxG", b"bulk-%d" % i, properties=props)
                    for i in range(start, start + 500)
                ]
            )
        expected = sorted([b"hold-1", b"hold-2", *(b"bulk-%d" % i for i in range(n))])
        wait_until(
            lambda: len(visible(cluster, "TxG")) >= len(expected),
            timeout_s=60,
            interval_s=0.2,
            what="the backlog committed by its checks",
        )
        assert sorted(m.body for m in visible(cluster, "TxG")) == expected
        assert not [p for p in pending(cluster) if p["group"] == group]
        with listener.lock:
            checked = Counter(m.body for m in listener.checked)
        assert set(checked) == {b"bulk-%d" % i for i in range(n)}
        ops = ray.get(broker.min_max_offset.remote(transaction.OP_HALF_TOPIC, 0))[1] - ops_before
        assert ops < n // 20, f"{ops} op messages for {n} half messages: checks not batched"
        # the broker keeps ended half messages one by one only above the first one still
        # pending: a long-running broker's memory does not grow with every one it ends
        half_end = ray.get(broker.min_max_offset.remote(transaction.HALF_TOPIC, 0))[1]
        first_pending = min((p["queue_offset"] for p in pending(cluster)), default=half_end)
        wait_until(
            lambda: ray.get(broker.status.remote())["txn_done_below"] == first_pending,
            what="the ended half messages below the first pending one forgotten",
        )
        tracked = ray.get(broker.status.remote())["txn_done_tracked"]
        assert tracked <= half_end - first_pending < n
    finally:
        producer.close()


def _wait_for_restart(cluster: actors.Cluster, broker: Any, before: str, topic: str) -> None:
    """Wait until Ray has restarted ``broker`` and the broker is back in ``topic``'s route:
    the NameServer drops a dead broker's routes, and the new incarnation registers again on
    its own loop, after it already answers pings."""
    wait_until(
        lambda: _incarnation(broker) not in (None, before),
        timeout_s=60,
        interval_s=0.2,
        what="the restart",
    )
    nameserver = cluster.nameserver(0)
    wait_until(
        lambda: (
            (route := ray.get(nameserver.get_route.remote(topic))) is not None and route.queue_datas
        ),
        timeout_s=30,
        interval_s=0.1,
        what=f"the restarted broker back in {topic}'s route",
    )


def _incarnation(broker: Any) -> str | None:
    try:
        return str(ray.get(broker.ping.remote(), timeout=5))
    except Exception:  # noqa: BLE001 - restarting
        return None


def test_without_an_answer_a_half_message_is_discarded_after_the_max_checks(
    ray_cluster: Any, tmp_path: Any
) -> None:
    c = actors.start_cluster(
        namespace=unique_namespace("txn-max"),
        nameservers=1,
        brokers=1,
        store_root=str(tmp_path),
        broker_options={
            "store": SMALL_STORE,
            "transaction_check_interval_s": 0.2,
            "transaction_timeout_s": 0.5,
            "transaction_check_max": 3,
        },
        topics=[actors.TopicConfig("TxMax", 1, 1)],
    )
    try:
        listener = Listener()  # answers UNKNOW to every check
        producer = producer_for(c, "pg-max", listener)
        sent = producer.send_message_in_transaction(Message("TxMax", b"orphan"), UNKNOW)
        wait_until(lambda: listener.checked, what="a first check")
        producer.close()  # no live producer from now on: the checks go on, unanswered
        wait_until(lambda: not pending(c), timeout_s=30, interval_s=0.1, what="the discard")
        broker = c.broker("broker-a")
        status = ray.get(broker.status.remote())
        assert status["txn_discarded"] == 1
        assert visible(c, "TxMax") == []
        [gone] = ray.get(broker.query_by_key.remote(transaction.CHECK_MAX_TOPIC, sent.msg_id))
        assert gone.body == b"orphan"
        assert int(gone.properties[transaction.PROP_CHECK_TIMES]) == 3
    finally:
        c.shutdown()


def test_check_immunity_delays_the_check_and_txn_list_shows_what_waits(
    cluster: actors.Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    listener = Listener()
    producer = producer_for(cluster, "pg-i", listener)
    try:
        immune = Message("TxF", b"immune", properties={transaction.PROP_CHECK_IMMUNITY: "600"})
        a = producer.send_message_in_transaction(immune, UNKNOW)
        b = producer.send_message_in_transaction(Message("TxF", b"plain"), UNKNOW)

        def checks() -> dict[str, int]:
            return {p["msg_id"]: p["check_times"] for p in pending(cluster) if p["group"] == "pg-i"}

        # the plain one is checked at each round past the broker's timeout; the one with
        # CHECK_IMMUNITY_TIME_IN_SECONDS=600 is not checked at all meanwhile
        wait_until(lambda: checks().get(b.msg_id, 0) >= 2, what="two checks of the plain one")
        assert checks()[a.msg_id] == 0
        assert [m.body for m in listener.checked].count(b"immune") == 0
        assert (
            main(["txn", "list", "--group", "pg-i", "--namespace", cluster.namespace, "--json"])
            == 0
        )
        rows = printed_json(capsys.readouterr().out)
        assert {r["msg_id"] for r in rows} == {a.msg_id, b.msg_id}
        assert {r["broker"] for r in rows} == {"broker-a"} and {r["topic"] for r in rows} == {"TxF"}
        assert [r["age_s"] for r in rows] == sorted((r["age_s"] for r in rows), reverse=True)
        with listener.lock:
            listener.answers[b"plain"] = ROLLBACK
        wait_until(lambda: b.msg_id not in checks(), interval_s=0.1, what="the rollback")
        assert main(["txn", "list", "--namespace", cluster.namespace]) == 0
        assert "pending:" in capsys.readouterr().out
    finally:
        producer.close()


@pytest.mark.default_sizes
@pytest.mark.parametrize("make_cluster", ["default"], indirect=True)
def test_half_messages_are_checked_back_and_survive_a_restart_with_default_file_sizes(
    make_cluster: Any,
) -> None:
    """The check of half messages and the recovery of a broker's transaction state, with
    the 1 GiB CommitLog files users run: a scan that grew with the file's size (a slice
    to its end per record) would not end within the waits below."""
    cluster = make_cluster(
        nameservers=1,
        brokers=1,
        broker_options={
            "heartbeat_interval_s": 1.0,
            "transaction_check_interval_s": 0.3,
            "transaction_timeout_s": 1.0,
            "transaction_check_max": 1000,
        },
        topics=[actors.TopicConfig("TxDefault", 2, 2)],
    )
    listener = Listener()
    producer = producer_for(cluster, "pg-default", listener)
    bodies = [b"half-%03d" % i for i in range(50)]
    try:
        sent = [
            producer.send_message_in_transaction(Message("TxDefault", b), UNKNOW) for b in bodies
        ]
        wait_until(lambda: len(listener.checked) >= 50, what="a check of every half message")
        broker = cluster.broker("broker-a")
        before = ray.get(broker.ping.remote())
        ray.kill(broker, no_restart=False)  # Ray restarts it; the store recovers
        _wait_for_restart(cluster, broker, before, "TxDefault")
        with listener.lock:
            listener.answers.update({b: COMMIT for b in bodies})
        reader = cluster.pull_consumer("reader-default")
        got = wait_until(
            lambda: (
                msgs
                if len(msgs := [m for ms in drain(reader, "TxDefault").values() for m in ms]) >= 50
                else None
            ),
            what="every checked commit",
        )
        assert sorted(m.msg_id for m in got) == sorted(s.msg_id for s in sent), "once each"
        reader.close()
    finally:
        producer.close()
