"""The record layout, hashing and ids, byte for byte."""

from __future__ import annotations

import contextlib
import random
import struct
import types
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import InvalidMessageError, Message, StoreCorruptedError, codec


def reference_java_hash(s: str) -> int:
    data = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) % (1 << 32)
    return h - (1 << 32) if h >= 1 << 31 else h


def test_java_hash_known_values() -> None:
    assert codec.java_hash("TagA") == 2598919
    assert codec.java_hash("topic#key1") == -889947002
    assert codec.java_hash("") == 0
    assert codec.java_hash("😀") == reference_java_hash("😀")


@settings(max_examples=200)
@given(st.lists(st.text(), max_size=20))
def test_java_hashes_match_java_for_any_unicode(strings: list[str]) -> None:
    expected = [reference_java_hash(s) for s in strings]
    assert [codec.java_hash(s) for s in strings] == expected
    assert codec.java_hashes(strings).tolist() == expected


@settings(max_examples=100)
@given(
    st.text(max_size=12),
    st.integers(0, 40),
    st.lists(st.binary(min_size=40, max_size=40), min_size=1, max_size=8),
)
def test_prefixed_hashes_of_fixed_width_rows_match_java(
    prefix: str, width: int, rows: list[bytes]
) -> None:
    chars = np.array([[32 + b % 95 for b in row[:width]] for row in rows], dtype=np.uint8)
    chars = chars.reshape(len(rows), width)
    expected = [reference_java_hash(prefix + bytes(r).decode("ascii")) for r in chars]
    assert codec.prefixed_java_hashes(prefix, chars).tolist() == expected


def test_concatenated_batches_keep_each_records_topic_queue_keys_and_delay() -> None:
    a = codec.encode_batch(
        [Message("A", b"x", keys=["k1", "k2"]), Message("A", b"y", tags="t")]
    ).with_queue(1)
    b = codec.encode_batch([Message("B", b"z", keys="k3", delay_level=2)]).with_queue(3)
    whole = codec.EncodedBatch.from_bytes(codec.EncodedBatch.concat([a, b]).to_bytes())
    assert [whole.topics[i] for i in whole.topic_idx] == ["A", "A", "B"]
    assert whole.queue_ids.tolist() == [1, 1, 3]
    assert bytes(whole.data) == bytes(a.data) + bytes(b.data)
    assert whole.key_hashes.tolist() == a.key_hashes.tolist() + b.key_hashes.tolist()
    assert whole.key_owner.tolist() == a.key_owner.tolist() + (b.key_owner + 2).tolist()
    assert list(whole.uniq_keys) == list(a.uniq_keys) + list(b.uniq_keys)
    assert whole.tag_codes.tolist() == a.tag_codes.tolist() + b.tag_codes.tolist()
    assert whole.delay_levels is not None and whole.delay_levels.tolist() == [0, 0, 2]
    # a send lane's one-copy blob is the same bytes
    assert codec.EncodedBatch.wire_of([a, b]) == codec.EncodedBatch.concat([a, b]).to_bytes()
    assert codec.EncodedBatch.wire_of([a]) == a.to_bytes()


def test_record_layout_is_rocketmq_v1() -> None:
    msg = Message(
        "TopicA",
        b"hello",
        tags="TagA",
        keys=["k1", "k2"],
        flag=7,
        queue_id=3,
        properties={"p": "v"},
    )
    data = codec.encode_batch([msg], born_host="192.168.0.1:5555", born_timestamp=1234).data
    (
        size,
        magic,
        crc,
        qid,
        flag,
        qoff,
        phys,
        sysflag,
        born_ts,
        born_host,
        store_ts,
        store_host,
        reconsume,
        prepared,
        body_len,
    ) = codec.HEADER.unpack_from(data, 0)
    assert size == len(data)
    assert magic == 0xDAA320A7
    assert crc == zlib.crc32(b"hello") & 0x7FFFFFFF
    assert (qid, flag, qoff, phys, sysflag, born_ts) == (3, 7, 0, 0, 0, 1234)
    assert born_host == bytes([192, 168, 0, 1]) + (5555).to_bytes(4, "big")
    assert body_len == 5 and data[88:93] == b"hello"
    assert data[93] == len("TopicA") and data[94:100] == b"TopicA"
    prop_len = struct.unpack_from(">h", data, 100)[0]
    assert 102 + prop_len == size == codec.FIXED_LEN + 5 + 6 + prop_len
    props = codec.decode_properties(data[102:])
    assert props["TAGS"] == "TagA" and props["KEYS"] == "k1 k2" and props["p"] == "v"
    assert len(props["UNIQ_KEY"]) == 32
    assert data[102:].count(b"\x02") == len(props)


