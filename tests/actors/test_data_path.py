"""The data path: clients reach brokers over the brokers' own sockets, Ray stays the
control plane. Real brokers, real sockets, no mocks: what goes over the socket, what a
stranger on the port gets, and what a broken connection costs (nothing acknowledged)."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
import subprocess
import threading
from typing import Any

import msgpack
import pytest
import ray
from raymq_testkit import wait_until

import actors
from actors import PullStatus
from actors.coordinator.txn import TXN_COORDINATOR_NAME
from actors.protocol import frames, wire
from actors.protocol.requests.offsets import SEARCH_OFFSET
from rebalance import MessageQueue
from storage import Message, encode_batch
from storage.codec import decode_records
from storage.errors import InvalidConfigError


def status(cluster: actors.Cluster, name: str = "broker-a") -> dict[str, Any]:
    return ray.get(cluster.broker(name).status.remote())


def drain(consumer: actors.PullConsumer, queues: list[MessageQueue]) -> list[bytes]:
    out: list[bytes] = []
    for mq in queues:
        offset = 0
        while True:
            r = consumer.pull(mq, offset, 500)
            if r.status is not PullStatus.FOUND:
                break
            out.extend(r.bodies)
            offset = r.next_offset
    return out


@pytest.fixture
def cluster(one_broker: actors.Cluster) -> actors.Cluster:
    """The module's one broker (it and every test using it leave it as they found it),
    with the topic "Wire"."""
    one_broker.admin.create_topic("Wire", 4, 4)
    return one_broker


def test_routes_carry_the_data_address_and_clients_use_it(cluster: actors.Cluster) -> None:
    first = status(cluster)
    host, port = first["data_addr"].rsplit(":", 1)
    assert host == first["node_ip"] and int(port) > 0
    route = cluster.admin.topic_route("Wire")
    assert route.broker_datas[0].data_addrs == {0: first["data_addr"]}

    producer = cluster.producer("p-wire")
    consumer = cluster.pull_consumer("g-wire")
    queues = consumer.fetch_subscribe_queues("Wire")
    # a client's first call to a broker starts its connection (and goes through Ray if
    # the connection is not open yet): from then on the socket carries everything
    producer.send(Message("Wire", b"warm-up"))
    consumer.pull(queues[0], 0, 1)
    wait_until(lambda: status(cluster)["data_connections"] >= 2, what="both connections")
    before = status(cluster)
    sent = [b"w%04d" % i for i in range(300)]
    producer.send_batch([Message("Wire", b) for b in sent[:100]])  # sync, a batch
    for b in sent[100:200]:
        producer.send(Message("Wire", b))  # sync, one at a time
    futures = [producer.send_async(Message("Wire", b)) for b in sent[200:]]
    assert all(f.result(30).status is actors.SendStatus.SEND_OK for f in futures)

    assert sorted(drain(consumer, queues)) == sorted([b"warm-up", *sent])
    consumer.commit_offsets({q: 1 for q in queues})
    assert {consumer.fetch_offset(q) for q in queues} == {1}
    after = status(cluster)
    assert after["put_msgs"] - before["put_msgs"] == 300
    # every send, pull and commit above went over the socket: at least one request each
    puts = after["put_batches"] - before["put_batches"]
    pulls = after["pulls"] - before["pulls"]
    assert after["data_requests"] - before["data_requests"] >= puts + pulls + 1
    # an ASYNC_FLUSH master stores and answers each send from the socket's reader, with
    # no task per request; pulls and commits are tasks (a pull may be held)
    assert after["data_answered_at_once"] - before["data_answered_at_once"] == puts
    # a single send is put in plain values, no batch object (``put_one_send``): each of
    # the hundred sent one at a time, but a queue's first numbered run
    assert after["put_single"] - before["put_single"] >= 90
    assert after["data_connections"] == before["data_connections"]  # no new ones
    producer.close()
    consumer.close()


def test_data_path_ray_keeps_everything_on_ray(cluster: actors.Cluster) -> None:
    before = status(cluster)["data_requests"]
    cluster.admin.create_topic("WireRay", 4, 4)
    producer = cluster.producer("p-ray", data_path="ray")
    producer.send_batch([Message("WireRay", b"r%d" % i) for i in range(10)])
    consumer = cluster.pull_consumer("g-ray", data_path="ray")
    queues = consumer.fetch_subscribe_queues("WireRay")
    assert len(drain(consumer, queues)) == 10
    assert status(cluster)["data_requests"] == before
    with pytest.raises(InvalidConfigError, match="data_path"):
        cluster.producer("p-bad", data_path="carrier-pigeon")


def test_a_pull_consumer_finds_its_offsets_over_the_socket(cluster: actors.Cluster) -> None:
    """GET_MAX_OFFSET and SEARCH_OFFSET (``actors.protocol.requests.offsets``): a pull
    consumer's min_offset, max_offset and search_offset cross the broker's socket and
    answer what the broker's Ray methods answer."""
    cluster.admin.create_topic("Offsets", 1, 1)
    before = status(cluster)["data_connections"]
    producer = cluster.producer("p-offsets")
    producer.send_batch([Message("Offsets", b"early-%d" % i) for i in range(3)])
    consumer = cluster.pull_consumer("g-offsets")
    (mq,) = consumer.fetch_subscribe_queues("Offsets")
    consumer.pull(mq, 0, 1)  # its first call opens its connection
    wait_until(lambda: status(cluster)["data_connections"] >= before + 2, what="connections")
    producer.send_batch([Message("Offsets", b"late-%d" % i) for i in range(2)])
    stored = consumer.pull(mq, 0, 10).messages
    assert [m.body for m in stored][3:] == [b"late-0", b"late-1"]

    requests_before = status(cluster)["data_requests"]
    bounds = (consumer.min_offset(mq), consumer.max_offset(mq))
    found = {
        ts: consumer.search_offset(mq, ts)
        for ts in (0, stored[3].store_timestamp, stored[-1].store_timestamp + 1)
    }
    assert status(cluster)["data_requests"] - requests_before == 5  # each over the socket
    assert bounds == (0, 5)
    assert found == {
        ts: next((i for i, m in enumerate(stored) if m.store_timestamp >= ts), 5) for ts in found
    }
    broker = cluster.broker("broker-a")  # the Ray methods the requests stand for
    assert ray.get(broker.min_max_offset.remote("Offsets", 0)) == bounds
    assert {ts: ray.get(broker.offset_by_time.remote("Offsets", 0, ts)) for ts in found} == found
    producer.close()
    consumer.close()


