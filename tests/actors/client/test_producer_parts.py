"""The producer's pieces that need no Ray: batching, queue patching, results."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from actors.client.encoder import MessageEncoder
from actors.client.send_result import BatchSendResult, SendStatus, _Chunk, _with_queue
from actors.config.client import ProducerConfig
from actors.protocol.wire import SendAck
from rebalance import MessageQueue
from storage import Message, encode_batch, transaction
from storage.codec import EncodedBatch, decode_records
from storage.errors import InvalidMessageError
from storage.message import PutStatus


def encoder(**options: int) -> MessageEncoder:
    return MessageEncoder(ProducerConfig(**options))  # type: ignore[arg-type]  # no cluster


def test_batches_respect_count_and_bytes() -> None:
    msgs = [Message("T", b"x" * 300) for _ in range(7)]
    assert encoder(max_batch_messages=3, max_batch_bytes=10_000)._cut(msgs, list(range(7))) == [
        [0, 1, 2],
        [3, 4, 5],
        [6],
    ]
    assert encoder(max_batch_messages=100, max_batch_bytes=1000)._cut(msgs, list(range(7))) == [
        [0, 1],
        [2, 3],
        [4, 5],
        [6],
    ]
    big = [Message("T", b"x" * 5000) for _ in range(2)]
    assert encoder(max_batch_bytes=1000)._cut(big, [0, 1]) == [[0], [1]]


def test_encode_takes_a_plain_batch_whole_and_cuts_the_rest() -> None:
    plain = [Message("T", b"p%03d" % i) for i in range(40)]
    (chunk,) = encoder().encode(plain)  # one pass, one chunk
    assert chunk.positions.tolist() == list(range(40))
    assert [m.body for m in decode_records(chunk.batch.data)] == [m.body for m in plain]
    # over max_batch_bytes once encoded, or over max_batch_messages: cut in order
    for options in ({"max_batch_bytes": 2_000}, {"max_batch_messages": 16}):
        chunks = encoder(**options).encode(plain)
        assert len(chunks) > 1
        assert np.concatenate([c.positions for c in chunks]).tolist() == list(range(40))
        got = [m.body for c in chunks for m in decode_records(c.batch.data)]
        assert got == [m.body for m in plain]
    # two topics: one chunk each, every message where it was
    mixed = [Message("A" if i % 3 else "B", b"m%d" % i) for i in range(30)]
    chunks = encoder().encode(mixed)
    assert sorted(c.topic for c in chunks) == ["A", "B"]
    for c in chunks:
        assert {mixed[i].topic for i in c.positions.tolist()} == {c.topic}


def test_with_queue_rebinds_the_batch_without_copying_records() -> None:
    # the store writes each record's QUEUEID from queue_ids (tests/storage/test_commitlog.py)
    for n in (3, 40):
        batch = encode_batch([Message("T", b"m%d" % i) for i in range(n)])
        patched = EncodedBatch.from_bytes(_with_queue(batch, 5))
        assert set(patched.queue_ids.tolist()) == {5}
        assert patched.data == batch.data
        assert [m.body for m in decode_records(patched.data)] == [b"m%d" % i for i in range(n)]


def test_batch_results_come_back_in_the_callers_order() -> None:
    batch = encode_batch([Message("T", b"a"), Message("T", b"b")])
    mq = MessageQueue("T", "broker-a", 1)
    ack = SendAck(
        PutStatus.PUT_OK, "broker-a", "10.0.0.1:10911", np.array([7, 8]), np.array([100, 200])
    )
    result = BatchSendResult([(_Chunk("T", batch, np.array([1, 0])), mq, ack)], 2)
    assert [r.queue_offset for r in result] == [8, 7]
    assert result[1].msg_id == batch.uniq_keys[0] and result[0].status is SendStatus.SEND_OK
    assert result[1].offset_msg_id.endswith(f"{100:016X}")
    assert result.queues == [(mq, 7, 2)]


def test_a_kept_batch_result_lets_the_records_go() -> None:
    """Callers keep results (a list of futures, an audit log): a result holds the
    message ids and offsets, never the encoded records it was sent from."""
    sent = encode_batch([Message("T", b"x" * 1000) for _ in range(3)])
    blob = np.frombuffer(sent.to_bytes(), dtype=np.uint8).copy()
    records = weakref.ref(blob)  # the buffer the batch's records are a view of
    batch = EncodedBatch.from_bytes(blob)
    del blob
    ack = SendAck(
        PutStatus.PUT_OK, "broker-a", "10.0.0.1:10911", np.arange(3), np.array([0, 1100, 2200])
    )
    mq = MessageQueue("T", "broker-a", 0)
    result = BatchSendResult([(_Chunk("T", batch, np.arange(3)), mq, ack)], 3)
    keys = list(batch.uniq_keys)
    del batch
    gc.collect()
    assert records() is None
    assert [r.msg_id for r in result] == keys
    assert [r.queue_offset for r in result] == [0, 1, 2]


@pytest.mark.parametrize(
    "topic", [transaction.HALF_TOPIC, transaction.OP_HALF_TOPIC, transaction.CHECK_MAX_TOPIC]
)
def test_the_transaction_topics_take_no_sends(topic: str) -> None:
    with pytest.raises(InvalidMessageError, match="reserved for the system"):
        encoder().encode([Message(topic, b"x")])
