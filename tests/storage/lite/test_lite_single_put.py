"""A single lite put takes a path of its own (``LiteStore.put``: the C encoder with the
name as the record's own property, ``MessageStore.put_one_written``, the table's
memoryviews): it leaves the same records, entries and answers as the general paths
(real stores on a temp dir, one fixed clock, no Ray)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from store_sizes import small_config

from storage import Message, MessageStore, codec, record
from storage.errors import InvalidMessageError
from storage.lite import (
    PROP_LITE_TOPIC,
    IllegalLiteTopicError,
    LiteConfig,
    LiteStore,
    LiteTopicQuotaExceededError,
    NotALiteParentError,
)
from storage.lite import names as lite_names

NOW_S = 1_700_000_000.0  # every store time the same: the stores' files then agree
PER_FILE = 64  # index entries a file: the puts below roll several


def open_lite(path: Path, quota: int = 5000) -> tuple[MessageStore, LiteStore]:
    store = MessageStore(small_config(path), clock=lambda: NOW_S, start_services=False)
    lite = LiteStore(store, LiteConfig(index_file_entries=PER_FILE))
    lite.declare_parent("Chat", quota=quota, ttl_ms=3_600_000)
    return store, lite


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[LiteStore, LiteStore]]:
    """A lite store whose single puts take their own path, and one whose records the
    general loop encodes."""
    a, la = open_lite(tmp_path / "a")
    b, lb = open_lite(tmp_path / "b")
    lb._encode_plain = lambda *args: None  # type: ignore[method-assign]
    try:
        yield la, lb
    finally:
        for lite, store in ((la, a), (lb, b)):
            lite.close()
            store.close()


def entries(lite: LiteStore) -> list[tuple[int, ...]]:
    """Every index entry: id, generation, offset, CommitLog offset, size, time, prev, skip."""
    fields = ("lid", "gen", "loff", "phys", "size", "ts", "prev", "skip")
    return [
        tuple(int(row[f]) for f in fields)
        for _, rows in lite.index.written()
        for row in rows.tolist()
        for row in [dict(zip(rows.dtype.names, row))]
    ]


def commitlog_bytes(store: MessageStore) -> bytes:
    """The whole CommitLog, file after file."""
    parts, at = [], store.commitlog.min_offset
    while at < store.commitlog.max_offset:
        chunk = store.read_commitlog(at, 1 << 30)
        assert chunk
        parts.append(chunk)
        at += len(chunk)
    return b"".join(parts)


def records(lite: LiteStore) -> list[tuple[object, ...]]:
    """The record of every index entry, its unique key and born time left out."""
    out = []
    for e in entries(lite):
        m = lite.store.message_at(e[3])
        props = {k: v for k, v in m.properties.items() if k != codec.PROP_UNIQ_KEY}
        out.append((m.topic, m.body, m.tags, m.keys, props, m.store_timestamp, m.queue_id))
    return out


def test_single_puts_leave_what_the_general_loop_leaves(two: tuple[LiteStore, LiteStore]) -> None:
    fast, slow = two
    general: list[int] = []
    real = fast._encode_general
    fast._encode_general = lambda *a: general.append(1) or real(*a)  # type: ignore[method-assign]
    names = [f"s-{i % 7}" for i in range(300)]  # offsets 0..42 each: every skip shape
    answers = []
    for i, name in enumerate(names):
        got = [
            lite.put(
                "Chat", name, Message("Chat", f"{name}/{i}".encode(), tags="t" if i % 3 else None)
            )
            for lite in two
        ]
        answers.append(got)
        a, b = got
        assert a.lite_offsets.dtype == np.int64 and a.commitlog_offsets.dtype == np.int64
        assert a.lite_offsets.tolist() == b.lite_offsets.tolist()
        assert a.commitlog_offsets.tolist() == b.commitlog_offsets.tolist()
        assert len(a.msg_ids) == 1 and len(a.msg_ids[0]) == 32 and a.flushed
    assert len({r.msg_ids[0] for r, _ in answers}) == len(names)
    assert not general or record._native is None  # the C encoder wrote them all
    assert records(fast) == records(slow)
    assert entries(fast) == entries(slow)
    assert len(fast.index.files) > 2
    for name in sorted(set(names)):
        for lite in two:
            got = lite.get("Chat", name, 0, 100)
            assert [m.body for m in got.messages] == [
                f"{name}/{i}".encode() for i, n in enumerate(names) if n == name
            ]
            assert {m.properties[PROP_LITE_TOPIC] for m in got.messages} == {name}


def test_single_puts_index_as_a_batch_does(tmp_path: Path) -> None:
    """The same messages one put each and as batches of two lite topics (the array
    path): the same offsets and entries, each entry's time its record's store time."""
    one, lone = open_lite(tmp_path / "one")
    many, lmany = open_lite(tmp_path / "many")
    try:
        for i in range(0, 120, 2):
            a, b = f"x-{i % 5}", f"y-{i % 3}"
            singles = [lone.put("Chat", n, Message("Chat", b"m%d" % i)) for n in (a, b)]
            batch = lmany.put_batch(
                "Chat", [(a, Message("Chat", b"m%d" % i)), (b, Message("Chat", b"m%d" % i))]
            )
            assert [s.lite_offsets[0] for s in singles] == batch.lite_offsets.tolist()
            assert [s.commitlog_offsets[0] for s in singles] == batch.commitlog_offsets.tolist()
        assert entries(lone) == entries(lmany)
        for e in entries(lone):  # the entry's time: its record's store time
            assert e[5] == one.message_at(e[3]).store_timestamp == int(NOW_S * 1000)
    finally:
        lone.close()
        one.close()
        lmany.close()
        many.close()


def test_single_puts_to_more_lite_topics_than_the_table_held_at_first(tmp_path: Path) -> None:
    """The table grows (its columns replaced, the memoryviews with them): every topic
    keeps its offsets, in memory and after a restart."""
    store, lite = open_lite(tmp_path / "s")
    n = 2100  # past the table's first 1024 and 2048 rows
    try:
        for i in range(n):
            assert lite.put("Chat", f"t-{i}", Message("Chat", b"first")).lite_offsets.tolist() == [
                0
            ]
        for i in (0, 1, 1023, 1024, 2047, 2048, n - 1):
            assert lite.put("Chat", f"t-{i}", Message("Chat", b"second")).lite_offsets.tolist() == [
                1
            ]
            assert lite.max_offset("Chat", f"t-{i}") == 2
        assert lite.max_offset("Chat", "t-5") == 1
        assert lite.count("Chat") == n
        before = {f"t-{i}": lite.describe("Chat", f"t-{i}") for i in range(n)}
    finally:
        lite.close()
        store.close()
    store, lite = open_lite(tmp_path / "s")
    try:
        assert {f"t-{i}": lite.describe("Chat", f"t-{i}") for i in range(n)} == before
        assert lite.put("Chat", "t-1024", Message("Chat", b"third")).lite_offsets.tolist() == [2]
        got = lite.get("Chat", "t-1024", 0, 10)
        assert [m.body for m in got.messages] == [b"first", b"second", b"third"]
    finally:
        lite.close()
        store.close()


def test_a_single_put_is_checked_as_a_batch_is(tmp_path: Path) -> None:
    store, lite = open_lite(tmp_path / "s", quota=2)
    try:
        with pytest.raises(NotALiteParentError):
            lite.put("Other", "a", Message("Other", b"x"))
        for bad in ("a b", "", "x" * 129, 7, None):
            with pytest.raises(IllegalLiteTopicError):
                lite.put("Chat", bad, Message("Chat", b"x"))  # type: ignore[arg-type]
        with pytest.raises(InvalidMessageError):
            lite.put("Chat", "a", Message("Other", b"x"))
        with pytest.raises(InvalidMessageError):
            lite.put("Chat", "a", Message("Chat", b"x", delay_level=2))
        with pytest.raises(InvalidMessageError):
            lite.put("Chat", "a", Message("Chat", b"x", properties={"TRAN_MSG": "true"}))
        with pytest.raises(InvalidMessageError):
            lite.put("Chat", "a", Message("Chat", b""))
        assert store.commitlog.max_offset == 0 and lite.count() == 0  # nothing written
        lite.put("Chat", "a", Message("Chat", b"x", properties={"trace": "on"}))
        lite.put("Chat", "b", Message("Chat", b"x"))
        with pytest.raises(LiteTopicQuotaExceededError):
            lite.put("Chat", "c", Message("Chat", b"x"))
        assert lite.put("Chat", "a", Message("Chat", b"y")).lite_offsets.tolist() == [1]
        got = lite.get("Chat", "a", 0, 10).messages
        assert [m.properties.get("trace") for m in got] == ["on", None]
    finally:
        lite.close()
        store.close()


def test_a_name_found_legal_once_is_known_and_an_illegal_one_never(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lite_names, "_VALID", set())
    monkeypatch.setattr(lite_names, "_VALID_MOST", 4)

    class Sly(str):
        pass

    for i in range(10):  # past the bound: forgotten, then found again
        assert lite_names.validate_lite_name(f"ok-{i}") == f"ok-{i}"
        assert len(lite_names._VALID) <= 4
    assert "ok-9" in lite_names._VALID
    assert lite_names.validate_lite_name(Sly("fine")) == "fine"
    assert "fine" not in lite_names._VALID  # a subclass's value is not kept
    for bad in ("a b", "é", "x" * 129, Sly("a b"), b"ab", ["ok-9"]):
        with pytest.raises(IllegalLiteTopicError):
            lite_names.validate_lite_name(bad)


@pytest.mark.skipif(record._native is None, reason="storage._native not built")
def test_put_one_written_writes_what_put_encoded_writes(tmp_path: Path) -> None:
    """``MessageStore.put_one_written`` (the lite single put's) against
    ``put_encoded``: the same files, offsets and checks; a batch it does not take
    alone (several records, an idempotent producer's) goes the general way."""
    stores = [
        MessageStore(small_config(tmp_path / n), clock=lambda: NOW_S, start_services=False)
        for n in ("one", "all")
    ]
    one, every = stores
    try:
        heard: list[tuple[str, int, int]] = []
        one.add_dispatch_listener(lambda *a: heard.append(a))
        for i in range(200):
            m = Message(
                "T", bytes([i % 251]) * (50 + i * 37 % 900), keys=f"k{i % 4}", queue_id=i % 2
            )
            wire = codec.encode_batch([m], born_timestamp=7)
            phys, ts, end = one.put_one_written(wire)
            assert (ts, end) == (int(NOW_S * 1000), 0)
            assert every.put_encoded(wire).commitlog_offsets.tolist() == [phys]
            assert heard[-1] == ("T", i % 2, one.max_offset("T", i % 2))
        pair = codec.encode_batch([Message("T", b"a"), Message("T", b"b")], born_timestamp=7)
        assert one.put_one_written(pair)[0] == every.put_encoded(pair).commitlog_offsets.tolist()[0]
        numbered = codec.encode_batch([Message("T", b"n")], born_timestamp=7).with_sequence(
            "p", 0, 0, 0
        )
        assert (
            one.put_one_written(numbered)[0]
            == every.put_encoded(numbered).commitlog_offsets.tolist()[0]
        )
        again = one.put_one_written(numbered)  # a retry: answered where it was stored
        assert again[0] == every.put_encoded(numbered).commitlog_offsets.tolist()[0]
        with pytest.raises(InvalidMessageError):
            one.put_one_written(codec.encode_batch([Message("SCHEDULE_TOPIC_XXXX", b"x")]))
        assert one.commitlog.max_offset == every.commitlog.max_offset
        assert commitlog_bytes(one) == commitlog_bytes(every)
        for qid in (0, 1):
            raw = [s.get_raw("g", "T", qid, 0, 500) for s in stores]
            assert raw[0].data == raw[1].data and raw[0].count == raw[1].count
        for key in ("k0", "k3"):
            found = [[x.commitlog_offset for x in s.query_by_key("T", key)] for s in stores]
            assert found[0] == found[1] and found[0]
    finally:
        for s in stores:
            s.close()