@settings(max_examples=100)
@given(
    topic=st.from_regex(r"[A-Za-z0-9_%|-]{1,127}", fullmatch=True),
    body=st.binary(min_size=1, max_size=2000),
    tags=st.none()
    | st.text(
        alphabet=st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)),
        min_size=1,
        max_size=20,
    ),
    keys=st.lists(st.text(alphabet="abcXYZ019-_#", min_size=1, max_size=10), max_size=3),
    queue_id=st.integers(0, 1000),
    flag=st.integers(-(2**31), 2**31 - 1),
)
def test_round_trip_every_field(
    topic: str, body: bytes, tags: str | None, keys: list[str], queue_id: int, flag: int
) -> None:
    msg = Message(
        topic,
        body,
        tags=tags,
        keys=keys,
        queue_id=queue_id,
        flag=flag,
        properties={"a": "1", "ü": "ß"},
    )
    batch = codec.encode_batch([msg, msg], born_host="1.2.3.4:99", born_timestamp=42)
    out = codec.decode_records(batch.data)
    assert len(out) == 2
    single, end = codec.decode_record(batch.data, 0)
    assert end == int(batch.sizes[0])
    for m in (out[0], single):
        assert (m.topic, m.body, m.tags, m.keys, m.queue_id, m.flag) == (
            topic,
            body,
            tags,
            tuple(keys),
            queue_id,
            flag,
        )
        assert m.born_host == "1.2.3.4:99" and m.born_timestamp == 42
        assert m.properties["a"] == "1" and m.properties["ü"] == "ß"
    assert out[0].msg_id != out[1].msg_id
    assert batch.tag_codes.tolist() == [codec.java_hash(tags) if tags else 0] * 2


def test_encoded_batch_crosses_as_one_blob() -> None:
    msgs = [
        Message("T", bytes([i]) * 10, tags="A", keys=[f"k{i}"], queue_id=i % 3) for i in range(50)
    ]
    batch = codec.encode_batch(msgs)
    blob = batch.to_bytes()
    # bytes, or the uint8 array Ray hands a broker in place: the same batch, not a copy
    for wire in (blob, np.frombuffer(blob, dtype=np.uint8)):
        again = codec.EncodedBatch.from_bytes(wire)
        assert bytes(again.data) == batch.data
        view = np.frombuffer(wire, dtype=np.uint8)
        assert np.shares_memory(np.frombuffer(again.data, dtype=np.uint8), view)
        assert again.sizes.tolist() == batch.sizes.tolist()
        assert again.queue_ids.tolist() == batch.queue_ids.tolist()
        assert again.key_hashes.tolist() == batch.key_hashes.tolist()
        assert again.uniq_keys == batch.uniq_keys


def test_a_batch_made_without_the_dataclass_init_is_the_dataclass_s_own() -> None:
    """``new_batch`` (a send's decode, the encoders) makes what ``EncodedBatch(...)``
    makes: every field, the private ones included, equal; a field added to the class
    and not to it fails here."""
    from dataclasses import fields

    from storage.batch import new_batch

    plain = codec.encode_batch([Message("T", b"x", keys=["k"])])
    numbered = plain.with_sequence("producer-1", 3, 7, 1)
    for batch in (plain, numbered):
        args = {f.name: getattr(batch, f.name) for f in fields(codec.EncodedBatch) if f.init}
        made, reference = new_batch(**args), codec.EncodedBatch(**args)
        names = {f.name for f in fields(codec.EncodedBatch)}
        assert vars(made).keys() == vars(reference).keys()  # what EncodedBatch(**vars) takes
        assert all(getattr(made, n) is getattr(reference, n) for n in names)
        assert made == reference
    # a blob off the wire, decoded through it
    again = codec.EncodedBatch.from_bytes(numbered.to_bytes())
    assert again.producer_id == "producer-1" and again.seq_runs.tolist() == [[0, 7]]
    assert again.queue_ids.tolist() == [1] and again.checked