def test_a_search_offset_with_a_wrong_field_is_answered_with_why_and_the_connection_goes_on(
    cluster: actors.Cluster,
) -> None:
    cluster.admin.create_topic("Offsets", 1, 1)
    sock = _proved(ray.get(cluster.broker("broker-a").data_path.remote()))
    sock.settimeout(30)
    try:
        for opaque, queue_id in ((1, "zero"), (2, 0)):
            frame = {"c": SEARCH_OFFSET.code, "o": opaque, "t": "Offsets", "q": queue_id, "s": 0}
            sock.sendall(b"".join(frames.encode(frame)))
            got = _read_frame(sock)
            assert got is not None and got[0]["o"] == opaque
            if opaque == 1:
                assert got[0]["c"] == frames.Code.ERROR
                assert got[0]["e"] == "InvalidMessageError" and "queue_id" in got[0]["m"]
            else:
                assert got[0]["c"] == frames.Code.OK and got[0]["r"] == 0
    finally:
        sock.close()


def test_a_push_consumer_holds_its_next_pull_from_the_thread_that_got_the_answer(
    cluster: actors.Cluster,
) -> None:
    """Over the socket, the pull an answer makes due leaves from the I/O thread that got
    the answer (its route and connection are there), so the broker holds it again
    without waiting for the pull thread; through Ray it leaves from the pull thread.
    Both on one cluster (a cluster costs ~6 s)."""
    assert _consume_one_at_a_time(cluster, "socket")["pulls_inline"] >= 30
    assert _consume_one_at_a_time(cluster, "ray").get("pulls_inline", 0) == 0


