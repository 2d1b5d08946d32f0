"""The store's half copies built from the records' bytes (``transaction.half_copies``)
are exactly what decoding the records and encoding ``to_half``'s messages gives
(``MessageStore._reencoded_copies``): every byte and every per-record array; batches
that path treats its own way (delayed, timer, odd properties) are left to it."""

from __future__ import annotations

import random
import struct
import time

import numpy as np
import pytest

from storage import Message, MessageStore, codec, transaction
from storage.errors import ProducerFencedError
from storage.message import GetStatus, MessageExt
from storage.properties import PROP_PRODUCER_GROUP, PROP_TRAN_MSG

TXN = {PROP_TRAN_MSG: "true", PROP_PRODUCER_GROUP: "pg"}


def wire(batch: codec.EncodedBatch) -> codec.EncodedBatch:
    return codec.EncodedBatch.from_bytes(batch.to_bytes())


def assert_same(fast: codec.EncodedBatch | None, slow: codec.EncodedBatch) -> None:
    assert fast is not None, "the byte-level path declined a batch it should build"
    assert bytes(fast.data) == bytes(slow.data)
    for name in ("sizes", "topic_idx", "queue_ids", "tag_codes", "key_hashes", "key_owner"):
        a, b = getattr(fast, name), getattr(slow, name)
        assert a.dtype == b.dtype and a.tolist() == b.tolist(), name
    assert fast.topics == slow.topics
    assert list(fast.uniq_keys) == list(slow.uniq_keys)
    assert fast.delay_levels is None and slow.delay_levels is None
    assert (fast.transactional, fast.timer) == (slow.transactional, slow.timer)
    assert fast.producer_id is None and slow.producer_id is None
    assert fast.checked


def random_message(rng: random.Random, i: int) -> Message:
    props: dict[str, str] = {}
    if rng.random() < 0.7:
        props.update(TXN)
    for j in range(rng.randrange(4)):
        props[rng.choice(["u", "ü名", "k-", "REAL_QID", "REAL_TOPIC", "x"]) + str(j)] = rng.choice(
            ["v", "välue ☃", "", "1 2", "a" * rng.randrange(200)]
        )
    if rng.random() < 0.1:
        props["REAL_QID"] = "stale"  # re-set in place by to_half
    if rng.random() < 0.1:
        props["REAL_TOPIC"] = "Stale"  # moved to the end by to_half
    if rng.random() < 0.2:
        props["__TXN_PRODUCER__"], props["__TXN_EPOCH__"] = "tp", "3"
    keys = rng.choice([(), "k", ("a", "b", "c"), ("ключ", f"id{i}")])
    body = rng.choice([b"x", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))])
    return Message(
        rng.choice(["Orders", "T-%|x", "A" * 127]),
        body,
        tags=rng.choice([None, "T", "tág"]),
        keys=keys,
        properties=props or None,
        queue_id=rng.randrange(8),
        flag=rng.choice([0, 7, -1]),
    )


def test_half_copies_equal_the_reencoded_ones_byte_for_byte(store: MessageStore) -> None:
    rng = random.Random(24)
    fences = transaction.TransactionalFences()
    built = marked = 0
    for n in (1, 2, 3, 17, 40, 100):
        for _ in range(6):
            msgs = [random_message(rng, i) for i in range(n)]
            if not any(m.properties and m.properties.get(PROP_TRAN_MSG) for m in msgs):
                continue
            batch = codec.encode_batch(msgs, born_host=f"10.0.0.{n}:{40000 + n}", reconsume_times=0)
            batch = wire(batch)
            if rng.random() < 0.3:  # an idempotent producer's run: PRODUCER_SEQ marked
                batch = batch.with_queue(rng.randrange(4)).with_sequence("p:1", 0, 7)
                marked += b"PRODUCER_SEQ" in bytes(batch.data)
            assert_same(transaction.half_copies(batch, fences), store._reencoded_copies(batch))
            built += 1
    assert built > 20 and marked > 3