def test_malformed_blob_is_refused() -> None:
    blob = codec.encode_batch([Message("T", b"x")]).to_bytes()
    for bad in (blob[:10], blob[:-1], b"\xff" * 40, np.frombuffer(blob[:-1], dtype=np.uint8)):
        with pytest.raises(InvalidMessageError):
            codec.EncodedBatch.from_bytes(bad)


def test_a_blob_cut_anywhere_is_refused() -> None:
    """Every field of the wire present (topics, unique keys, producer, the eight arrays,
    delays and runs), and cut at every byte: each cut is refused, none is read past."""
    msgs = [Message("T", b"x" * 20, keys=["k1", "k2"], delay_level=2), Message("T", b"y")]
    blob = codec.encode_batch(msgs).with_sequence("producer-1", 3, 7, 0).to_bytes()
    whole = codec.EncodedBatch.from_bytes(blob)
    assert whole.delay_levels.tolist() == [2, 0] and whole.seq_runs.tolist() == [[0, 7]]
    assert len(whole.key_hashes) == 2 + 2  # two keys and two unique keys
    for cut in range(len(blob)):
        with pytest.raises(InvalidMessageError):
            codec.EncodedBatch.from_bytes(blob[:cut])


def test_offset_msg_id_round_trip() -> None:
    mid = codec.make_offset_msg_id("10.0.0.7:10911", 123456789)
    assert len(mid) == 32 and mid == mid.upper()
    assert mid.startswith("0A000007" + "00002A9F")
    assert codec.parse_offset_msg_id(mid) == ("10.0.0.7:10911", 123456789)
    with pytest.raises(InvalidMessageError):
        codec.parse_offset_msg_id("xyz")


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_random_bytes_only_raise_store_corrupted(data: bytes) -> None:
    try:
        for m in codec.decode_records(data):
            _ = m.properties
    except StoreCorruptedError:
        pass
    with contextlib.suppress(StoreCorruptedError):
        codec.decode_record(data, 0)


def test_mutated_records_only_raise_store_corrupted() -> None:
    rng = random.Random(7)
    data = codec.encode_batch(
        [
            Message("Topic", bytes(rng.randbytes(rng.randint(1, 200))), tags="t", keys=["k"])
            for _ in range(5)
        ]
    ).data
    for _ in range(3000):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        if rng.random() < 0.3:
            mutated = mutated[: rng.randrange(len(mutated))]
        try:
            for m in codec.decode_records(bytes(mutated)):
                _ = m.properties
        except StoreCorruptedError:
            pass


def test_crc_mismatch_is_detected() -> None:
    data = bytearray(codec.encode_batch([Message("T", b"payload")]).data)
    data[90] ^= 0x01
    with pytest.raises(StoreCorruptedError, match="CRC"):
        codec.decode_record(bytes(data))
    with pytest.raises(StoreCorruptedError, match="CRC"):
        codec.decode_records(bytes(data))


@settings(max_examples=60)
@given(
    bodies=st.lists(st.binary(min_size=1, max_size=300), min_size=8, max_size=40),
    tags=st.none() | st.sampled_from(["A", "TagB", "ü"]),
    qids=st.integers(0, 7),
    base=st.sampled_from([0, 5]),
    flags=st.integers(0, 2),
)
def test_fast_plain_encoding_equals_the_general_loop(
    bodies: list[bytes], tags: str | None, qids: int, base: int, flags: int
) -> None:
    msgs = [
        Message("Plain", b, tags=tags, queue_id=base + i % (qids + 1), flag=i % (flags + 1))
        for i, b in enumerate(bodies)
    ]
    _assert_fast_equals_slow(msgs)


@pytest.mark.parametrize("qid, flag", [(0, 0), (5, 3)])
def test_fast_plain_encoding_of_a_shared_queue_id_and_flag(qid: int, flag: int) -> None:
    msgs = [Message("Plain", b"x%d" % i, queue_id=qid, flag=flag) for i in range(20)]
    fast = _assert_fast_equals_slow(msgs)
    assert {(m.queue_id, m.flag) for m in codec.decode_records(fast.data)} == {(qid, flag)}


