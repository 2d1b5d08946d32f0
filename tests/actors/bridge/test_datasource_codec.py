"""The Arrow codec reads and writes the store's records exactly as storage.codec does."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from actors.bridge.arrow_codec import TOPIC_SCHEMA, ArrowMessages, encode_arrow, records_to_arrow
from storage import Message, MessageStore, StoreConfig
from storage.codec import decode_records, encode_batch
from storage.errors import InvalidMessageError, StoreCorruptedError

N = 5_000
TAGS = ["TagA", "TagB", None]


def _messages(n: int) -> list[Message]:
    rng = np.random.default_rng(3)
    return [
        Message(
            "Orders",
            os.urandom(int(rng.integers(1, 300))),
            tags=TAGS[i % 3],
            keys=[f"order-{i}", f"cust-{i % 7}"] if i % 5 else (),
            properties={"region": "eu", "n": str(i)} if i % 4 == 0 else None,
        )
        for i in range(n)
    ]


@pytest.fixture
def store(tmp_path):
    with MessageStore(StoreConfig(str(tmp_path / "store"), commitlog_file_size=16 << 20)) as s:
        yield s


def _same(row: dict, m) -> None:
    assert row["topic"] == m.topic
    assert row["queue_id"] == m.queue_id
    assert row["queue_offset"] == m.queue_offset
    assert row["msg_id"] == m.msg_id
    assert row["tags"] == m.tags
    assert row["keys"] == m.properties.get("KEYS")
    assert row["born_timestamp"] == m.born_timestamp
    assert row["store_timestamp"] == m.store_timestamp
    assert dict(row["properties"]) == m.properties
    assert row["body"] == m.body


def test_records_decode_to_the_same_fields_as_storage_codec(store):
    store.put_encoded(encode_batch(_messages(N)).with_queue(2))
    raw = store.get_raw("", "Orders", 2, 0, N)

    table = records_to_arrow(raw.data, topic="Orders", broker_name="broker-a", check_crc=True)
    want = decode_records(raw.data, check_crc=True)

    assert table.schema == TOPIC_SCHEMA
    table.validate(full=True)
    assert table.num_rows == N
    assert set(table.column("broker_name").to_pylist()) == {"broker-a"}
    for row, m in zip(table.to_pylist(), want):
        _same(row, m)


def test_arrow_rows_encode_as_encode_batch_would(store):
    # a user's PRODUCER_SEQ is dropped by both (the broker refuses a batch carrying one
    # where it numbers no run: it would rebuild another producer's state on recovery)
    msgs = [
        m if m.properties is None else Message(
            m.topic, m.body, tags=m.tags, keys=m.keys,
            properties={**m.properties, "PRODUCER_SEQ": "p:1,0,0,1"},
        )
        for m in _messages(N)
    ]  # fmt: skip
    columns = ArrowMessages(
        body=pa.array([m.body for m in msgs], pa.binary()),
        tags=pa.array([m.tags for m in msgs], pa.string()),
        keys=pa.array([" ".join(m.keys) if m.keys else None for m in msgs], pa.string()),
        properties=pa.array(
            [list((m.properties or {}).items()) for m in msgs], pa.map_(pa.string(), pa.string())
        ),
    )
    store.put_encoded(encode_arrow("Orders", columns).with_queue(0))
    store.put_encoded(encode_batch(msgs).with_queue(1))

    ours = decode_records(store.get_raw("", "Orders", 0, 0, N).data, check_crc=True)
    theirs = decode_records(store.get_raw("", "Orders", 1, 0, N).data, check_crc=True)

    for a, b in zip(ours, theirs):
        assert (a.body, a.tags, a.keys, a.store_size) == (b.body, b.tags, b.keys, b.store_size)
        assert {k: v for k, v in a.properties.items() if k != "UNIQ_KEY"} == {
            k: v for k, v in b.properties.items() if k != "UNIQ_KEY"
        }
        assert "PRODUCER_SEQ" not in a.properties
    # Every key and unique key went into the IndexFile.
    assert [m.body for m in store.query_by_key("Orders", "order-6")] == [msgs[6].body] * 2
    assert store.query_by_key("Orders", ours[7].msg_id)[0].body == msgs[7].body


def test_string_bodies_are_sent_as_their_utf8_bytes(store):
    batch = encode_arrow("Orders", ArrowMessages(pa.array(["héllo", "x"])))
    store.put_encoded(batch)

    got = decode_records(store.get_raw("", "Orders", 0, 0, 2).data)
    assert [m.body for m in got] == ["héllo".encode(), b"x"]
    assert [m.tags for m in got] == [None, None]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (ArrowMessages(pa.array([b"a", b""])), "body of row 1 .* empty or null"),
        (ArrowMessages(pa.array([b"a", None])), "body of row 1 .* empty or null"),
        (ArrowMessages(pa.array([b"a"]), tags=pa.array(["x\x01y"])), "tags of row 0"),
        (ArrowMessages(pa.array([b"a", b"b"]), tags=pa.array(["x", ""])), "tags of row 1"),
        (ArrowMessages(pa.array([b"a"]), keys=pa.array(["k\x02"])), "keys of row 0"),
        (ArrowMessages(pa.array([1, 2])), "body: must be a binary or string column"),
    ],
)
def test_bad_rows_are_refused_with_the_row_and_field(columns, message):
    with pytest.raises(InvalidMessageError, match=message):
        encode_arrow("Orders", columns)


def test_a_body_over_the_limit_is_refused():
    with pytest.raises(InvalidMessageError, match="body of row 1 is 11 bytes: over"):
        encode_arrow("Orders", ArrowMessages(pa.array([b"a", b"x" * 11])), max_message_size=10)


def test_damaged_records_raise_store_corrupted(store):
    store.put_encoded(encode_batch(_messages(10)))
    data = bytearray(store.get_raw("", "Orders", 0, 0, 10).data)
    data[4] ^= 0xFF  # the first record's magic

    with pytest.raises(StoreCorruptedError):
        records_to_arrow(bytes(data))
    assert records_to_arrow(b"").num_rows == 0
