"""Failures: a broker crashes and Ray restarts it, a broker dies, a NameServer dies,
a cluster stops and starts again on the same stores."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from raymq_testkit import SMALL_STORE, unique_namespace, wait_until

import actors
from actors import BrokerSpec, PullStatus
from actors.protocol.wire import SendAck
from storage import Message, encode_batch
from storage.errors import DiskFullError, InvalidMessageError


def route_brokers(cluster: Any, topic: str) -> list[str]:
    route = cluster.admin.ns.route(topic, refresh=True)
    return sorted(q.broker_name for q in route.queue_datas) if route else []


def incarnation(broker: Any) -> str | None:
    """The broker's incarnation, or None while Ray restarts it."""
    try:
        return ray.get(broker.ping.remote(), timeout=30)
    except ray.exceptions.RayActorError:
        return None


def all_msg_ids(consumer: Any, topic: str) -> list[str]:
    ids = []
    for mq in consumer.fetch_subscribe_queues(topic):
        offset = 0
        while True:
            r = consumer.pull(mq, offset, 2000)
            if r.status is not PullStatus.FOUND:
                break
            ids.extend(m.msg_id for m in r.messages)
            offset = r.next_offset
    return ids


@pytest.fixture(scope="module")
def crashing(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two NameServers and two SYNC_FLUSH brokers shared by the tests that crash broker-a
    and let Ray start it again in place (the cluster whole again after each), each on a
    topic and groups of its own: a cluster costs ~6 s to start."""
    cluster = actors.start_cluster(
        namespace=unique_namespace("crash"),
        nameservers=2,
        brokers=2,
        store_root=str(tmp_path_factory.mktemp("crash")),
        topics=["CrashSmall", "CrashRing", "OneBad"],
        broker_options={
            "store": {**SMALL_STORE, "flush_disk_type": "SYNC_FLUSH"},
            "heartbeat_interval_s": 2.0,
        },
    )
    yield cluster
    cluster.shutdown(timeout_s=10.0)


@pytest.mark.parametrize(
    ("per_batch", "pad", "topic"),
    [(20, b"", "CrashSmall"), (2048, b"." * 120, "CrashRing")],  # ~0.7 MB calls: the ring
    ids=["small", "shared-ring"],
)
def test_crashed_broker_restarts_in_place_with_every_acknowledged_message(
    crashing: Any, per_batch: int, pad: bytes, topic: str
) -> None:
    cluster = crashing
    broker = cluster.broker("broker-a")
    before = ray.get(broker.status.remote())
    producer = cluster.producer(f"p-{topic}", send_timeout_s=2.0, fault_isolation_s=2.0)
    acked: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    sent_during: dict[str, int] = {"batches": 0}

    def produce() -> None:
        i = 0
        while not stop.is_set():
            try:
                result = producer.send_batch(
                    [Message(topic, b"m%d-%d" % (i, k) + pad) for k in range(per_batch)]
                )
                acked.extend(r.msg_id for r in result)
                sent_during["batches"] += 1
            except BaseException as exc:  # noqa: BLE001 - the test asserts there are none
                errors.append(exc)
                return
            i += 1

    thread = threading.Thread(target=produce)
    thread.start()
    wait_until(lambda: sent_during["batches"] >= 20, what="producer warmed up")
    ray.kill(broker, no_restart=False)
    killed_at = sent_during["batches"]
    wait_until(
        lambda: incarnation(broker) not in (None, before["incarnation"]),
        timeout_s=60,
        what="broker-a restarted",
    )
    wait_until(
        lambda: route_brokers(cluster, topic) == ["broker-a", "broker-b"],
        what="broker-a back in the routes",
    )
    wait_until(lambda: sent_during["batches"] >= killed_at + 20, what="more sends after restart")
    stop.set()
    thread.join(30)
    assert not errors, errors
    after = ray.get(broker.status.remote())
    assert after["node_id"] == before["node_id"] and after["store_dir"] == before["store_dir"]
    assert after["abnormal_start"] and after["pid"] != before["pid"]
    if pad:  # the restarted broker reads the producer's ring, once a send lands on it

        def lands_on_a() -> bool:
            batch = [Message(topic, b"after-%d" % k + pad) for k in range(per_batch)]
            result = producer.send_batch(batch)
            acked.extend(r.msg_id for r in result)
            return result.queues[0][0].broker_name == "broker-a"

        wait_until(lands_on_a, timeout_s=30, what="a send to the restarted broker-a")
        assert ray.get(broker.status.remote())["shared_batches"] > 0
        assert "broker-a-0" in producer._rings  # the same ring as before the crash
    stored = all_msg_ids(cluster.pull_consumer(f"g-{topic}"), topic)
    assert set(acked) <= set(stored)
    assert len(acked) >= 40 * 20
    producer.close()  # the cluster outlives the test


def test_dead_broker_leaves_every_route_at_once(make_cluster: Any) -> None:
    cluster = make_cluster(nameservers=2, brokers=2, topics=["Dead"])
    producer = cluster.producer("p-dead", fault_isolation_s=30.0)
    warm = producer.send_batch(
        [Message("Dead", b"w%d" % i) for i in range(64)],
    )
    assert {mq.broker_name for mq, _, _ in warm.queues} == {"broker-a"}  # 64 < 1 chunk
    assert route_brokers(cluster, "Dead") == ["broker-a", "broker-b"]
    ray.kill(cluster.broker("broker-b"), no_restart=True)
    killed = time.monotonic()
    for i in range(2):
        ns = cluster.nameserver(i)

        def gone(ns: Any = ns) -> bool:
            route = ray.get(ns.get_route.remote("Dead"))
            return [q.broker_name for q in route.queue_datas] == ["broker-a"]

        wait_until(gone, timeout_s=5, what=f"nameserver-{i} drops broker-b")
    assert time.monotonic() - killed < 1.5
    # the NameServers push the change (actors.namesrv.client), so the producer drops its
    # cached route at once; if a send still went out on it, it failed and was retried
    futures = [
        producer.send_async([Message("Dead", b"a%d-%d" % (i, k)) for k in range(5)])
        for i in range(8)
    ]
    results = [f.result(timeout=30) for f in futures]
    results.append(producer.send_batch([Message("Dead", b"s%d" % i) for i in range(5)]))
    for _ in range(8):
        results.append(producer.send_batch([Message("Dead", b"x")]))
    assert {mq.broker_name for r in results for mq, _, _ in r.queues} == {"broker-a"}
    assert (
        "broker-b" in producer.fault.snapshot()
        or "Dead" not in producer.ns.names._routes
        or [q.broker_name for q in producer.ns.names._routes["Dead"][1].queue_datas] == ["broker-a"]
    )


def test_clients_fail_over_to_the_next_nameserver(make_cluster: Any) -> None:
    cluster = make_cluster(nameservers=2, brokers=1, topics=["Fail"])
    producer = cluster.producer("p-fail")
    consumer = cluster.pull_consumer("g-fail")
    producer.send(Message("Fail", b"before"))
    ray.kill(cluster.nameserver(0), no_restart=True)
    cluster.admin.create_topic("Fail2", 1, 1)  # forces route lookups through the dead one
    r = producer.send(Message("Fail2", b"after"))
    assert r.status.value == "SEND_OK"
    mq = consumer.fetch_subscribe_queues("Fail2")[0]
    assert [m.body for m in consumer.pull(mq, 0).messages] == [b"after"]
    from actors import connect

    again = connect(cluster.namespace)
    assert again.nameserver_names == ["nameserver-1"]
    status = cluster.admin.cluster_status()
    assert [n["alive"] for n in status["nameservers"]] == [False, True]


def test_offsets_and_messages_survive_a_clean_restart(make_cluster: Any, tmp_path: Path) -> None:
    ns, root = unique_namespace("restart"), str(tmp_path / "stores")
    cluster = make_cluster(
        namespace=ns,
        store_root=root,
        nameservers=1,
        brokers=1,
        broker_options={"auto_create_topic_enable": False},
        topics=["Keep"],
    )
    cluster.producer("p-keep").send_batch([Message("Keep", b"k%d" % i) for i in range(100)])
    consumer = cluster.pull_consumer("g-keep")
    queues = consumer.fetch_subscribe_queues("Keep")
    committed = {q: consumer.max_offset(q) // 2 for q in queues}
    consumer.commit_offsets(committed)
    cluster.shutdown()
    saved = json.loads((Path(root) / "broker-a-0" / "config" / "consumerOffset.json").read_text())
    assert saved["offsetTable"]["Keep@g-keep"] == {str(q.queue_id): o for q, o in committed.items()}
    topics = json.loads((Path(root) / "broker-a-0" / "config" / "topics.json").read_text())
    assert "Keep" in topics["topicConfigTable"]
    again = make_cluster(
        namespace=ns,
        store_root=root,
        nameservers=1,
        brokers=1,
        broker_options={"auto_create_topic_enable": False},
    )
    consumer = again.pull_consumer("g-keep")
    assert consumer.fetch_offsets("Keep") == committed
    assert sum(consumer.max_offset(q) for q in queues) == 100
    assert not ray.get(again.broker("broker-a").status.remote())["abnormal_start"]


def test_a_bad_record_from_one_client_costs_nobody_a_message_at_the_next_crash(
    crashing: Any,
) -> None:
    cluster = crashing
    broker = cluster.broker("broker-a")
    before = ray.get(broker.status.remote())
    batch = encode_batch([Message("OneBad", b"fine"), Message("OneBad", b"flipped")])
    blob = bytearray(batch.to_bytes())
    second = len(blob) - len(batch.data) + int(batch.sizes[0])  # the second record
    blob[second + 8] ^= 0x01  # one bit of its BODYCRC, as a buggy client or a bad link
    with pytest.raises(InvalidMessageError, match="record 1"):
        ray.get(broker.send.remote(bytes(blob)))
    assert ray.get(broker.status.remote())["put_msgs"] == before["put_msgs"]  # nothing of it

    producer = cluster.producer("p-one-bad")
    acked = [producer.send(Message("OneBad", b"good-%d" % i)).msg_id for i in range(50)]
    ray.kill(broker, no_restart=False)  # SIGKILL: the next start recovers from the abort file
    wait_until(
        lambda: incarnation(broker) not in (None, before["incarnation"]),
        timeout_s=60,
        what="broker-a restarted",
    )
    assert ray.get(broker.status.remote())["abnormal_start"]
    # up is not yet registered: its death notice took it out of the routes
    wait_until(
        lambda: "broker-a" in route_brokers(cluster, "OneBad"), what="broker-a back in the routes"
    )
    assert sorted(all_msg_ids(cluster.pull_consumer("g-one-bad"), "OneBad")) == sorted(acked)
    producer.close()


@pytest.fixture
def small_disk(tmpfs: Callable[[int], Path]) -> Path:
    """A 16 MiB tmpfs for the store (``tests/conftest.py``)."""
    return tmpfs(16)


def test_a_broker_on_a_full_disk_refuses_writes_clearly_restarts_and_serves_every_message(
    make_cluster: Any, small_disk: Path
) -> None:
    small = {"commitlog_file_size": 1 << 20, "max_message_size": 512 << 10}
    small |= {"consume_queue_file_entries": 5000}
    small |= {"index_hash_slots": 1009, "index_max_entries": 8000}
    cluster = make_cluster(
        nameservers=1,
        brokers=[BrokerSpec("broker-a", store_dir=str(small_disk / "a")), "broker-b"],
        topics=["Full"],
        broker_options={"store": {"flush_disk_type": "SYNC_FLUSH", **small}},
    )
    a = cluster.broker("broker-a")
    to_a = cluster.producer("p-full", send_latency_fault_enable=False)
    mq = next(q for q in to_a.fetch_publish_queues("Full") if q.broker_name == "broker-a")
    acked: list[str] = []
    with pytest.raises(DiskFullError, match="disk"):
        for i in range(1000):  # 100 KB each: the 16 MiB disk is over 90% well before
            batch = encode_batch([Message("Full", b"%06d" % i + b"." * 100_000)])
            ack = SendAck.from_wire(
                ray.get(a.send.remote(batch.with_queue(mq.queue_id).to_bytes()))
            )
            acked.append(f"{mq.queue_id}:{int(ack.queue_offsets[0])}")
    status = ray.get(a.status.remote())
    assert status["disk_full"] and status["disk_used_ratio"] > 0.9
    assert len(acked) > 50
    # a producer's sends go to the broker that has room
    others = {r.message_queue.broker_name for r in to_a.send_batch([Message("Full", b"x")] * 20)}
    assert others == {"broker-b"}

    # the disk stays full across the restart, whatever recovery frees: a CommitLog file
    # allocated ahead and still empty is removed by it (RocketMQ's truncateDirtyFiles),
    # which on this 16 MiB disk alone can bring the use back under 90%
    free = shutil.disk_usage(small_disk).free
    (small_disk / "ballast").write_bytes(b"\0" * max(0, free - (64 << 10)))
    before = ray.get(a.ping.remote())
    ray.kill(a, no_restart=False)  # it must start again on the full disk, read-only
    wait_until(lambda: incarnation(a) not in (None, before), timeout_s=60, what="broker-a back")
    assert ray.get(a.status.remote())["disk_full"]

    def routed() -> bool:  # it answers before its first registration is through
        route = ray.get(cluster.nameserver(0).get_route.remote("Full"))
        bd = None if route is None else route.broker("broker-a")
        return bd is not None and bool(bd.actor_names)

    wait_until(routed, timeout_s=30, what="broker-a in the route again")
    consumer = cluster.pull_consumer("g-full")
    stored = []
    offset = 0
    while True:
        r = consumer.pull(mq, offset, 64)
        if r.status is not PullStatus.FOUND:
            break
        stored.extend(f"{mq.queue_id}:{m.queue_offset}" for m in r.messages)
        offset = r.next_offset
    assert stored == acked
