"""Transactional messages in the store: a message marked ``TRAN_MSG=true`` is kept as
its half copy (``storage.transaction``), never in its own topic, on the plain and the
idempotent producer's paths alike, and a retried idempotent run is not stored twice."""

from __future__ import annotations

import numpy as np
import pytest
from store_sizes import STORE_SIZES

from storage import Message, MessageStore, codec, transaction
from storage.message import GetStatus
from storage.properties import PROP_PRODUCER_GROUP, PROP_TRAN_MSG

TXN = {PROP_TRAN_MSG: "true", PROP_PRODUCER_GROUP: "pg"}


def wire(batch: codec.EncodedBatch) -> codec.EncodedBatch:
    return codec.EncodedBatch.from_bytes(batch.to_bytes())


def test_a_transactional_message_is_stored_as_a_half_message(store: MessageStore) -> None:
    batch = codec.encode_batch(
        [
            Message("Orders", b"plain", queue_id=2),
            Message("Orders", b"half", tags="T", keys="k1", properties=TXN, queue_id=3),
            Message("Orders", b"also-half", properties=TXN, queue_id=2, delay_level=2),
        ]
    )
    result = store.put_encoded(wire(batch))
    assert result.topics[int(result.topic_idx[0])] == "Orders"
    assert store.get("g", "Orders", 3, 0).status is not GetStatus.FOUND, "invisible there"
    plain = store.get("g", "Orders", 2, 0)
    assert [m.body for m in plain.messages] == [b"plain"]
    halves = store.get("g", transaction.HALF_TOPIC, 0, 0).messages
    assert [m.body for m in halves] == [b"half", b"also-half"]
    first = halves[0]
    assert first.properties["REAL_TOPIC"] == "Orders"
    assert first.properties["REAL_QID"] == "3"
    assert first.properties[PROP_PRODUCER_GROUP] == "pg"
    assert first.tags == "T" and list(first.keys) == ["k1"]
    assert transaction.transaction_type(first.sys_flag) == transaction.TRANSACTION_PREPARED_TYPE
    assert "DELAY" not in halves[1].properties, "a transactional message is not delayed"
    assert int(result.commitlog_offsets[1]) == first.commitlog_offset
    assert first.msg_id == batch.uniq_keys[1], "the half copy keeps its message id"
    assert transaction.transaction_type(plain.messages[0].sys_flag) == 0


@pytest.mark.parametrize("sizes", STORE_SIZES, indirect=True)
def test_an_idempotent_transactional_run_is_a_half_message_stored_once(
    store: MessageStore,
) -> None:
    batch = codec.encode_batch([Message("Orders", b"h%d" % i, properties=TXN) for i in range(3)])
    run = wire(batch.with_queue(1).with_sequence("p:1", 0, 0))
    first = store.put_encoded(run)
    again = store.put_encoded(run)  # a retry: answered with where it went
    assert again.commitlog_offsets.tolist() == first.commitlog_offsets.tolist()
    halves = store.get("g", transaction.HALF_TOPIC, 0, 0).messages
    assert [m.body for m in halves] == [b"h0", b"h1", b"h2"]
    assert all(m.properties["REAL_QID"] == "1" for m in halves)
    assert store.get("g", "Orders", 1, 0).status is not GetStatus.FOUND


def test_the_committed_copy_clears_the_transaction_properties(store: MessageStore) -> None:
    store.put_encoded(wire(codec.encode_batch([Message("Orders", b"x", properties=TXN)])))
    half = store.get("g", transaction.HALF_TOPIC, 0, 0).messages[0]
    real = transaction.committed(half)
    assert real.topic == "Orders" and real.queue_id == 0
    props = dict(real.properties or {})
    assert PROP_TRAN_MSG not in props and "REAL_TOPIC" not in props
    assert props["UNIQ_KEY"] == half.msg_id


def test_the_flag_travels_with_the_batch_in_every_kind_of_buffer_it_arrives_in() -> None:
    """The encoder flags a batch holding a transactional message in its head; merged
    calls keep it; a body that merely holds the same bytes is not flagged."""
    half = codec.encode_batch([Message("Orders", b"a"), Message("Orders", b"b", properties=TXN)])
    plain = codec.encode_batch([Message("Orders", b"TRAN_MSG true")])
    for batch, expected in ((half, True), (plain, False)):
        blob = batch.to_bytes()
        for buffer in (blob, memoryview(bytearray(blob)), np.frombuffer(blob, dtype=np.uint8)):
            got = transaction.may_hold_transactional(codec.EncodedBatch.from_bytes(buffer))
            assert got is expected, type(buffer)
        assert transaction.may_hold_transactional(batch) is expected
        merged = codec.EncodedBatch.concat([plain, batch])
        assert transaction.may_hold_transactional(merged) is expected