def test_fast_plain_encoding_reuses_its_scratch_buffer_without_leftovers() -> None:
    # a big batch with a long tail, then smaller ones with shorter and longer tails: each
    # reuses the thread's buffer the one before filled, and none may carry its bytes
    _assert_fast_equals_slow(
        [Message("ALongerTopicName", b"big%d" % i, tags="SomeTags") for i in range(3000)]
    )
    _assert_fast_equals_slow([Message("T", b"small%d" % i) for i in range(40)])
    _assert_fast_equals_slow(
        [Message("Mid", b"m" * (i % 7 + 1), tags="x" * 30) for i in range(500)]
    )


@pytest.mark.parametrize("n", [1, 2, 7])
@pytest.mark.parametrize("keyed", [False, True])
def test_the_c_encoder_takes_a_single_message_and_small_batches(n: int, keyed: bool) -> None:
    """A single send (the latency path) goes through the C encoder too, with the
    general loop's bytes; the numpy one leaves batches under 8 to the loop."""
    from storage import _fast_encode

    msgs = [
        Message("Plain", b"one%d" % i, tags="A", keys=f"order-{i}" if keyed else None)
        for i in range(n)
    ]
    _assert_fast_equals_slow(msgs, [_fast_encode.encode_plain_c])
    born = codec.host_to_bytes("1.2.3.4:5")
    gen = codec.UniqueKeyGenerator()
    assert _fast_encode.encode_plain_numpy(msgs, 4 << 20, 99, born, gen) is None


def _encoders() -> list:
    from storage import _fast_encode

    return [_fast_encode.encode_plain_numpy, _fast_encode.encode_plain_c]


def _same_generators() -> tuple[codec.UniqueKeyGenerator, codec.UniqueKeyGenerator]:
    import itertools

    fast_gen, slow_gen = codec.UniqueKeyGenerator(), codec.UniqueKeyGenerator()
    slow_gen.prefix = fast_gen.prefix
    start = fast_gen.take(1)
    fast_gen._counter = itertools.count(start)
    slow_gen._counter = itertools.count(start)
    return fast_gen, slow_gen


def _assert_fast_equals_slow(
    msgs: list[Message], encoders: list | None = None
) -> codec.EncodedBatch:
    """Both plain encoders (numpy and C; or ``encoders``) give the general loop's bytes
    and arrays."""
    bodies = [m.body for m in msgs]
    host = "1.2.3.4:5"
    for encode in encoders or _encoders():
        fast_gen, slow_gen = _same_generators()
        fast = encode(msgs, 4 << 20, 99, codec.host_to_bytes(host), fast_gen)
        assert fast is not None, encode.__name__
        slow = codec.encode_batch(
            msgs, born_host=host, uniq=slow_gen, born=[(99, host, 0)] * len(msgs)
        )
        assert fast.data == slow.data, encode.__name__
        assert list(fast.uniq_keys) == list(slow.uniq_keys)
        assert fast.key_hashes.tolist() == slow.key_hashes.tolist()
        assert fast.sizes.tolist() == slow.sizes.tolist()
        assert fast.queue_ids.tolist() == slow.queue_ids.tolist()
        assert fast.tag_codes.tolist() == slow.tag_codes.tolist()
        assert [m.body for m in codec.decode_records(fast.data)] == bodies
    return fast


@pytest.mark.parametrize("keyed", [False, True])
def test_shared_properties_encode_in_c_as_the_general_loop_writes_them(keyed: bool) -> None:
    """A transaction's marks, shared by messages with no properties of their own, go
    through the C encoder (``shared``) and come out as the general loop writes each
    message carrying them: the same bytes and arrays, the batch flagged transactional.
    A message with properties of its own, or a delivery time among the shared ones, is
    left to the general loop (None)."""
    import dataclasses

    from storage import _fast_encode

    marks = {"TRAN_MSG": "true", "PGROUP": "g", "__TXN_ID__": "t.1.2", "ü名": "v ☃"}
    host = "1.2.3.4:5"
    msgs = [
        Message("Plain", b"x%d" % i, tags="A", keys=f"k{i}" if keyed else None, queue_id=i % 3)
        for i in range(20)
    ]
    fast_gen, slow_gen = _same_generators()
    fast = _fast_encode.encode_plain_c(
        msgs, 4 << 20, 99, codec.host_to_bytes(host), fast_gen, None, marks
    )
    slow = codec.encode_batch(
        [dataclasses.replace(m, properties=marks) for m in msgs],
        born_host=host,
        uniq=slow_gen,
        born=[(99, host, 0)] * len(msgs),
    )
    assert fast is not None
    assert bytes(fast.data) == bytes(slow.data)
    for name in ("sizes", "queue_ids", "tag_codes", "key_hashes", "key_owner"):
        assert getattr(fast, name).tolist() == getattr(slow, name).tolist(), name
    assert list(fast.uniq_keys) == list(slow.uniq_keys)
    assert fast.transactional and slow.transactional
    assert codec.decode_records(bytes(fast.data))[3].properties["__TXN_ID__"] == "t.1.2"
    born = codec.host_to_bytes(host)
    own = [dataclasses.replace(msgs[0], properties={"a": "b"}), *msgs[1:]]
    assert _fast_encode.encode_plain_c(own, 4 << 20, 99, born, fast_gen, None, marks) is None
    timed = {**marks, "TIMER_DELIVER_MS": "5"}
    assert _fast_encode.encode_plain_c(msgs, 4 << 20, 99, born, fast_gen, None, timed) is None


