"""A batch a client encoded is checked record by record before the store trusts it.

The broker stores records as producers laid them out; recovery, a slave and a
consumer later read them back with their own checks. A record that passes the
put but fails those (a wrong body CRC, lengths that do not add up ...) used to
cost every record after it at the next crash. So the put checks what they check,
refuses the whole batch naming the record, the field and its value, and writes
nothing of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from storage import InvalidMessageError, Message, MessageStore, codec, record
from storage.codec import EncodedBatch


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "checkpoint"
    }


def batch_of(n: int) -> EncodedBatch:
    return codec.encode_batch(
        [
            Message(
                "Checked", bytes([i % 251]) * (20 + i), tags="t", keys=[f"k{i}"], queue_id=i % 2
            )
            for i in range(n)
        ]
    )


def fields(batch: EncodedBatch, i: int) -> dict[str, int]:
    """Where each field of record ``i`` starts in ``batch.data``."""
    start = int(batch.sizes[:i].sum())
    data = bytes(batch.data)
    body_len = int.from_bytes(data[start + codec.OFF_BODYLEN : start + codec.HEADER.size], "big")
    topic_at = start + codec.HEADER.size + body_len
    props_at = topic_at + 1 + data[topic_at] + 2
    return {
        "BODYCRC": start + 8,
        "SYSFLAG": start + 36,
        "BODY": start + codec.HEADER.size,
        "TOPICLEN": topic_at,
        "TOPIC": topic_at + 1,
        "PROPERTIESLEN": props_at - 2,
        "PROPERTIES": props_at,
    }


def tampered(batch: EncodedBatch, i: int, change: Callable[[bytearray, dict[str, int]], None]):
    data = bytearray(batch.data)
    change(data, fields(batch, i))
    return EncodedBatch(**{**vars(batch), "data": bytes(data), "checked": False})


def flip_body(data: bytearray, at: dict[str, int]) -> None:
    data[at["BODY"]] ^= 0x01  # the bit flip in transit: BODYCRC no longer matches


def set_int(field: str, width: int, value: int) -> Callable[[bytearray, dict[str, int]], None]:
    def change(data: bytearray, at: dict[str, int]) -> None:
        data[at[field] : at[field] + width] = value.to_bytes(width, "big")

    return change


def rename_topic(data: bytearray, at: dict[str, int]) -> None:
    data[at["TOPIC"] : at["TOPIC"] + 7] = b"Checkee"  # same length, another topic


def break_utf8(data: bytearray, at: dict[str, int]) -> None:
    data[at["PROPERTIES"] + 2] = 0xFF


def drop_separator(data: bytearray, at: dict[str, int]) -> None:
    first_pair = bytes(data[at["PROPERTIES"] :]).index(b"\x01")
    data[at["PROPERTIES"] + first_pair] = ord("=")


CASES = [
    (flip_body, "BODYCRC"),
    (set_int("TOPICLEN", 1, 6), "TOPICLEN"),
    (set_int("PROPERTIESLEN", 2, 3), "PROPERTIESLEN"),
    (rename_topic, "TOPIC"),
    (set_int("SYSFLAG", 4, 0x10), "SYSFLAG"),  # an IPv6 born host: readers refuse it
    (set_int("SYSFLAG", 4, 0x4), "SYSFLAG"),  # a transaction's half message
    (break_utf8, "PROPERTIES"),
    (drop_separator, "PROPERTIES"),
]


@pytest.fixture(params=["c", "python"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(record, "_native", None)
    else:
        assert codec._native is not None
    return request.param


@pytest.mark.parametrize("change, field", CASES, ids=[f"{f}-{c.__name__}" for c, f in CASES])
@pytest.mark.parametrize("n, bad", [(1, 0), (40, 0), (40, 23), (40, 39)])
def test_a_batch_with_one_bad_record_is_refused_whole_and_nothing_is_written(
    tmp_path: Path, make_config, path: str, change, field: str, n: int, bad: int
) -> None:
    with MessageStore(make_config(tmp_path / "s"), start_services=False) as store:
        store.put_encoded(batch_of(3))
        before = snapshot(store.root), store.commitlog.max_offset, store.max_offset("Checked", 0)
        batch = tampered(batch_of(n), bad, change)
        with pytest.raises(InvalidMessageError, match=rf"record {bad} of {n}: {field}="):
            store.put_encoded(batch)
        with pytest.raises(InvalidMessageError, match=rf"record {bad} of {n}: {field}="):
            EncodedBatch.from_bytes(batch.to_bytes())  # what the broker does with a send
        after = snapshot(store.root), store.commitlog.max_offset, store.max_offset("Checked", 0)
        assert after == before


def test_the_error_names_the_value_and_what_it_must_be(path: str) -> None:
    batch = tampered(batch_of(5), 2, flip_body)
    stored = int.from_bytes(bytes(batch.data)[fields(batch, 2)["BODYCRC"] :][:4], "big")
    with pytest.raises(InvalidMessageError) as err:
        batch.check_structure()
    assert f"record 2 of 5: BODYCRC={stored} (expected " in str(err.value)
    assert "crc32(body)" in str(err.value)
    batch = tampered(batch_of(5), 4, set_int("SYSFLAG", 4, 0x30))
    with pytest.raises(InvalidMessageError, match=r"SYSFLAG=0x30 \(expected 0x0\)"):
        batch.check_structure()


def test_the_c_and_python_checks_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    batch = batch_of(30)
    guarded = set()  # bytes a change of which must be refused: sizes, MAGIC, CRC, flags,
    for i in range(len(batch)):  # lengths, the body and the topic
        at = fields(batch, i)
        start = at["BODYCRC"] - 8
        guarded.update(range(start, start + 12))
        guarded.update(range(at["SYSFLAG"], at["SYSFLAG"] + 4))
        guarded.update(range(at["BODY"] - 4, at["PROPERTIES"]))
    cases: list[tuple[int, bytes]] = [(-1, bytes(batch.data))]
    for _ in range(300):  # single changed bytes anywhere, as a bad link would do
        data = bytearray(batch.data)
        where = int(rng.integers(len(data)))
        data[where] ^= int(rng.integers(1, 256))
        cases.append((where, bytes(data)))
    args = (batch.sizes, batch.topics, batch.topic_idx)

    def answers() -> list[tuple[int, int] | str]:
        out: list[tuple[int, int] | str] = []
        for _where, data in cases:
            try:
                out.append(codec.verify_records(data, *args))
            except InvalidMessageError as exc:
                out.append(str(exc))
        return out

    with_c = answers()
    monkeypatch.setattr(record, "_native", None)
    assert answers() == with_c
    assert with_c[0] == (20, 49)
    missed = [w for (w, _), a in zip(cases, with_c) if w in guarded and not isinstance(a, str)]
    assert missed == []


def test_a_producer_batch_passes_as_it_is(tmp_path: Path, make_config, path: str) -> None:
    props = {"note": "déjà vu", "ünï": "ok"}
    batch = codec.encode_batch(
        [Message("Checked", b"x" * (i + 1), keys=["a", "b"], properties=props) for i in range(20)]
    )
    with MessageStore(make_config(tmp_path / "s"), start_services=False) as store:
        store.put_encoded(EncodedBatch.from_bytes(batch.to_bytes()))
        got = store.get("g", "Checked", 0, 0, 32).messages
        assert [m.properties["note"] for m in got] == ["déjà vu"] * 20