def _consume_one_at_a_time(cluster: actors.Cluster, data_path: str) -> dict[str, Any]:
    """60 messages sent one at a time to a PushConsumer, each awaited (each answer makes
    the next pull due) and seen once: the consumer's status."""
    got: list[bytes] = []
    seen = threading.Condition()

    def listener(messages: list[Any]) -> actors.ConsumeStatus:
        with seen:
            got.extend(m.body for m in messages)
            seen.notify_all()
        return actors.ConsumeStatus.SUCCESS

    topic = f"Inline{data_path.capitalize()}"
    cluster.admin.create_topic(topic, 4, 4)
    consumer = actors.PushConsumer(
        f"g-inline-{data_path}",
        topic,
        listener=listener,
        namespace=cluster.namespace,
        data_path=data_path,
        delivery="pull",  # held pulls, on either path
        rebalance_interval_s=0.3,
        heartbeat_interval_s=0.3,
        pull_suspend_s=2.0,
    ).start()
    producer = cluster.producer(f"p-inline-{data_path}", data_path=data_path)
    try:
        wait_until(lambda: len(consumer.assigned_queues(topic)) == 4, what="4 queues")
        sent = [b"i%03d" % i for i in range(60)]
        for body in sent:
            producer.send(Message(topic, body))
            with seen:
                assert seen.wait_for(lambda b=body: b in got, 20), f"{body!r} not consumed"
        assert sorted(got) == sorted(sent)  # each once
        return consumer.status()
    finally:
        producer.close()
        consumer.shutdown()


def _raw(addr: str) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _read_frame(sock: socket.socket) -> tuple[dict[str, Any], bytes] | None:
    """One frame from a raw socket, or None when the broker closed the connection."""
    head = b""
    while len(head) < 8:
        chunk = sock.recv(8 - len(head))
        if not chunk:
            return None
        head += chunk
    total, hlen = struct.unpack(">II", head)
    rest = b""
    while len(rest) < total - 4:
        chunk = sock.recv(total - 4 - len(rest))
        if not chunk:
            return None
        rest += chunk
    return msgpack.unpackb(rest[:hlen]), rest[hlen:]


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(
    "first_frame",
    [
        None,  # the right shape, a wrong proof
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # a stranger speaking another protocol
        struct.pack(">II", 1 << 30, 4) + b"xxxx",  # a huge declared length
        struct.pack(">II", 12, 8) + b"\xc1" * 8,  # not msgpack
    ],
    ids=["wrong-secret", "http", "oversized", "garbage"],
)
@pytest.mark.parametrize("door", ["port", "unix-socket"])
def test_a_stranger_is_closed_before_anything_is_read_and_the_broker_goes_on(
    cluster: actors.Cluster, first_frame: bytes | None, door: str
) -> None:
    before = status(cluster)
    if door == "port":
        sock = _raw(before["data_addr"])
    else:  # the file clients on the broker's node take: the same handshake guards it
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(ray.get(cluster.broker("broker-a").data_path.remote())["unix"])
    hello = _read_frame(sock)
    assert hello is not None and hello[0]["c"] == frames.Code.HELLO
    if first_frame is None:
        mine = frames.nonce()
        proof = frames.proof(b"not-the-secret" * 2, b"client", hello[0]["n"], mine)
        first_frame = b"".join(frames.encode({"c": int(frames.Code.AUTH), "n": mine, "p": proof}))
    sock.sendall(first_frame)
    # then what a client would send next: a send, which must never be stored (the
    # broker may have closed already: a Unix socket refuses the write at once)
    batch = encode_batch([Message("Wire", b"sneaked in")]).to_bytes()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(b"".join(frames.encode({"c": int(frames.Code.SEND), "o": 1}, [batch])))
    assert _closed_by_peer(sock)
    sock.close()
    after = status(cluster)
    assert after["data_refused"] == before["data_refused"] + 1
    assert after["put_msgs"] == before["put_msgs"]
    producer = cluster.producer("p-after-stranger")
    served = producer.send(Message("AfterStranger", b"still serving"))  # auto-created
    assert served.status is actors.SendStatus.SEND_OK


def _proved(info: dict[str, Any]) -> socket.socket:
    """A raw connection to a broker's data path that passed the handshake (the broker
    proved it holds the secret too)."""
    sock = _raw(info["addr"])
    hello = _read_frame(sock)
    assert hello is not None
    mine = frames.nonce()
    proof = frames.proof(info["secret"], b"client", hello[0]["n"], mine)
    sock.sendall(b"".join(frames.encode({"c": int(frames.Code.AUTH), "n": mine, "p": proof})))
    ok = _read_frame(sock)
    assert ok is not None and ok[0]["c"] == frames.Code.OK
    assert frames.check_proof(info["secret"], b"broker", mine, hello[0]["n"], ok[0]["p"])
    return sock