def test_the_c_encoder_is_built() -> None:
    # setup.py builds it wherever a compiler is (optional, so an install without one
    # still works); here one is, and losing it would cost producers 5-10x silently
    from storage import _fast_encode

    assert _fast_encode._native is not None
    assert _fast_encode.encode_plain is not _fast_encode.encode_plain_numpy


def test_c_encoder_handles_long_bodies_and_the_counter_wrap() -> None:
    import itertools

    rng = random.Random(7)
    _assert_fast_equals_slow(
        [Message("Big", rng.randbytes(rng.randint(1, 70_000)), tags="t") for _ in range(12)]
    )
    # the 48-bit counter wraps inside the batch: keys go ...FFFFFFFFFFFF, 000000000000
    fast_gen, slow_gen = _same_generators()
    for gen in (fast_gen, slow_gen):
        gen._counter = itertools.count((1 << 48) - 3)
    from storage._fast_encode import encode_plain_c

    msgs = [Message("Wrap", b"w%d" % i) for i in range(10)]
    fast = encode_plain_c(msgs, 4 << 20, 1, codec.host_to_bytes("1.2.3.4:5"), fast_gen)
    slow = codec.encode_batch(
        msgs, born_host="1.2.3.4:5", uniq=slow_gen, born=[(1, "1.2.3.4:5", 0)] * 10
    )
    assert fast is not None and fast.data == slow.data
    assert [k[-12:] for k in fast.uniq_keys][2:4] == ["FFFFFFFFFFFF", "000000000000"]


def test_c_encoder_builtin_crc_matches_zlib_at_any_length_and_alignment() -> None:
    from storage import _native

    rng = random.Random(3)
    blob = rng.randbytes(5000)
    for start in range(9):
        for length in (0, 1, 7, 8, 9, 63, 100, 1024, 4000):
            piece = memoryview(blob)[start : start + length]
            assert _native.crc32_builtin(piece) == zlib.crc32(piece)


class _SubMessage(Message):
    __slots__ = ()


@pytest.mark.parametrize(
    "odd",
    [
        lambda m: _SubMessage(m.topic, m.body),
        lambda m: Message(m.topic, bytearray(m.body)),
        lambda m: Message("Other", m.body),
        lambda m: Message(m.topic, m.body, tags="t"),
        lambda m: Message(m.topic, m.body, properties={"a": "b"}),
        lambda m: Message(m.topic, m.body, keys="k"),
        lambda m: Message(m.topic, m.body, delay_level=2),
        lambda m: Message(m.topic, b""),
        lambda m: Message(m.topic, b"x" * 101),
        lambda m: Message(m.topic, m.body, queue_id=True),
        lambda m: Message(m.topic, m.body, queue_id=1 << 31),
        lambda m: Message(m.topic, m.body, queue_id=-1),
        lambda m: Message(m.topic, m.body, flag=1 << 31),
        lambda m: Message(m.topic, m.body, flag=1 << 70),
        lambda m: Message(m.topic, m.body, queue_id=1.0),
        lambda m: "not a message",
        # a mapping of a user type: its __len__ could run anything, so not judged in C
        lambda m: Message(m.topic, m.body, properties=types.MappingProxyType({})),
    ],
)
def test_c_encoder_leaves_anything_not_plain_to_the_general_loop(odd) -> None:
    from storage._fast_encode import encode_plain_c

    msgs = [Message("Plain", b"p%d" % i) for i in range(12)]
    msgs[5] = odd(msgs[5])
    gen = codec.UniqueKeyGenerator()
    assert encode_plain_c(msgs, 100, 1, codec.host_to_bytes("1.2.3.4:5"), gen) is None