@pytest.mark.parametrize(
    "props",
    [  # UNIQ_KEY first; tags in the middle, KEYS and UNIQ_KEY last (one head rebuilt);
        # a user's property whose name ends with PRODUCER_SEQ (a batch that numbers no run
        # may not carry PRODUCER_SEQ itself: EncodedBatch.check_structure refuses it)
        b"UNIQ_KEY\x01AC1100010001000000000000000000AB\x02KEYS\x01k1  k2\x02PGROUP\x01pg\x02"
        b"TRAN_MSG\x01true\x02TAGS\x01t\x02MY_PRODUCER_SEQ\x01x\x02z\x01last\x02",
        b"PGROUP\x01pg\x02TAGS\x01t\x02TRAN_MSG\x01true\x02REAL_QID\x01old\x02DELAY\x010\x02"
        b"KEYS\x01 k1 k2 \x02UNIQ_KEY\x01AC1100010001000000000000000000AB\x02",
    ],
)
def test_a_foreign_property_order_and_store_fields_give_the_same_copy(
    store: MessageStore, props: bytes
) -> None:
    """A record written by another encoder (its own property order, KEYS with extra
    spaces, store-side fields and client SYSFLAG bits set) is rebuilt as re-encoding
    rebuilds it."""
    body, topic = b"payload", b"Orders"
    size = codec.FIXED_LEN - 1 + len(body) + 1 + len(topic) + len(props)
    head = codec.HEADER.pack(
        size, codec.MAGIC, codec.crc32(body) & 0x7FFFFFFF, 9, 3, 77, 88, 0x2, 1_700_000_000_000,
        bytes([10, 9, 8, 7]) + (65000).to_bytes(4, "big"), 99, b"\x01" * 8, 4, 55, len(body),
    )  # fmt: skip
    record = head + body + bytes([len(topic)]) + topic + struct.pack(">H", len(props)) + props
    plain = codec.encode_batch([Message("Other", b"p", tags="T", keys="k", queue_id=1)])
    batch = codec.EncodedBatch(
        data=record + bytes(plain.data),
        sizes=np.array([size, int(plain.sizes[0])], dtype=np.int32),
        topics=("Orders", "Other"),
        topic_idx=np.array([0, 1], dtype=np.int16),
        queue_ids=np.array([5, 1], dtype=np.int32),
        tag_codes=np.array([codec.java_hash("t"), codec.java_hash("T")], dtype=np.int64),
        key_hashes=np.zeros(0, dtype=np.int32),
        key_owner=np.zeros(0, dtype=np.int32),
        uniq_keys=("AC1100010001000000000000000000AB", plain.uniq_keys[0]),
        transactional=True,
    )
    batch.check_structure()
    fast = transaction.half_copies(batch, transaction.TransactionalFences())
    assert_same(fast, store._reencoded_copies(batch))
    assert fast is not None and fast.topics == (transaction.HALF_TOPIC, "Other")


@pytest.mark.parametrize(
    "message",
    [
        Message("Orders", b"d", properties=TXN, delay_level=0),  # control: built
        Message("Orders", b"d", properties={**TXN, "TIMER_DELAY_SEC": "5"}),
    ],
)
def test_batches_with_timer_or_delayed_messages_take_the_reencoding_path(
    store: MessageStore, message: Message
) -> None:
    delayed = Message("Orders", b"late", delay_level=2)
    fences = transaction.TransactionalFences()
    with_delay = wire(codec.encode_batch([message, delayed]))
    assert transaction.half_copies(with_delay, fences) is None
    alone = wire(codec.encode_batch([message]))
    got = transaction.half_copies(alone, fences)
    if alone.timer:
        assert got is None
    else:
        assert_same(got, store._reencoded_copies(alone))


def test_a_fenced_producer_is_refused_and_nothing_is_written(store: MessageStore) -> None:
    fenced = {**TXN, "__TXN_PRODUCER__": "tp", "__TXN_EPOCH__": "1"}
    store.txn_fences.raise_fence("tp", 2)
    batch = wire(codec.encode_batch([Message("Orders", b"a", properties=TXN),
                                     Message("Orders", b"b", properties=fenced)]))  # fmt: skip
    with pytest.raises(ProducerFencedError):
        transaction.half_copies(batch, store.txn_fences)
    with pytest.raises(ProducerFencedError):
        store.put_encoded(batch)
    assert store.get("g", transaction.HALF_TOPIC, 0, 0).status is not GetStatus.FOUND


def test_the_store_round_trip_through_the_byte_level_copy(store: MessageStore) -> None:
    """Put (byte-level half copies), read the halves, commit them: the messages a
    consumer reads are the ones sent, with their ids, tags, keys and properties."""
    sent = [
        Message(
            "Orders",
            b"m%d" % i,
            tags=f"T{i % 3}",
            keys=(f"k{i}", "all"),
            properties={**TXN, "user": f"ü{i}"},
            queue_id=i % 2,
        )
        for i in range(30)
    ] + [Message("Orders", b"plain", queue_id=3)]
    batch = wire(codec.encode_batch(sent, born_host="10.0.0.9:1234"))
    assert transaction.half_copies(batch, store.txn_fences) is not None
    store.put_encoded(batch)
    halves = store.get("g", transaction.HALF_TOPIC, 0, 0, max_count=64).messages
    assert [m.body for m in halves] == [m.body for m in sent[:30]]
    assert [m.msg_id for m in halves] == list(batch.uniq_keys[:30])
    assert all(
        transaction.transaction_type(m.sys_flag) == transaction.TRANSACTION_PREPARED_TYPE
        for m in halves
    )
    assert [m.body for m in store.get("g", "Orders", 3, 0).messages] == [b"plain"]
    store.put_batch([transaction.committed(h) for h in halves])
    for qid in (0, 1):
        got = store.get("g", "Orders", qid, 0, max_count=64).messages
        want = [m for m in sent[:30] if m.queue_id == qid]
        assert [m.body for m in got] == [m.body for m in want]
        assert [m.tags for m in got] == [m.tags for m in want]
        assert [list(m.keys) for m in got] == [list(m.keys) for m in want]
        assert [m.properties["user"] for m in got] == [m.properties["user"] for m in want]  # type: ignore[index]
        assert all(PROP_TRAN_MSG not in m.properties for m in got)
    # the keys are indexed under the half topic, then under the real one
    for topic in (transaction.HALF_TOPIC, "Orders"):
        deadline = time.monotonic() + 10
        while len(store.query_by_key(topic, "all")) < 30 and time.monotonic() < deadline:
            time.sleep(0.01)  # the index is fed by the dispatcher
        assert len(store.query_by_key(topic, "all")) == 30, topic


