"""A single send's put and a held pull's read take scalar paths (``_append_one``,
``_get_few``): they leave the same files and give the same answers as the array paths."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage import InvalidMessageError, Message, MessageStore, codec
from storage._fast_encode import encode_plain
from storage.codec import EncodedBatch
from storage.schedule import SCHEDULE_TOPIC
from storage.seq_slots import seq_slot
from storage.transaction import HALF_TOPIC

NOW_S = 1_700_000_000.0  # one store timestamp for every put: nothing then differs
BORN_MS = 1_600_000_000_000
MIN_HASH_KEY = "peszbcyjk"  # "One#peszbcyjk".hashCode() is Integer.MIN_VALUE: indexed as 0


def message(i: int) -> Message:
    """Two topics, three queues, keys or none, bodies that roll 64 KiB files."""
    return Message(
        "One" if i % 4 else "Other",
        bytes([i % 251]) * (20 + (i * 397) % 3000),
        tags=f"t{i % 2}",
        keys=([f"k{i % 5}", f"u{i}"] + ([MIN_HASH_KEY] if i % 7 == 1 else [])) if i % 3 else [],
        properties={codec.PROP_UNIQ_KEY: f"ID{i:030d}"},
        queue_id=i % 3,
    )


def wire(i: int) -> EncodedBatch:
    """Message ``i`` alone as a broker receives it; every fifth from an idempotent
    producer (numbered on its queue)."""
    batch = codec.encode_batch([message(i)], born_timestamp=BORN_MS)
    if i % 5 == 0:  # numbered from 0 on each of its queues
        m = message(i)
        seq = sum(1 for j in range(0, i, 5) if (message(j).topic, j % 3) == (m.topic, m.queue_id))
        batch = batch.with_sequence("producer-1", 0, seq, m.queue_id)
    return EncodedBatch.from_bytes(batch.to_bytes())


def files_under(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def two_stores(
    tmp_path: Path, make_config: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[MessageStore, MessageStore]]:
    """A store on the scalar paths and one on the array paths (``_append_many``,
    ``get_raw``'s general read), same clock."""
    scalar = MessageStore(
        make_config(tmp_path / "scalar"), clock=lambda: NOW_S, start_services=False
    )
    arrays = MessageStore(
        make_config(tmp_path / "arrays"), clock=lambda: NOW_S, start_services=False
    )
    monkeypatch.setattr(arrays, "_append_one", arrays._append_many)
    monkeypatch.setattr(arrays, "_get_few", lambda *args: None)
    try:
        yield scalar, arrays
    finally:
        scalar.close()
        arrays.close()


def test_single_puts_write_the_same_bytes_entries_and_keys(
    two_stores: tuple[MessageStore, MessageStore],
) -> None:
    scalar, arrays = two_stores
    calls = []
    real = scalar._append_one
    scalar._append_one = lambda batch: calls.append(1) or real(batch)  # type: ignore[method-assign]
    n = 90  # rolls the 64 KiB CommitLog files and the 64-entry ConsumeQueue files
    results = [[s.put_encoded(wire(i)) for i in range(n)] for s in (scalar, arrays)]
    assert len(calls) == n
    for a, b in zip(*results):
        assert (a.status, a.queue_offsets.tolist(), a.commitlog_offsets.tolist()) == (
            b.status,
            b.queue_offsets.tolist(),
            b.commitlog_offsets.tolist(),
        )
    assert scalar.commitlog.max_offset == arrays.commitlog.max_offset
    assert len(scalar.commitlog.files) > 2
    assert scalar.queues() == arrays.queues()
    for topic in ("One", "Other"):
        for key in [f"k{j}" for j in range(5)] + ["u7", "u8", MIN_HASH_KEY]:
            found = [[m.commitlog_offset for m in s.query_by_key(topic, key)] for s in two_stores]
            assert found[0] == found[1]
    assert scalar.query_by_key("One", "u7")  # the keys were indexed at all
    assert len(scalar.query_by_key("One", MIN_HASH_KEY, 100)) == sum(
        1 for i in range(n) if i % 3 and i % 7 == 1 and message(i).topic == "One"
    )
    scalar.flush()
    arrays.flush()
    for part in ("commitlog", "consumequeue"):
        assert files_under(scalar.root / part) == files_under(arrays.root / part)
    indexes = [sorted(files_under(s.root / "index").values()) for s in two_stores]
    assert indexes[0] == indexes[1]
    # a retry of an idempotent send is answered from the producer table, not written again
    again = [s.put_encoded(wire(10)) for s in two_stores]
    for retry in again:
        assert retry.commitlog_offsets.tolist() == results[0][10].commitlog_offsets.tolist()
    assert scalar.commitlog.max_offset == arrays.commitlog.max_offset


def sent(i: int) -> bytes:
    """Message ``i`` alone as a producer sends it: every fifth numbered as an idempotent
    producer's encoder numbers it (``encode_plain`` with its sequence slot, the mark
    ``parse_send`` looks for), the others as :func:`wire` encodes them."""
    if i % 5:
        return wire(i).to_bytes()
    m = message(i)
    m = Message(m.topic, m.body, tags=m.tags, keys=m.keys[:1], queue_id=m.queue_id)
    seq = sum(1 for j in range(0, i, 5) if (message(j).topic, j % 3) == (m.topic, m.queue_id))
    born = codec.host_to_bytes("127.0.0.1:1")
    batch = encode_plain([m], 4 << 20, BORN_MS, born, codec.UniqueKeyGenerator(), SLOT)
    assert batch is not None
    return batch.with_sequence("producer-1", 0, seq, m.queue_id).to_bytes()


SLOT = seq_slot("producer-1")


def put_as_a_broker(store: MessageStore, blob: bytes, taken: list[int]) -> tuple[int, int]:
    """A send stored as the broker's data path stores it: in plain values where
    ``put_one_send`` takes it (counted in ``taken``), else as its batch."""
    one = codec.parse_send_one(blob)
    if isinstance(one, codec.OneSend):
        at = store.put_one_send(one)
        if at is not None:
            taken.append(1)
            return at
        one = EncodedBatch.from_bytes(blob)
    result = store.put_encoded(one)
    return int(result.queue_offsets[0]), int(result.commitlog_offsets[0])


def test_single_sends_put_in_plain_values_write_what_batches_write(
    two_stores: tuple[MessageStore, MessageStore],
) -> None:
    plain, arrays = two_stores
    taken: list[int] = []
    n = 90  # rolls the 64 KiB CommitLog files and the 64-entry ConsumeQueue files
    blobs = [sent(i) for i in range(n)]
    got = [put_as_a_broker(plain, blob, taken) for blob in blobs]
    want = [arrays.put_encoded(EncodedBatch.from_bytes(blob)) for blob in blobs]
    assert got == [(int(r.queue_offsets[0]), int(r.commitlog_offsets[0])) for r in want]
    # most: not the records whose files roll (CommitLog, queue, the small index files)
    # nor each idempotent queue's first run (its numbering is new to the table)
    assert n // 2 < len(taken) < n
    # every run numbered on ("One", 0) was learned, in plain values or not
    on_one_0 = sum(1 for i in range(0, n, 5) if (message(i).topic, i % 3) == ("One", 0))
    assert plain.producers.is_next("producer-1", 0, "One", 0, on_one_0)
    assert plain.queues() == arrays.queues()
    for topic in ("One", "Other"):
        for key in [f"k{j}" for j in range(5)] + ["u7", "u8", MIN_HASH_KEY]:
            found = [[m.commitlog_offset for m in s.query_by_key(topic, key)] for s in two_stores]
            assert found[0] == found[1]
    plain.flush()
    arrays.flush()
    for part in ("commitlog", "consumequeue"):
        assert files_under(plain.root / part) == files_under(arrays.root / part)
    indexes = [sorted(files_under(s.root / "index").values()) for s in two_stores]
    assert indexes[0] == indexes[1]
    # the producer table learned every run: a retry is answered where it was stored,
    # and the next number on that queue is taken in plain values again
    end = plain.commitlog.max_offset
    assert put_as_a_broker(plain, blobs[85], taken) == got[85]
    assert plain.commitlog.max_offset == end
    m = message(85)
    seq = sum(1 for j in range(0, 86, 5) if (message(j).topic, j % 3) == (m.topic, m.queue_id))
    born = codec.host_to_bytes("127.0.0.1:1")
    following = encode_plain(
        [Message(m.topic, b"next", queue_id=m.queue_id)],
        4 << 20,
        BORN_MS,
        born,
        codec.UniqueKeyGenerator(),
        SLOT,
    )
    assert following is not None
    before = len(taken)
    put_as_a_broker(
        plain, following.with_sequence("producer-1", 0, seq, m.queue_id).to_bytes(), taken
    )
    assert len(taken) == before + 1 and plain.commitlog.max_offset > end
    assert plain.producers.is_next("producer-1", 0, m.topic, m.queue_id, seq + 1)


def test_a_single_send_the_plain_put_leaves_or_refuses_writes_nothing(
    tmp_path: Path, make_config: Callable[..., object]
) -> None:
    store = MessageStore(make_config(tmp_path / "s", max_message_size=64), start_services=False)
    try:

        def one(topic: str, body: bytes) -> codec.OneSend:
            got = codec.parse_send_one(codec.encode_batch([Message(topic, body)]).to_bytes())
            assert isinstance(got, codec.OneSend)
            return got

        for reserved in (SCHEDULE_TOPIC, HALF_TOPIC):
            assert store.put_one_send(one(reserved, b"x")) is None
        with pytest.raises(InvalidMessageError, match="max_message_size=64"):
            store.put_one_send(one("Big", b"x" * 65))
        assert store.commitlog.max_offset == 0 and store.queues() == []
        # what is not a single plain record comes back as its batch
        two = codec.encode_batch([Message("T", b"1"), Message("T", b"2")]).to_bytes()
        delayed = codec.encode_batch([Message("T", b"1", delay_level=2)]).to_bytes()
        for blob in (two, delayed):
            assert isinstance(codec.parse_send_one(blob), EncodedBatch)
        with pytest.raises(InvalidMessageError):  # damaged: the batch's error
            codec.parse_send_one(codec.encode_batch([Message("T", b"1")]).to_bytes()[:-1])
    finally:
        store.close()


@pytest.mark.parametrize("view", [False, True])
def test_reads_of_a_queue_tail_give_the_same_answers(
    two_stores: tuple[MessageStore, MessageStore], view: bool
) -> None:
    scalar, arrays = two_stores
    answered: list[bool] = []
    real = scalar._get_few

    def counted(*args: object) -> object:
        got = real(*args)  # type: ignore[arg-type]
        answered.append(got is not None)
        return got

    scalar._get_few = counted  # type: ignore[method-assign]
    for i in range(90):
        for s in two_stores:
            s.put_encoded(wire(i))
    # queue 0 of "One" holds records apart (the others' are between them); a batch of
    # four is one run of records
    together = codec.encode_batch(
        [Message("One", b"r%d" % j, queue_id=1) for j in range(4)], born_timestamp=BORN_MS
    )
    for s in two_stores:
        s.put_encoded(EncodedBatch.from_bytes(together.to_bytes()))
    for topic, qid in scalar.queues():
        top = scalar.max_offset(topic, qid)
        for offset in range(max(0, top - codec.SMALL_BATCH - 2), top + 2):
            for max_count in (1, 2, 32):
                got = [s.get_raw("g", topic, qid, offset, max_count, view=view) for s in two_stores]
                a, b = got
                assert (a.status, a.count, a.next_offset, a.min_offset, a.max_offset) == (
                    b.status,
                    b.count,
                    b.next_offset,
                    b.min_offset,
                    b.max_offset,
                ), (topic, qid, offset, max_count)
                assert bytes(a.data) == bytes(b.data)
                assert (a.sizes is None and b.sizes is None) or a.sizes.tolist() == b.sizes.tolist()
                assert isinstance(a.data, memoryview) == isinstance(b.data, memoryview)
    assert sum(answered) > 50 and not all(answered)  # scalar where it can, else arrays
    decoded = scalar.get("g", "One", 1, scalar.max_offset("One", 1) - 4, 32)
    assert [m.body for m in decoded.messages] == [b"r0", b"r1", b"r2", b"r3"]


@pytest.mark.parametrize("body_len", [100, 15 << 10, 16 << 10, 200 << 10])
@pytest.mark.parametrize("keyed", [False, True])
def test_a_lone_messages_wire_is_the_batchs_and_shares_nothing_writable(
    body_len: int, keyed: bool
) -> None:
    """A lone message's encode shares read-only arrays between batches and its wire is
    one joined buffer up to 16 KiB: the same bytes as the parts of any other batch, read
    back as the same batch, bound and numbered the same; nothing one batch holds can be
    written through another."""
    gen = codec.UniqueKeyGenerator()
    born = codec.host_to_bytes("127.0.0.1:1")

    def encoded(tags: str) -> EncodedBatch:
        m = Message("One", b"b" * body_len, tags=tags, keys="order-1" if keyed else None)
        got = encode_plain([m], 4 << 20, BORN_MS, born, gen, seq_slot("producer-1"))
        assert got is not None
        return got

    a, b = encoded("red"), encoded("blue")
    for arr in (a.topic_idx, a.key_owner, a.tag_codes):
        with pytest.raises(ValueError, match="read-only"):
            arr[0] = 7
    assert a.tag_codes.tolist() == [codec.java_hash("red")]
    assert b.tag_codes.tolist() == [codec.java_hash("blue")]
    assert a.key_owner.tolist() == ([0, 0] if keyed else [0])
    bound = a.with_sequence("producer-1", 3, 41, 2)
    parts = EncodedBatch.wire_parts([bound])
    assert len(parts) == (1 if len(bound.data) <= 16 << 10 else 13)
    assert len(parts) == (1 if body_len < 16 << 10 else 13)  # the record's head counts
    blob = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    assert blob == bound.to_bytes()
    back = EncodedBatch.from_bytes(blob)
    assert back.queue_ids.tolist() == [2]
    assert back.producer_epoch == 3 and back.seq_runs is not None
    assert back.seq_runs.tolist() == [[0, 41]]
    assert back.tag_codes.tolist() == [codec.java_hash("red")]
    assert bytes(back.data) == bytes(bound.data)
    # two lone sends merged in one call still carry their own records and numbers
    merged = EncodedBatch.from_bytes(
        EncodedBatch.wire_of([bound, b.with_sequence("producer-1", 3, 42, 2)])
    )
    assert merged.tag_codes.tolist() == [codec.java_hash("red"), codec.java_hash("blue")]
    assert merged.seq_runs is not None and merged.seq_runs[:, 1].tolist() == [41, 42]