def test_a_send_is_answered_at_once_only_behind_no_task_of_its_connection(
    cluster: actors.Cluster,
) -> None:
    """A send an ASYNC_FLUSH master can store at once is answered from the reader's
    callback, unless an earlier request of its connection still runs as a task (here a
    held pull): then it is a task too, so what a client sent first takes effect first.
    Either way it is stored once and wakes the pull."""
    cluster.admin.create_topic("Order", 1, 1)
    info = ray.get(cluster.broker("broker-a").data_path.remote())
    sock = _proved(info)
    sock.settimeout(30)
    try:
        held_before = status(cluster)["held_pulls"]
        pull = wire.pull_request_to_wire("g-order", [("Order", 0, 0)], 32, None, 20.0, "c1")
        sock.sendall(b"".join(frames.encode({"c": int(frames.Code.PULL), "o": 1}, [pull])))
        wait_until(lambda: status(cluster)["held_pulls"] > held_before, what="the pull held")
        before = status(cluster)["data_answered_at_once"]

        def send(opaque: int, body: bytes) -> None:
            batch = encode_batch([Message("Order", body)]).with_queue(0).to_bytes()
            frame = frames.encode({"c": int(frames.Code.SEND), "o": opaque}, [batch])
            sock.sendall(b"".join(frame))

        send(2, b"behind a held pull")
        answers = {}
        for _ in range(2):
            got = _read_frame(sock)
            assert got is not None
            answers[got[0]["o"]] = got
        assert answers[2][0]["c"] == frames.Code.OK  # the send, run as a task
        assert status(cluster)["data_answered_at_once"] == before
        (held,) = wire.pulls_from_wire(answers[1][1])  # the pull, woken by it
        assert [m.body for m in decode_records(held.data)] == [b"behind a held pull"]
        send(3, b"alone")  # nothing of the connection runs now: answered at once
        got = _read_frame(sock)
        assert got is not None and got[0]["o"] == 3 and got[0]["c"] == frames.Code.OK
        assert status(cluster)["data_answered_at_once"] == before + 1
    finally:
        sock.close()
    consumer = cluster.pull_consumer("g-order-check")
    (mq,) = consumer.fetch_subscribe_queues("Order")
    assert consumer.pull(mq, 0, 10).bodies == [b"behind a held pull", b"alone"]
    consumer.close()


def test_a_send_with_flags_that_are_not_an_int_is_refused_and_stores_nothing(
    cluster: actors.Cluster,
) -> None:
    info = ray.get(cluster.broker("broker-a").data_path.remote())
    sock = _proved(info)
    sock.settimeout(30)
    before = status(cluster)["put_msgs"]
    batch = encode_batch([Message("Wire", b"flagged")]).with_queue(0).to_bytes()
    try:
        for opaque, flags in ((1, "oneway"), (2, 1.5), (3, True)):
            frame = frames.encode({"c": int(frames.Code.SEND), "o": opaque, "f": flags}, [batch])
            sock.sendall(b"".join(frame))
            got = _read_frame(sock)
            assert got is not None and got[0]["o"] == opaque
            assert got[0]["c"] != frames.Code.OK and "flags" in got[0]["m"]
        sock.sendall(b"".join(frames.encode({"c": int(frames.Code.SEND), "o": 4}, [batch])))
        got = _read_frame(sock)
        assert got is not None and got[0]["o"] == 4 and got[0]["c"] == frames.Code.OK
    finally:
        sock.close()
    assert status(cluster)["put_msgs"] == before + 1  # the good one only


