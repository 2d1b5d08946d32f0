"""Small batches take scalar paths (up to ``codec.SMALL_BATCH`` records), big ones
vectorised paths: both leave byte-identical stores and refuse the same bad batches."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from storage import InvalidMessageError, Message, MessageStore, codec, java_hash
from storage import record as layout
from storage.codec import EncodedBatch

NOW_S = 1_700_000_000.0  # one store timestamp for every put: nothing then differs
BORN_MS = 1_600_000_000_000


def messages(n: int) -> list[Message]:
    """Two topics, three queues, shared and unique keys, bodies that roll 64 KiB files."""
    return [
        Message(
            "Small" if i % 4 else "Other",
            bytes([i % 251]) * (50 + (i * 397) % 4000),
            tags=f"t{i % 2}",
            keys=[f"k{i % 7}", f"u{i}"],
            properties={codec.PROP_UNIQ_KEY: f"ID{i:030d}"},
            queue_id=i % 3,
        )
        for i in range(n)
    ]


def wire(batch: list[Message]) -> EncodedBatch:
    """The batch as a broker receives it."""
    return EncodedBatch.from_bytes(codec.encode_batch(batch, born_timestamp=BORN_MS).to_bytes())


def files_under(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(params=[None, 0], ids=["scalar-when-small", "always-vectorised"])
def threshold(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.param is not None:
        monkeypatch.setattr(layout, "SMALL_BATCH", request.param)


@pytest.mark.parametrize("n", [5, 40])
def test_one_batch_and_single_puts_write_the_same_bytes(
    tmp_path: Path, make_config: Callable[..., object], threshold: None, n: int
) -> None:
    msgs = messages(n)
    stores = [
        MessageStore(make_config(tmp_path / name), clock=lambda: NOW_S, start_services=False)
        for name in ("batch", "singles")
    ]
    whole, singles = stores
    try:
        res = whole.put_encoded(wire(msgs))
        one_by_one = [singles.put_encoded(wire([m])) for m in msgs]
        assert res.commitlog_offsets.tolist() == [int(r.commitlog_offsets[0]) for r in one_by_one]
        assert res.queue_offsets.tolist() == [int(r.queue_offsets[0]) for r in one_by_one]
        assert whole.queues() == singles.queues()
        for i in (0, n // 2, n - 1):
            found = [
                [m.commitlog_offset for m in s.query_by_key(msgs[i].topic, f"u{i}")] for s in stores
            ]
            assert found[0] == found[1] == [int(res.commitlog_offsets[i])]
        offsets = res.commitlog_offsets.tolist()
        for topic in ("Small", "Other"):
            for key in (f"k{j}" for j in range(7)):
                expected = {o for m, o in zip(msgs, offsets) if m.topic == topic and key in m.keys}
                found = [[m.commitlog_offset for m in s.query_by_key(topic, key)] for s in stores]
                assert found[0] == found[1] and set(found[0]) == expected
    finally:
        for s in stores:
            s.close()
    for part in ("commitlog", "consumequeue"):
        assert files_under(whole.root / part) == files_under(singles.root / part)
    # index files are named by wall-clock time; their contents must match
    indexes = [sorted(files_under(s.root / "index").values()) for s in stores]
    assert indexes[0] == indexes[1]


def corrupt(blob: bytes, batch: EncodedBatch, record: int, field: int, value: bytes) -> bytes:
    """``blob`` with ``value`` written at ``field`` of record ``record`` of its data."""
    at = len(blob) - len(batch.data) + int(batch.sizes[:record].sum()) + field
    out = bytearray(blob)
    out[at : at + len(value)] = value
    return bytes(out)


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(
    "field, value",
    [
        (codec.OFF_TOTALSIZE, (1000).to_bytes(4, "big")),
        (codec.OFF_TOTALSIZE, (0).to_bytes(4, "big")),
        (codec.OFF_MAGIC, (codec.MAGIC ^ 1).to_bytes(4, "big")),
        (codec.OFF_MAGIC, codec.BLANK_MAGIC.to_bytes(4, "big")),
    ],
    ids=["size-1000", "size-0", "magic-flipped", "magic-blank"],
)
def test_a_corrupted_small_batch_is_refused_and_changes_nothing(
    store: MessageStore, threshold: None, n: int, field: int, value: bytes
) -> None:
    store.put_encoded(wire(messages(2)))
    before = files_under(store.root / "commitlog"), store.commitlog.max_offset, store.queues()
    batch = codec.encode_batch(messages(n), born_timestamp=BORN_MS)
    for record in {0, n - 1}:
        bad = corrupt(batch.to_bytes(), batch, record, field, value)
        with pytest.raises(
            InvalidMessageError, match=rf"record {record} of {n}: (TOTALSIZE|MAGIC)"
        ):
            EncodedBatch.from_bytes(bad)
        unchecked = EncodedBatch(
            **{**vars(batch), "data": bad[-len(batch.data) :], "checked": False}
        )
        with pytest.raises(
            InvalidMessageError, match=rf"record {record} of {n}: (TOTALSIZE|MAGIC)"
        ):
            store.put_encoded(unchecked)
    after = files_under(store.root / "commitlog"), store.commitlog.max_offset, store.queues()
    assert after == before


@pytest.mark.parametrize("body_len", [0, 16 * 1024 + 1])
def test_a_small_batch_with_a_bad_body_length_is_refused(
    store: MessageStore, threshold: None, body_len: int
) -> None:
    batch = codec.encode_batch(messages(3), born_timestamp=BORN_MS)
    bad = corrupt(batch.to_bytes(), batch, 1, codec.OFF_BODYLEN, body_len.to_bytes(4, "big"))
    with pytest.raises(
        InvalidMessageError, match="record 1 of 3: (BODYLEN|TOPICLEN|PROPERTIESLEN)="
    ):
        store.put_encoded(EncodedBatch.from_bytes(bad))
    assert store.commitlog.max_offset == 0 and store.queues() == []


class CountingKeys(codec.UniqueKeyGenerator):
    """Unique keys from a fixed prefix and a counter from 0, so two encodings match."""

    def __init__(self) -> None:
        super().__init__()
        self.prefix = "AB" * 10
        self._next = 0

    def take(self, n: int) -> int:
        first, self._next = self._next, self._next + n
        return first

    def next(self) -> str:
        return f"{self.prefix}{self.take(1):012X}"


def test_plain_encoding_is_the_same_one_by_one_and_as_a_batch() -> None:
    msgs = [Message("Plain", bytes([i]) * (10 + i), tags="t", queue_id=2) for i in range(40)]
    one, many = CountingKeys(), CountingKeys()
    batch = codec.encode_batch(msgs, born_timestamp=BORN_MS, uniq=many)  # vectorised
    singles = [codec.encode_batch([m], born_timestamp=BORN_MS, uniq=one) for m in msgs]
    assert bytes(batch.data) == b"".join(bytes(s.data) for s in singles)
    assert batch.key_hashes.tolist() == [int(s.key_hashes[0]) for s in singles]
    assert list(batch.uniq_keys) == [s.uniq_keys[0] for s in singles]


@pytest.mark.parametrize("scalar_chars", [0, 1 << 20])
def test_java_hashes_agree_on_both_paths(
    monkeypatch: pytest.MonkeyPatch, scalar_chars: int
) -> None:
    monkeypatch.setattr(java_hash, "_SCALAR_HASH_CHARS", scalar_chars)
    strings = ["", "a", "topic#key1", "é" * 30, "😀x", "Small#" + "Z" * 200] * 3
    assert codec.java_hashes(strings).tolist() == [codec.java_hash(s) for s in strings]
    assert codec.java_hashes(["topic#key1"]).tolist() == [-889947002]