def test_c_encoder_refuses_a_message_with_an_unset_slot() -> None:
    from storage._fast_encode import encode_plain_c

    msgs = [Message("Plain", b"p%d" % i) for i in range(12)]
    del msgs[3].flag
    assert (
        encode_plain_c(msgs, 100, 1, codec.host_to_bytes("1.2.3.4:5"), codec.UniqueKeyGenerator())
        is None
    )


def test_body_slices_match_decoded_bodies_and_refuse_garbage() -> None:
    import numpy as np

    batch = codec.encode_batch([Message("T", bytes([i]) * (i + 1), tags="x") for i in range(50)])
    sizes = batch.sizes.astype(np.int64)
    starts = np.cumsum(sizes) - sizes
    assert codec.body_slices(batch.data, starts) == [
        m.body for m in codec.decode_records(batch.data)
    ]
    broken = bytearray(batch.data)
    broken[int(starts[7]) + 4] ^= 0xFF
    with pytest.raises(StoreCorruptedError):
        codec.body_slices(bytes(broken), starts)


def test_windows_gather_and_scatter_fields_at_unaligned_positions() -> None:
    rng = random.Random(7)
    data = bytearray(rng.randbytes(300))
    at = np.array([0, 9, 17, 101, 250, 292], dtype=np.int64)  # 292 + 8 == len: the last window
    longs = codec.windows(data, ">i8")
    assert len(longs) == len(data) - 7
    assert longs[at].tolist() == [struct.unpack_from(">q", data, int(a))[0] for a in at]
    values = np.array([-1, 2, 3 << 40, -(5 << 50), 7, 9], dtype=">i8")
    codec.windows(data, "V8")[at] = values.view("V8")
    assert [struct.unpack_from(">q", data, int(a))[0] for a in at] == values.tolist()
    words = codec.windows(bytes(data), ">u4")  # read-only buffers gather too
    assert words[at + 1].tolist() == [struct.unpack_from(">I", data, int(a) + 1)[0] for a in at]
    assert len(codec.windows(b"abc", ">i4")) == 0  # shorter than one field: no window


def _keyed_equals_slow(msgs: list[Message]) -> codec.EncodedBatch:
    """The C encoder's keyed batch is the general loop's, index entries included."""
    from storage._fast_encode import encode_plain_c

    fast_gen, slow_gen = _same_generators()
    fast = encode_plain_c(msgs, 4 << 20, 99, codec.host_to_bytes("1.2.3.4:5"), fast_gen)
    assert fast is not None
    slow = codec.encode_batch(
        msgs, born_host="1.2.3.4:5", uniq=slow_gen, born=[(99, "1.2.3.4:5", 0)] * len(msgs)
    )
    assert fast.data == slow.data
    assert fast.key_hashes.tolist() == slow.key_hashes.tolist()
    assert fast.key_owner.tolist() == slow.key_owner.tolist()
    assert list(fast.uniq_keys) == list(slow.uniq_keys)
    assert fast.sizes.tolist() == slow.sizes.tolist()
    return fast


@pytest.mark.parametrize("tags", ["TagA", None])
def test_c_encoder_writes_a_key_each_as_the_general_loop_does(tags: str | None) -> None:
    rng = random.Random(11)
    msgs = [
        Message("Orders", rng.randbytes(rng.randint(1, 3000)), tags=tags, keys=f"order-{i:07d}")
        for i in range(500)
    ]
    fast = _keyed_equals_slow(msgs)
    decoded = codec.decode_records(fast.data)
    assert [m.keys for m in decoded] == [(f"order-{i:07d}",) for i in range(500)]
    # keys of every length up to what the properties can hold
    _keyed_equals_slow([Message("K", b"x", keys="k" * n) for n in (1, 2, 100, 30_000)] * 3)
    # the key as a list or a tuple of itself (Message(keys=[order_id])), or mixed
    shapes = [lambda k: [k], lambda k: (k,), lambda k: k]
    _keyed_equals_slow(
        [Message("Orders", b"b%d" % i, keys=shapes[i % 3](f"o{i}")) for i in range(300)]
    )