def test_a_malformed_or_oversized_frame_after_the_handshake_closes_only_that_connection(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(
        nameservers=1,
        brokers=1,
        topics=[actors.TopicConfig("Wire", 2, 2)],
        broker_options={"max_frame_bytes": 1 << 16},
    )
    broker = cluster.broker("broker-a")
    info = ray.get(broker.data_path.remote())
    producer = cluster.producer("p-steady")
    assert producer.send(Message("Wire", b"before")).status is actors.SendStatus.SEND_OK
    stored = status(cluster)["put_msgs"]
    batch = encode_batch([Message("Wire", b"no id")]).with_queue(0).to_bytes()
    for bad in (
        struct.pack(">II", (1 << 16) + 1, 4) + b"{}{}",  # over max_frame_bytes
        struct.pack(">II", 6, 2) + b"\x92\x01",  # a header that is not a map
        struct.pack(">II", 8, 10) + b"\x80" * 4,  # a header longer than the frame
        b"".join(frames.encode({"c": int(frames.Code.SEND)}, [batch])),  # no id to answer by
    ):
        sock = _proved(info)
        sock.sendall(bad)
        assert _closed_by_peer(sock)
        sock.close()
    assert status(cluster)["data_bad_frames"] == 4
    assert status(cluster)["put_msgs"] == stored  # the send without an id stored nothing
    # the producer's own connection never noticed
    assert producer.send(Message("Wire", b"after")).status is actors.SendStatus.SEND_OK


def test_a_broker_restarted_on_a_new_port_is_found_again_and_nothing_acked_is_lost(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(
        nameservers=1,
        brokers=2,
        topics=[actors.TopicConfig("Moves", 2, 2)],
        broker_options={"store": {"flush_disk_type": "SYNC_FLUSH"}},
    )
    producer = cluster.producer("p-moves", send_timeout_s=2.0, fault_isolation_s=1.0)
    acked: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set():
            try:
                acked.extend(
                    r.msg_id for r in producer.send_batch([Message("Moves", b"m%d" % i)] * 5)
                )
            except BaseException as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)
                return
            i += 1

    broker = cluster.broker("broker-a")
    old = status(cluster)["data_addr"]
    thread = threading.Thread(target=produce)
    thread.start()
    wait_until(lambda: len(acked) >= 200, what="sends flowing")
    ray.kill(broker, no_restart=False)
    wait_until(
        lambda: _status_of(broker).get("data_addr") not in (None, old),
        timeout_s=60,
        what="broker-a back on another port",
    )
    count = len(acked)

    def lands_on_a() -> bool:  # over its new socket
        return _status_of(broker).get("data_requests", 0) > 0

    wait_until(lands_on_a, timeout_s=30, what="sends reaching the restarted broker-a's socket")
    wait_until(lambda: len(acked) >= count + 200, what="sends after the restart")
    stop.set()
    thread.join(30)
    assert not errors, errors
    consumer = cluster.pull_consumer("g-moves")
    stored = set()
    for mq in consumer.fetch_subscribe_queues("Moves"):
        offset = 0
        while (r := consumer.pull(mq, offset, 500)).status is PullStatus.FOUND:
            stored.update(m.msg_id for m in r.messages)
            offset = r.next_offset
    assert set(acked) <= stored


def _status_of(handle: Any) -> dict[str, Any]:
    """A broker's status, or {} while it is dead or restarting."""
    try:
        return ray.get(handle.status.remote(), timeout=5)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return {}


def _self_signed(tmp_path: Any, ip: str) -> tuple[str, str]:
    """A certificate for ``ip`` and its key, made with the system's openssl."""
    cert, key = tmp_path / "broker.pem", tmp_path / "broker.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=raymq-test", "-addext", f"subjectAltName=IP:{ip}",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


def test_tls_carries_the_data_path_and_a_plain_text_client_gets_nothing(
    make_cluster: Any, tmp_path: Any
) -> None:
    cert, key = _self_signed(tmp_path, ray.util.get_node_ip_address())
    cluster = make_cluster(
        nameservers=1,
        brokers=1,
        topics=[actors.TopicConfig("Sealed", 2, 2)],
        broker_options={"data_tls_cert": cert, "data_tls_key": key},
    )
    info = ray.get(cluster.broker("broker-a").data_path.remote())
    assert info["tls"] is True
    # a client that checks the broker's certificate against the CA it was given
    producer = cluster.producer("p-tls", data_tls_ca=cert)
    consumer = cluster.pull_consumer("g-tls", data_tls_ca=cert)
    queues = consumer.fetch_subscribe_queues("Sealed")
    producer.send(Message("Sealed", b"warm-up"))
    consumer.pull(queues[0], 0, 1)
    wait_until(lambda: status(cluster)["data_connections"] >= 2, what="both TLS connections")
    before = status(cluster)["data_requests"]
    sent = [b"t%03d" % i for i in range(50)]
    producer.send_batch([Message("Sealed", b) for b in sent])
    assert sorted(drain(consumer, queues)) == sorted([b"warm-up", *sent])
    assert status(cluster)["data_requests"] > before  # over the sealed socket, not Ray

    # plain text on a TLS port: no greeting, no proof, nothing stored
    sock = _raw(info["addr"])
    sock.sendall(b"".join(frames.encode({"c": int(frames.Code.SEND), "o": 1}, [b"x" * 64])))
    assert _closed_by_peer(sock)
    sock.close()
    assert status(cluster)["put_msgs"] == 51

    # the transaction coordinator, made by start_cluster with the brokers' pair, is
    # sealed too: a commit reaches it over TLS, plain text gets nothing
    coordinator = ray.get_actor(TXN_COORDINATOR_NAME, namespace=cluster.namespace)
    door = ray.get(coordinator.data_path.remote())
    assert door["tls"] is True
    txp = actors.TransactionalProducer(
        "p-tls-txn",
        transactional_id="tls-1",
        namespace=cluster.namespace,
        data_tls_ca=cert,
        one_phase=False,  # through the coordinator, not its one broker alone
    )
    # its connection to the coordinator opens beside the first calls (which go through
    # Ray meanwhile): wait for it, then a commit must take it
    wait_until(
        lambda: txp._data_path.is_open(TXN_COORDINATOR_NAME), what="the coordinator's TLS door"
    )
    requests = ray.get(coordinator.status.remote())["door"]["requests"]
    with txp.begin() as txn:
        txn.send([Message("Sealed", b"sealed-txn")])
    assert ray.get(coordinator.status.remote())["door"]["requests"] > requests
    assert b"sealed-txn" in drain(consumer, queues)
    sock = _raw(door["addr"])
    sock.sendall(b"".join(frames.encode({"c": int(frames.Code.TXN_END), "o": 1}, [])))
    assert _closed_by_peer(sock)
    sock.close()
    txp.close()
    producer.close()
    consumer.close()


def test_a_thousand_held_pulls_on_one_broker_all_answer_the_next_message(
    cluster: actors.Cluster,
) -> None:
    cluster.admin.create_topic("Held", 1, 1)
    consumer = cluster.pull_consumer("g-held")
    mq = consumer.fetch_subscribe_queues("Held")[0]
    producer = cluster.producer("p-held")
    consumer.pull(mq, 0, 1)  # opens the consumer's connection
    wait_until(lambda: consumer._data_path.is_open(mq.broker_name + "-0"), what="its connection")
    held = [consumer.pull_async(mq, 0, 1, long_poll_s=30.0) for _ in range(1000)]
    wait_until(lambda: status(cluster)["held_pulls"] >= 1000, what="1,000 pulls held")
    assert not any(f.done() for f in held)
    # one message to the queue answers every one of them, over one connection
    producer.send(Message("Held", b"the news"))
    results = [f.result(60) for f in held]
    assert {r.status for r in results} == {PullStatus.FOUND}
    assert {tuple(r.bodies) for r in results} == {(b"the news",)}
    # (a pull another test's consumer left held ends within its suspend time)
    wait_until(lambda: status(cluster)["held_pulls"] == 0, what="no pull held")
    assert status(cluster)["data_bad_frames"] == 0
    assert producer.send(Message("Held", b"still serving")).status is actors.SendStatus.SEND_OK
    producer.close()
    consumer.close()


def test_a_connection_with_too_many_requests_in_flight_is_read_no_further_until_some_end(
    make_cluster: Any,
) -> None:
    """``max_requests_per_connection``: past it the broker stops reading the connection
    (TCP pushes back on the client) instead of taking requests without bound."""
    cluster = make_cluster(
        nameservers=1,
        brokers=1,
        topics=[actors.TopicConfig("Capped", 1, 1)],
        broker_options={"max_requests_per_connection": 8},
    )
    consumer = cluster.pull_consumer("g-capped")
    mq = consumer.fetch_subscribe_queues("Capped")[0]
    consumer.pull(mq, 0, 1)  # opens the consumer's connection
    wait_until(lambda: consumer._data_path.is_open(mq.broker_name + "-0"), what="its connection")
    held = [consumer.pull_async(mq, 0, 1, long_poll_s=30.0) for _ in range(20)]
    wait_until(lambda: status(cluster)["held_pulls"] >= 8, what="8 pulls held")
    assert status(cluster)["held_pulls"] == 8  # the other 12 wait in the socket, unread
    assert status(cluster)["data_paused_reads"] >= 1
    producer = cluster.producer("p-capped")  # another connection is served meanwhile
    producer.send(Message("Capped", b"news"))
    results = [f.result(60) for f in held]  # the 8 answer, the rest are read and answer
    assert {tuple(r.bodies) for r in results} == {(b"news",)}
    producer.close()
    consumer.close()


def test_connections_cut_by_the_client_mid_send_lose_nothing_acknowledged(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(
        nameservers=1,
        brokers=2,
        topics=[actors.TopicConfig("Cut", 2, 2)],
        broker_options={"store": {"flush_disk_type": "SYNC_FLUSH"}},
    )
    producer = cluster.producer("p-cut", send_timeout_s=5.0)
    acked: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set():
            try:
                batch = [Message("Cut", b"c%d-%d" % (i, j)) for j in range(20)]
                acked.extend(r.msg_id for r in producer.send_batch(batch))
            except BaseException as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)
                return
            i += 1

    def connections() -> int:
        return sum(status(cluster, b)["data_connections"] for b in ("broker-a", "broker-b"))

    thread = threading.Thread(target=produce)
    thread.start()
    wait_until(lambda: len(acked) >= 200, what="sends flowing")
    opened = connections()
    cuts = 0
    for _ in range(10):  # cut whatever connection is open, while batches are on the wire
        conns = list(producer._data_path._conns.values())
        for conn in conns:
            conn.close()
        cuts += len(conns)
        wait_until(lambda n=len(acked): len(acked) >= n + 100, what="sends after a cut")
    stop.set()
    thread.join(30)
    assert not errors, errors
    assert cuts >= 10
    assert connections() >= opened + 10  # each cut was felt: the producer connected again
    consumer = cluster.pull_consumer("g-cut")
    stored: list[str] = []
    for mq in consumer.fetch_subscribe_queues("Cut"):
        offset = 0
        while (r := consumer.pull(mq, offset, 500)).status is PullStatus.FOUND:
            stored.extend(m.msg_id for m in r.messages)
            offset = r.next_offset
    assert set(acked) <= set(stored)  # nothing acknowledged is lost
    assert len(set(acked)) == len(acked)  # and no message was acknowledged twice
    assert len(set(stored)) == len(stored)  # nor stored twice: the producer is idempotent
    producer.close()


def test_clients_on_the_brokers_node_take_its_unix_socket(
    cluster: actors.Cluster,
) -> None:
    info = ray.get(cluster.broker("broker-a").data_path.remote())
    path = info["unix"]
    assert info["node"] == ray.get_runtime_context().get_node_id()
    # a socket only its user may open, in a directory only its user may enter
    assert stat.S_ISSOCK(os.stat(path).st_mode) and os.stat(path).st_mode & 0o777 == 0o600
    folder = os.stat(os.path.dirname(path))
    assert folder.st_uid == os.getuid() and folder.st_mode & 0o777 == 0o700
    before = status(cluster)
    producer = cluster.producer("p-local")
    consumer = cluster.pull_consumer("g-local")
    queues = consumer.fetch_subscribe_queues("Wire")
    producer.send(Message("Wire", b"opens the connection"))
    consumer.pull(queues[0], 0, 1)
    wait_until(
        lambda: status(cluster)["data_local_connections"] >= before["data_local_connections"] + 2,
        what="both clients on the broker's Unix socket",
    )
    sent = producer.send(Message("Wire", b"over the local socket"))
    assert sent.status is actors.SendStatus.SEND_OK
    after = status(cluster)
    assert after["data_local_connections"] - before["data_local_connections"] == (
        after["data_connections"] - before["data_connections"]
    )  # every new connection of this node's clients
    producer.close()
    consumer.close()