def reencoded_commit(halves: list[MessageExt]) -> codec.EncodedBatch:
    """What the broker's commit wrote before ``committed_copies`` (and still writes
    when it declines): ``committed``'s messages encoded, SYSFLAG COMMIT."""
    batch = codec.encode_batch(
        [transaction.committed(h) for h in halves],
        born=[(h.born_timestamp, h.born_host, h.reconsume_times) for h in halves],
    )
    return transaction.with_transaction_type(
        batch, list(range(len(halves))), transaction.TRANSACTION_COMMIT_TYPE
    )


def test_committed_copies_equal_the_reencoded_ones_byte_for_byte(store: MessageStore) -> None:
    rng = random.Random(25)
    sent = [m for m in (random_message(rng, i) for i in range(400)) if m.properties]
    sent = [m for m in sent if m.properties and m.properties.get(PROP_TRAN_MSG)][:60]
    for start in range(0, len(sent), 30):
        store.put_encoded(wire(codec.encode_batch(sent[start : start + 30], reconsume_times=2)))
    halves = store.get("g", transaction.HALF_TOPIC, 0, 0, max_count=64).messages
    assert len(halves) == len(sent)
    # a half message put back by a check carries its check count (a copy of its own)
    store.put_batch([transaction.checked_again(halves[0])])
    again = store.get("g", transaction.HALF_TOPIC, 0, len(halves)).messages
    halves += again
    for group in ([halves[0]], [halves[-1]], halves[1:30], halves):
        assert_same(transaction.committed_copies(group), reencoded_commit(group))
    # the committed copies put and read back are the messages sent
    store.put_encoded(transaction.committed_copies(halves[:40]))  # type: ignore[arg-type]
    for qid in range(8):
        got = store.get("g", "Orders", qid, 0, max_count=64).messages
        want = [m for m in sent[:40] if m.topic == "Orders" and m.queue_id == qid]
        assert [m.body for m in got] == [m.body for m in want]
        assert [m.tags for m in got] == [m.tags for m in want]
        assert all(m.reconsume_times == 2 for m in got)
        assert all(
            transaction.transaction_type(m.sys_flag) == transaction.TRANSACTION_COMMIT_TYPE
            for m in got
        )


def test_a_half_message_with_odd_properties_is_left_to_the_reencoding_commit(
    store: MessageStore,
) -> None:
    store.put_batch(
        [
            Message(transaction.HALF_TOPIC, b"a", properties={"REAL_TOPIC": "Orders"}),
            Message(transaction.HALF_TOPIC, b"b", properties={"REAL_TOPIC": "O", "REAL_QID": "x"}),
            Message(transaction.HALF_TOPIC, b"c", properties={"REAL_TOPIC": "O", "REAL_QID": "1"}),
        ]
    )
    no_qid, bad_qid, good = store.get("g", transaction.HALF_TOPIC, 0, 0).messages
    assert transaction.committed_copies([good, no_qid]) is None
    assert transaction.committed_copies([bad_qid]) is None
    assert_same(transaction.committed_copies([good]), reencoded_commit([good]))


def records_of(store: MessageStore, halves: list[MessageExt]) -> tuple[bytes, list[int]]:
    """The stored records of ``halves``, read as the broker's commit reads them."""
    offsets = np.array([h.commitlog_offset for h in halves], dtype=np.int64)
    sizes = [store.commitlog.size_at(int(o)) for o in offsets]
    return store.commitlog.read_runs(offsets, np.array(sizes, dtype=np.int64)), sizes


