"""Large ``send_async`` calls to a broker on the producer's node go through a shared
memory ring instead of Ray's object store, and fall back to Ray when the broker
cannot read it; nothing is lost or reordered either way."""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any

import pytest
import ray
from ray.exceptions import GetTimeoutError
from raymq_testkit import drain, wait_until

from actors.protocol import rpc as _rpc
from actors.protocol.shared_ring import NONCE_BYTES, RingReader, SharedCall, SharedRing
from storage import Message
from storage.errors import InvalidMessageError


def test_a_slot_is_reused_only_once_released() -> None:
    ring = SharedRing(slots=2, slot_bytes=1000)
    try:
        a = ring.write([b"abc", memoryview(b"de")], 5)
        b = ring.write([b"x" * 1000], 1000)
        assert a is not None and b is not None and a != b
        assert ring.write([b"y"], 1) is None  # both slots in use
        assert ring.write([b"z" * 1001], 1001) is None  # larger than a slot
        ring.release(a)
        assert ring.write([b"again"], 5) == a
        ring.release(a)
        child = os.fork()
        if child == 0:  # a forked child must not write into its parent's slots
            os._exit(0 if ring.write([b"child"], 5) is None else 1)
        assert os.waitpid(child, 0)[1] == 0
    finally:
        ring.close()
    assert ring.write([b"late"], 4) is None  # closed: nothing is written


def test_a_shared_call_not_answered_in_time_times_out_as_ray_get_does() -> None:
    call = SharedCall(concurrent.futures.Future())
    with pytest.raises(GetTimeoutError):
        _rpc.get(call, 0.01)
    assert _rpc.is_retriable(GetTimeoutError())  # so a sync send tries another broker
    call.future().set_exception(InvalidMessageError("refused"))
    with pytest.raises(InvalidMessageError, match="refused"):
        _rpc.get(call, 1.0)


def test_a_reader_sees_what_was_written_and_refuses_what_is_not_its_ring() -> None:
    ring = SharedRing(slots=2, slot_bytes=64)
    other = SharedRing(slots=1, slot_bytes=64)
    reader = RingReader()
    try:
        offset = ring.write([b"hello ", b"ring"], 10)
        assert offset is not None
        view = reader.view(ring.ring_id, offset, 10)
        assert view is not None and bytes(view) == b"hello ring"
        pid, fd, _ = ring.ring_id
        assert reader.view((pid, fd, b"\x00" * NONCE_BYTES), offset, 10) is None  # not that file
        assert reader.view((pid, 10**6, ring.ring_id[2]), offset, 10) is None  # no such fd
        with open(__file__, "rb") as fh:  # a file, not a ring: never opened, whatever it holds
            assert reader.view((pid, fh.fileno(), fh.read(NONCE_BYTES)), offset, 10) is None
        with pytest.raises(InvalidMessageError, match="outside the ring"):
            reader.view(ring.ring_id, offset, 10**6)
        with pytest.raises(InvalidMessageError, match="outside the ring"):
            reader.view(ring.ring_id, 0, 4)  # the nonce is not a slot
        for bad in ((pid, fd), (pid, -1, ring.ring_id[2]), (pid, fd, b"short"), "ring"):
            with pytest.raises(InvalidMessageError, match="shared send"):
                reader.view(bad, offset, 10)
        with pytest.raises(InvalidMessageError, match="shared send"):
            reader.view(ring.ring_id, offset, -1)
        assert len(reader) == 1
        reader.drop(["not", "a", "ring"])
        reader.drop(ring.ring_id)  # its producer closed it
        assert len(reader) == 0
        # mappings nobody used for idle_s are dropped
        idle = RingReader(idle_s=0.0)
        assert idle.view(ring.ring_id, offset, 10) is not None
        assert idle.view(other.ring_id, NONCE_BYTES, 1) is not None
        assert len(idle) == 1
    finally:
        ring.close()
        other.close()


def _stats(cluster: Any) -> dict[str, int]:
    return ray.get(cluster.broker("broker-a").status.remote())


def _body(b: int, i: int) -> bytes:
    return b"%d-%d." % (b, i) + b"." * 90


def _batches(topic: str, n: int, size: int = 4096) -> list[list[Message]]:
    """``n`` batches of ``size`` 100 B messages: 4096 of them are a ~1.1 MB call."""
    return [[Message(topic, _body(b, i)) for i in range(size)] for b in range(n)]