@pytest.mark.parametrize(
    "odd",
    [
        lambda m: Message(m.topic, m.body),  # no key in a keyed batch
        lambda m: Message(m.topic, m.body, keys="two keys"),
        lambda m: Message(m.topic, m.body, keys=""),
        lambda m: Message(m.topic, m.body, keys="k\x01"),
        lambda m: Message(m.topic, m.body, keys="clé"),  # not ASCII
        lambda m: Message(m.topic, m.body, keys=("a", "b")),
        lambda m: Message(m.topic, m.body, keys=["a", "b"]),
        lambda m: Message(m.topic, m.body, keys=[]),
        lambda m: Message(m.topic, m.body, keys=["two keys"]),
        lambda m: Message(m.topic, m.body, keys=[""]),
        lambda m: Message(m.topic, m.body, keys=[b"bytes"]),  # type: ignore[list-item]
        lambda m: Message(m.topic, m.body, keys=[["nested"]]),  # type: ignore[list-item]
        lambda m: Message(m.topic, m.body, keys="k" * 40_000),  # over the properties' room
    ],
)
def test_c_encoder_leaves_odd_keys_to_the_general_loop(odd) -> None:
    from storage._fast_encode import encode_plain_c

    msgs = [Message("Keyed", b"p%d" % i, keys=f"k{i}") for i in range(12)]
    msgs[5] = odd(msgs[5])
    gen = codec.UniqueKeyGenerator()
    assert encode_plain_c(msgs, 100, 1, codec.host_to_bytes("1.2.3.4:5"), gen) is None


@pytest.mark.parametrize("n", [1, codec._SCALAR_DECODE_MAX, codec._SCALAR_DECODE_MAX + 1, 40])
def test_few_records_decode_one_by_one_as_many_decode_through_arrays(n: int) -> None:
    rng = random.Random(n)
    messages = [
        Message(
            rng.choice(["T", "Other"]),
            rng.randbytes(rng.randrange(1, 300)),
            tags=rng.choice([None, "a", "bb"]),
            keys=rng.choice([(), "k1", ("k1", "k2")]),
            properties=rng.choice([None, {"p": "v", "x": "ü"}]),
            flag=rng.randrange(0, 9),
        )
        for _ in range(n)
    ]
    data = bytes(codec.encode_batch(messages).data)
    got = codec.decode_records(data)
    starts, at = [], 0
    while at < len(data):
        m, at2 = codec.decode_record(data, at)
        starts.append(m)
        at = at2
    assert got == starts
    assert [(m.topic, m.body, m.tags, list(m.keys)) for m in got] == [
        (m.topic, m.body, m.tags, [m.keys] if isinstance(m.keys, str) else list(m.keys))
        for m in messages
    ]
    broken = bytearray(data)
    broken[len(data) - 1] ^= 0x5A  # the last record's properties end: refused either way
    broken[codec.HEADER.size] ^= 0x5A  # the first record's body: its CRC no longer matches
    with pytest.raises(StoreCorruptedError):
        codec.decode_records(bytes(broken))


def test_a_properties_dict_shared_by_many_messages_encodes_as_their_own_copies() -> None:
    # a transaction marks every message with one dict; the encoder encodes it once
    marks = {"TRAN_MSG": "true", "PGROUP": "g", "k": "v"}
    bodies = [b"m%d" % i for i in range(30)]
    shared = [
        Message("T", b, properties=marks, tags="t" if i % 2 else None) for i, b in enumerate(bodies)
    ]
    shared[7] = Message("T", bodies[7], properties={**marks, "own": "x"})
    copies = [Message(m.topic, m.body, tags=m.tags, properties=dict(m.properties)) for m in shared]
    a, b = (
        codec.encode_batch(shared, born_timestamp=1),
        codec.encode_batch(copies, born_timestamp=1),
    )
    assert a.transactional and b.transactional and len(a.data) == len(b.data)

    def strip(batch: codec.EncodedBatch) -> list[tuple[bytes, str | None, dict[str, str]]]:
        out = []
        for r in codec.decode_records(batch.data):
            props = {k: v for k, v in r.properties.items() if k != "UNIQ_KEY"}
            out.append((r.body, r.tags, props))
        return out

    assert strip(a) == strip(b)
    assert strip(a)[7][2]["own"] == "x" and "own" not in strip(a)[8][2]