def test_half_records_walked_undecoded_give_the_decoded_commit_byte_for_byte(
    store: MessageStore,
) -> None:
    """The commit of a multi-message transaction reads its half messages' records and
    builds their committed copies without decoding them (``HalfRecords``): the same
    bytes and arrays as ``committed_copies`` of the decoded messages, for any subset in
    any order; each record's queue offset and transaction id as stored; a record that is
    not a half message, or a truncated run, is left to the decoding path (None)."""
    rng = random.Random(26)
    sent = [m for m in (random_message(rng, i) for i in range(400)) if m.properties]
    sent = [m for m in sent if m.properties and m.properties.get(PROP_TRAN_MSG)][:60]
    for i, m in enumerate(sent):  # two transactions' marks, interleaved with none
        if i % 3:
            m.properties[transaction.PROP_GLOBAL_TXN] = f"txn-{i % 3}"  # type: ignore[index]
    for start in range(0, len(sent), 30):
        store.put_encoded(wire(codec.encode_batch(sent[start : start + 30], reconsume_times=1)))
    halves = store.get("g", transaction.HALF_TOPIC, 0, 0, max_count=64).messages
    assert len(halves) == len(sent)
    data, sizes = records_of(store, halves)
    records = transaction.HalfRecords.read(data, sizes)
    assert records is not None
    assert records.queue_offsets == [h.queue_offset for h in halves]
    assert records.txn_ids == [transaction.global_txn(h) for h in halves]
    for picked in ([0], [len(halves) - 1], list(range(1, 30)), [5, 2, 40, 2][:3], []):
        want = [halves[i] for i in picked]
        got = records.committed(picked)
        if not picked:
            assert got is None and transaction.committed_copies(want) is None
        else:
            assert_same(got, transaction.committed_copies(want) or reencoded_commit(want))
    # a plain record among them, or a run cut short: the decoder's turn
    [plain] = store.put_batch([Message("Orders", b"plain")])
    off = np.array([halves[0].commitlog_offset, plain.commitlog_offset], dtype=np.int64)
    sz = [store.commitlog.size_at(int(o)) for o in off]
    assert transaction.HalfRecords.read(store.commitlog.read_runs(off, np.array(sz)), sz) is None
    assert transaction.HalfRecords.read(data[:-1], sizes) is None
    assert transaction.HalfRecords.read(data, [s + 1 for s in sizes]) is None


@pytest.mark.parametrize("tags", [None, "t"])
def test_a_transactions_batch_sharing_one_head_copies_as_the_reencoding_path(
    store: MessageStore, tags: str | None
) -> None:
    """A transaction's batch (its records share one properties head: the marks) takes
    the shortcut past the head seen last: half copies and committed copies are still
    byte for byte what re-encoding writes, with an idempotent producer's PRODUCER_SEQ on
    the first record and a record with keys among them (each of those goes the long
    way)."""
    marks = {PROP_TRAN_MSG: "true", PROP_PRODUCER_GROUP: "pg", transaction.PROP_GLOBAL_TXN: "t1"}
    msgs = [Message("Orders", b"body-%d" % i, tags=tags, properties=marks) for i in range(60)]
    msgs[40] = Message("Orders", b"keyed", tags=tags, keys=("a", "b"), properties=marks)
    batch = codec.encode_batch(msgs, born_host="10.0.0.9:9")
    fences = transaction.TransactionalFences()
    for b in (wire(batch.with_queue(3)), wire(batch.with_queue(1).with_sequence("p:1", 0, 7))):
        assert_same(transaction.half_copies(b, fences), store._reencoded_copies(b))
    store.put_encoded(wire(batch.with_queue(2)))
    halves = store.get("g", transaction.HALF_TOPIC, 0, 0, max_count=64).messages
    assert len(halves) == 60
    assert_same(transaction.committed_copies(halves), reencoded_commit(halves))
    data, sizes = records_of(store, halves)
    records = transaction.HalfRecords.read(data, sizes)
    assert records is not None
    assert_same(records.committed(list(range(60))), reencoded_commit(halves))
    # stored by an idempotent producer (every one's default): the first half message
    # carries the run's PRODUCER_SEQ after its UNIQ_KEY, which no committed copy keeps;
    # the walk still takes the whole run (it declined it before, and a commit of 100
    # then decoded every record)
    store.put_encoded(wire(batch.with_queue(0).with_sequence("p:2", 0, 0)))
    numbered: list[MessageExt] = []
    while len(numbered) < 60:  # a get answers a few of them at a time
        got = store.get("g", transaction.HALF_TOPIC, 0, 60 + len(numbered), max_count=64)
        assert got.messages
        numbered += got.messages
    assert len(numbered) == 60 and "PRODUCER_SEQ" in numbered[0].properties
    data, sizes = records_of(store, numbered)
    records = transaction.HalfRecords.read(data, sizes)
    assert records is not None
    assert_same(records.committed(list(range(60))), reencoded_commit(numbered))