def _sent_back(cluster: Any, topic: str, futures: list[Any], first: int = 0) -> None:
    """Every message of ``futures`` (``_batches`` from the ``first``th on, after
    ``first`` batches sent before) is stored once, where its result says."""
    results = [f.result(timeout=60) for f in futures]
    got = drain(cluster.pull_consumer(f"{topic}-check"), topic)
    stored = {
        (mq.queue_id, m.queue_offset): m.body for mq, messages in got.items() for m in messages
    }
    answered = [
        (sent.message_queue.queue_id, sent.queue_offset) for result in results for sent in result
    ]
    # two sends answered with the same place: one of them was taken for a retry of the other
    assert len(set(answered)) == len(answered), "two messages answered with one queue offset"
    missing = sorted(set(answered) - set(stored))
    assert not missing, f"{len(missing)} answered but not read back, from {missing[0]}"
    assert len(stored) == len(answered) + 4096 * first
    for b, result in enumerate(results):
        for i, sent in enumerate(result):
            assert stored[(sent.message_queue.queue_id, sent.queue_offset)] == _body(b, i)


def test_large_calls_to_a_broker_on_this_node_go_through_the_ring(make_cluster: Any) -> None:
    cluster = make_cluster(brokers=1)
    cluster.admin.create_topic("Ring", 4, 4)
    producer = cluster.producer("ring", max_batch_messages=4096, max_batch_bytes=8 << 20)
    before = _stats(cluster)
    futures = [producer.send_async(batch) for batch in _batches("Ring", 12)]
    _sent_back(cluster, "Ring", futures)
    after = _stats(cluster)
    calls = after["put_batches"] - before["put_batches"]
    assert after["shared_batches"] - before["shared_batches"] == calls > 0
    # a sync send of a large batch goes the same way
    sync = producer.send_batch(_batches("Ring", 1)[0])
    assert _stats(cluster)["shared_batches"] == after["shared_batches"] + 1
    stored = cluster.admin.query_by_id(sync[4095].offset_msg_id)
    assert stored.body == _body(0, 4095) and stored.queue_offset == sync[4095].queue_offset
    after = _stats(cluster)
    # small calls stay inline in Ray's task: the ring is for what the object store took
    producer.send_async([Message("Ring", b"small")] * 3).result(timeout=30)
    assert _stats(cluster)["shared_batches"] == after["shared_batches"]
    assert _stats(cluster)["shared_rings"] == 1
    producer.close()
    assert not producer._rings  # closed with the producer, and the broker let it go
    wait_until(lambda: _stats(cluster)["shared_rings"] == 0, what="the broker dropped the ring")

    plain = cluster.producer("no-ring", max_batch_messages=4096, shared_memory_send=False)
    futures = [plain.send_async(batch) for batch in _batches("Ring", 2)]
    [f.result(timeout=60) for f in futures]
    assert _stats(cluster)["shared_batches"] == after["shared_batches"]
    plain.close()


def test_a_broker_that_cannot_read_the_ring_gets_the_calls_through_ray(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(brokers=1)
    cluster.admin.create_topic("RingLost", 4, 4)
    producer = cluster.producer("ring-lost", max_batch_messages=4096, max_batch_bytes=8 << 20)
    producer.send_async(_batches("RingLost", 1)[0]).result(timeout=60)  # the ring is made
    (ring,) = producer._rings.values()
    pid, fd, _ = ring.ring_id
    ring.ring_id = (pid, fd, os.urandom(NONCE_BYTES))  # as if the fd now held another file
    shared = _stats(cluster)["shared_batches"]
    assert shared > 0

    futures = [producer.send_async(batch) for batch in _batches("RingLost", 8)]
    _sent_back(cluster, "RingLost", futures, first=1)
    assert "broker-a-0" in producer._ringless and not producer._rings
    assert _stats(cluster)["shared_batches"] == shared  # the rest came through Ray
    producer.close()


def test_a_malformed_shared_send_is_refused_and_stores_nothing(make_cluster: Any) -> None:
    cluster = make_cluster(brokers=1)
    cluster.admin.create_topic("RingBad", 1, 1)
    broker = cluster.broker("broker-a")
    before = _stats(cluster)["put_msgs"]
    with pytest.raises(InvalidMessageError, match="shared send"):
        ray.get(broker.send_shared.remote((os.getpid(), "3", b"n" * NONCE_BYTES), 16, 10))
    ring = SharedRing(slots=1, slot_bytes=64)
    try:
        offset = ring.write([b"not a batch"], 11)
        with pytest.raises(InvalidMessageError, match="malformed encoded batch"):
            ray.get(broker.send_shared.remote(ring.ring_id, offset, 11))
    finally:
        ring.close()
    assert _stats(cluster)["put_msgs"] == before
