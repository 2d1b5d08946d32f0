"""Push consumers against a real 2-broker cluster: clustering, broadcasting, tags, flow
control, the committed offset, leaving the group, and a consumer killed mid-flight.

Each test runs twice, on a cluster of its own each time: with the default delivery (the
subscription stream) and with held pulls (``delivery="pull"``, what Ray's data path
uses)."""

from __future__ import annotations

import sys
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from raymq_testkit import PUSH_FAST, start_push_cluster, wait_until

import actors
from actors import ConsumeStatus, PushConsumer
from rebalance import MessageQueue, assign
from storage import Message
from storage.errors import InvalidConfigError

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actor class below

FAST = {
    **PUSH_FAST,
}


DELIVERY: dict[str, str | None] = {}  # by cluster namespace: how its push() consumers read


@pytest.fixture(scope="module", params=[None, "pull"], ids=["default", "pull"])
def cluster(
    ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[actors.Cluster]:
    c = start_push_cluster("push", str(tmp_path_factory.mktemp("push")))
    DELIVERY[c.namespace] = request.param
    yield c
    c.shutdown()


def push(cluster: actors.Cluster, group: str, topic: str, listener: Any, **options: Any) -> Any:
    options = {**FAST, "delivery": DELIVERY.get(cluster.namespace), **options}
    return PushConsumer(
        group, topic, listener=listener, namespace=cluster.namespace, **options
    ).start()


class Recorder:
    """A listener that records what it saw, call by call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[list[Any]] = []

    def __call__(self, messages: list[Any]) -> ConsumeStatus:
        with self.lock:
            self.calls.append(list(messages))
        return ConsumeStatus.SUCCESS

    @property
    def messages(self) -> list[Any]:
        with self.lock:
            return [m for call in self.calls for m in call]

    def count(self) -> int:
        with self.lock:
            return sum(len(c) for c in self.calls)


def settled(consumers: list[Any], group: str, topic: str, admin: actors.Admin) -> bool:
    """Every consumer owns exactly its averagely share over the group's current members."""
    queues = [MessageQueue(topic, r["broker"], r["queue_id"]) for r in admin.topic_status(topic)]
    expected = assign("averagely", group, queues, [c.client_id for c in consumers])
    return all(sorted(c.assigned_queues(topic)) == sorted(expected[c.client_id]) for c in consumers)


def send(
    cluster: actors.Cluster, topic: str, bodies: list[bytes], chunk: int = 2000, **kw: Any
) -> list[str]:
    """Send ``bodies``; each chunk of ``chunk`` messages goes to the next queue."""
    producer = cluster.producer(f"p-{topic}", max_batch_messages=chunk)
    try:
        return [r.msg_id for r in producer.send_batch([Message(topic, b, **kw) for b in bodies])]
    finally:
        producer.close()


def test_clustering_delivers_each_message_to_exactly_one_consumer(
    cluster: actors.Cluster,
) -> None:
    topic, group, n = "PushClustering", "g-clustering", 50_000
    cluster.admin.create_topic(topic, 4, 4)  # 8 queues over 2 brokers
    recorders = [Recorder() for _ in range(3)]
    consumers = [
        push(
            cluster,
            group,
            topic,
            rec,
            consume_from="FIRST",
            pull_batch_size=512,
            consume_batch_size=32,
            consume_threads=8,
        )
        for rec in recorders
    ]
    try:
        wait_until(lambda: settled(consumers, group, topic, cluster.admin), what="a stable split")
        bodies = [b"%06d" % i for i in range(n)]
        send(cluster, topic, bodies)
        wait_until(
            lambda: sum(r.count() for r in recorders) >= n, timeout_s=90, what="every message"
        )
        got = [m for r in recorders for m in r.messages]
        assert len(got) == n
        assert sorted(m.body for m in got) == bodies  # each message once, none lost
        for rec in recorders:
            assert rec.count() > 0, "every consumer got a share"
            # a queue's batches run side by side (orderly=True keeps a queue in order);
            # each batch holds consecutive messages of one queue
            for call in rec.calls:
                assert len({(m.store_host, m.queue_id) for m in call}) == 1
                offsets = [m.queue_offset for m in call]
                assert offsets == list(range(offsets[0], offsets[0] + len(call)))
        assert all(m.topic == topic and m.reconsume_times == 0 for m in got)
    finally:
        for c in consumers:
            c.shutdown()
    lag = cluster.admin.consumer_lag(group, topic)
    assert sum(r["lag"] for r in lag) == 0 and len(lag) == 8


def test_broadcasting_every_consumer_sees_every_message_and_resumes_from_its_local_offset(
    cluster: actors.Cluster, tmp_path: Path
) -> None:
    topic, group = "PushBroadcast", "g-broadcast"
    cluster.admin.create_topic(topic, 2, 2)
    opts = {"model": "BROADCASTING", "consume_from": "FIRST", "offset_store_dir": str(tmp_path)}
    recorders = [Recorder() for _ in range(3)]
    consumers = [
        push(cluster, group, topic, rec, instance_name=f"b{i}", **opts)
        for i, rec in enumerate(recorders)
    ]
    with pytest.raises(InvalidConfigError, match="instance_name"):
        push(cluster, group, topic, Recorder(), instance_name="b0", **opts)
    try:
        assert all(len(c.assigned_queues(topic)) == 4 for c in consumers)
        first = [b"first-%04d" % i for i in range(2000)]
        send(cluster, topic, first)
        wait_until(lambda: all(r.count() >= 2000 for r in recorders), what="everyone saw all")
        consumers[1].shutdown()
        assert (tmp_path / group / "b1.json").exists()
        second = [b"second-%04d" % i for i in range(500)]
        send(cluster, topic, second)
        wait_until(lambda: recorders[0].count() >= 2500 and recorders[2].count() >= 2500)
        again = Recorder()
        consumers[1] = push(cluster, group, topic, again, instance_name="b1", **opts)
        wait_until(lambda: again.count() >= 500, what="the restarted consumer caught up")
        for rec in (recorders[0], recorders[2]):
            assert sorted(m.body for m in rec.messages) == first + second
        assert sorted(m.body for m in recorders[1].messages) == first
        assert sorted(m.body for m in again.messages) == second  # resumed, nothing repeated
    finally:
        for c in consumers:
            c.shutdown()


def test_tag_subscription_is_exact(cluster: actors.Cluster) -> None:
    topic = "PushTags"
    cluster.admin.create_topic(topic, 1, 1)
    for tag in ("TagA", "TagB", "TagC"):
        send(cluster, topic, [f"{tag}-{i}".encode() for i in range(50)], tags=tag)
    rec = Recorder()
    consumer = push(
        cluster, "g-tags", topic, rec, subscription="TagA || TagB", consume_from="FIRST"
    )
    try:
        wait_until(lambda: rec.count() >= 100, what="TagA and TagB messages")
        assert {m.tags for m in rec.messages} == {"TagA", "TagB"}
        assert rec.count() == 100
    finally:
        consumer.shutdown()


def test_slow_message_holds_the_committed_offset_and_the_buffer_stays_bounded(
    cluster: actors.Cluster,
) -> None:
    topic, group = "PushSlow", "g-slow"
    cluster.admin.create_topic(topic, 1, 1, brokers=["broker-a"])
    entered, release = threading.Event(), threading.Event()
    done: list[int] = []

    def listener(messages: list[Any]) -> ConsumeStatus:
        for m in messages:
            if m.body == b"slow":
                entered.set()
                release.wait(30)
        done.extend(m.queue_offset for m in messages)
        return ConsumeStatus.SUCCESS

    consumer = push(
        cluster,
        group,
        topic,
        listener,
        consume_from="FIRST",
        pull_batch_size=10,
        pull_threshold_for_queue=50,
        consume_threads=1,  # the slow listener holds the only thread: the buffer fills
    )
    try:
        send(cluster, topic, [b"fast"] * 20 + [b"slow"] + [b"after"] * 500)
        assert entered.wait(20)
        pull = consumer.ns  # the consumer's own view of the broker
        mq = MessageQueue(topic, "broker-a", 0)
        broker = pull.broker(pull.require_route(topic), "broker-a")
        wait_until(
            lambda: ray.get(broker.query_offset.remote(group, topic, 0)) == 20,
            what="offset held at the slow message",
        )
        wait_until(lambda: consumer.status().get("flow_control_pauses", 0) >= 1)
        # past the threshold by one answer (a batch) at most, on the stream by its
        # credit window too (grown at most to half the threshold)
        window = 0 if DELIVERY.get(cluster.namespace) == "pull" else 50 // 2
        assert consumer.status()["buffered"] <= 50 + 10 + window
        assert mq in consumer.assigned_queues(topic)
        release.set()
        wait_until(lambda: len(done) >= 521, what="the rest consumed")
        wait_until(lambda: ray.get(broker.query_offset.remote(group, topic, 0)) == 521)
        assert done == list(range(521))
    finally:
        release.set()
        consumer.shutdown()


def test_shutdown_waits_for_a_running_listener_and_returns_as_it_ends(
    cluster: actors.Cluster,
) -> None:
    """``shutdown`` lets a listener call that runs finish: it waits for the consume task
    (not for ``shutdown_timeout_s``, 30 s) and goes on the moment the task ends."""
    topic, group = "PushShutdownWaits", "g-shutdown-waits"
    cluster.admin.create_topic(topic, 1, 1)
    entered, release = threading.Event(), threading.Event()
    done: list[bytes] = []

    def listener(messages: list[Any]) -> ConsumeStatus:
        entered.set()
        release.wait(60)
        done.extend(m.body for m in messages)
        return ConsumeStatus.SUCCESS

    consumer = push(cluster, group, topic, listener, consume_from="FIRST")
    stopper = threading.Thread(target=consumer.shutdown)
    try:
        send(cluster, topic, [b"held"])
        assert entered.wait(20)
        stopper.start()
        wait_until(
            lambda: consumer.consume._idle_waiters == 1, what="shutdown waiting for the task"
        )
        assert stopper.is_alive() and done == []
        release.set()
        stopper.join(10)
        assert not stopper.is_alive() and done == [b"held"]
    finally:
        release.set()
        if stopper.ident is None:  # failed before the shutdown began
            consumer.shutdown()
        else:
            stopper.join(30)


def test_shutdown_commits_and_leaves_the_group_at_once(cluster: actors.Cluster) -> None:
    topic, group = "PushLeave", "g-leave"
    cluster.admin.create_topic(topic, 2, 2)
    recs = [Recorder(), Recorder()]
    consumers = [push(cluster, group, topic, r, consume_from="FIRST") for r in recs]
    try:
        wait_until(lambda: settled(consumers, group, topic, cluster.admin), what="a stable split")
        send(cluster, topic, [b"x%d" % i for i in range(400)])
        wait_until(lambda: sum(r.count() for r in recs) >= 400)
        consumers[0].shutdown()
        assert cluster.admin.consumer_list(group) == [consumers[1].client_id]
        wait_until(lambda: len(consumers[1].assigned_queues(topic)) == 4, what="takeover")
        # the leaver committed before leaving; the survivor commits its own queues on
        # its next persist round, which a fast (coordinated) takeover can precede
        wait_until(
            lambda: sum(r["lag"] for r in cluster.admin.consumer_lag(group, topic)) == 0,
            what="every offset committed",
        )
    finally:
        for c in consumers:
            c.shutdown()
    assert cluster.admin.consumer_list(group) == []


def test_a_queue_the_broker_refuses_does_not_stall_the_queues_sharing_its_calls(
    cluster: actors.Cluster,
) -> None:
    topic = "PushShrink"
    cluster.admin.create_topic(topic, 2, 2)
    rec = Recorder()
    consumer = push(
        cluster,
        "g-refused",
        topic,
        rec,
        consume_from="FIRST",
        # held pulls share a call per broker; a subscription refuses a queue only when
        # it has news (tests/actors/push/test_subscription_stream.py)
        delivery="pull",
        # no coordinator and no rebalance: nothing takes queue 1 away below
        coordinated=False,
        rebalance_interval_s=3600.0,
        route_refresh_s=3600.0,
    )
    try:
        wait_until(lambda: len(consumer.assigned_queues(topic)) == 4, what="4 queues assigned")
        send(cluster, topic, [b"a%d" % i for i in range(40)], chunk=5)
        wait_until(lambda: rec.count() == 40, what="the first messages")
        # answered together, each broker's two queues went again as one held call; from
        # now on the brokers refuse queue 1, and a call that carries it fails as a whole
        cluster.admin.update_topic(topic, read_queue_nums=1, write_queue_nums=1)
        wait_until(lambda: consumer.status().get("pull_errors", 0) >= 2, what="refused pulls")
        send(cluster, topic, [b"b%d" % i for i in range(40)], chunk=5)
        wait_until(lambda: rec.count() == 80, what="queue 0 consumed while queue 1 is refused")
        assert {m.queue_id for m in rec.messages[40:]} == {0}
    finally:
        consumer.shutdown()


@ray.remote(num_cpus=0)
class PushHost:
    """A PushConsumer living in an actor (killed by the test without a shutdown)."""

    def __init__(self, namespace: str, group: str, topic: str, options: dict[str, Any]) -> None:
        self.seen: list[str] = []
        self.topic = topic
        self.consumer = PushConsumer(
            group, topic, listener=self._listen, namespace=namespace, **options
        ).start()

    def _listen(self, messages: list[Any]) -> ConsumeStatus:
        self.seen.extend(m.msg_id for m in messages)
        return ConsumeStatus.SUCCESS

    def client_id(self) -> str:
        return self.consumer.client_id

    def assigned(self) -> list[MessageQueue]:
        return self.consumer.assigned_queues(self.topic)

    def seen_ids(self) -> list[str]:
        return list(self.seen)


def test_a_killed_consumer_s_uncommitted_messages_go_to_the_others(
    cluster: actors.Cluster,
) -> None:
    topic, group = "PushKilled", "g-killed"
    cluster.admin.create_topic(topic, 2, 2)
    recs = [Recorder(), Recorder()]
    survivors = [push(cluster, group, topic, r, consume_from="FIRST") for r in recs]
    # the actor's consumer never commits on its own (a huge persist interval)
    host = PushHost.remote(
        cluster.namespace,
        group,
        topic,
        {
            **FAST,
            "delivery": DELIVERY.get(cluster.namespace),
            "consume_from": "FIRST",
            "persist_offset_interval_s": 3600.0,
        },
    )
    try:
        host_id = ray.get(host.client_id.remote())

        class HostView:
            client_id = host_id

            @staticmethod
            def assigned_queues(_: str) -> list[MessageQueue]:
                return ray.get(host.assigned.remote())

        wait_until(
            lambda: settled([*survivors, HostView()], group, topic, cluster.admin),
            what="a stable split of three",
        )
        sent = send(cluster, topic, [b"k%05d" % i for i in range(3000)], chunk=100)
        wait_until(lambda: ray.get(host.seen_ids.remote()), what="the actor consumed some")
        host_seen = set(ray.get(host.seen_ids.remote()))
        ray.kill(host, no_restart=True)
        seen = lambda: {m.msg_id for r in recs for m in r.messages}  # noqa: E731
        wait_until(lambda: seen() >= set(sent), timeout_s=30, what="everything redelivered")
        assert host_seen <= seen(), "what the killed consumer did not commit came again"
        # the group's coordinator drops the silent consumer on its own session timeout;
        # the brokers' member lists forget it on theirs, about as soon
        wait_until(
            lambda: cluster.admin.consumer_list(group) == sorted(c.client_id for c in survivors),
            what="the brokers forgetting the killed consumer",
        )
    finally:
        ray.kill(host, no_restart=True)
        for c in survivors:
            c.shutdown()
    counts: dict[str, int] = defaultdict(int)
    for r in recs:
        for m in r.messages:
            counts[m.msg_id] += 1
    assert set(counts) == set(sent)
