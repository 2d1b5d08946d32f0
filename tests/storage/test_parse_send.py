"""``storage._native.parse_send`` (a send parsed and checked in one C call) against the
Python path of ``EncodedBatch.from_bytes`` it stands in for.

The C function only ever accepts: a blob of another shape, or one that fails a check,
goes to the Python path, which names the error. So on every blob, good or damaged,
``from_bytes`` must give the same batch or raise the same error with and without it,
and the usual sends (a single message, an idempotent producer's run) must take it.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from storage import InvalidMessageError, Message, codec, record
from storage._fast_encode import encode_plain
from storage.seq_slots import seq_slot

pytestmark = pytest.mark.skipif(
    record._native is None, reason="storage._native is not built (no compiler at install)"
)


class _WithoutParseSend:
    """The built C module minus ``parse_send``: the Python path of ``from_bytes``, with
    the same C record checks under it."""

    def __init__(self, native: Any) -> None:
        self._native = native

    def __getattr__(self, name: str) -> Any:
        if name == "parse_send":
            raise AttributeError(name)
        return getattr(self._native, name)


def _outcome(blob: bytes | memoryview | np.ndarray) -> tuple[str, Any]:
    try:
        batch = codec.EncodedBatch.from_bytes(blob)
    except InvalidMessageError as exc:
        return "error", str(exc)
    assert batch.checked
    fields = {
        name: value.tolist() if isinstance(value, np.ndarray) else value
        for name, value in batch.__dict__.items()
        if name not in ("data", "uniq_keys", "_uniform")
    }
    fields["data"] = bytes(batch.data)
    fields["uniq_keys"] = list(batch.uniq_keys)
    fields["body_range"] = batch.body_range()
    fields["wire"] = batch.to_bytes()
    return "batch", fields


def _both(blob: bytes | memoryview | np.ndarray, monkeypatch: pytest.MonkeyPatch) -> tuple:
    native = record._native
    with_c = _outcome(blob)
    monkeypatch.setattr(record, "_native", _WithoutParseSend(native))
    try:
        python = _outcome(blob)
    finally:
        monkeypatch.setattr(record, "_native", native)
    return with_c, python


def _uses_parse_send(blob: bytes) -> bool:
    from storage._crc import crc32_address
    from storage.record import CLIENT_SYSFLAGS, MAX_TOPIC_LEN

    return (
        record._native.parse_send(blob, CLIENT_SYSFLAGS, crc32_address, MAX_TOPIC_LEN) is not None
    )


def _idempotent(messages: list[Message], producer: str, epoch: int, seq: int) -> bytes:
    born = codec.host_to_bytes("127.0.0.1:1")
    batch = encode_plain(
        messages, 4 << 20, 1_700_000_000_000, born, codec.UniqueKeyGenerator(), seq_slot(producer)
    )
    assert batch is not None
    return batch.with_sequence(producer, epoch, seq, messages[0].queue_id).to_bytes()


def _usual_sends() -> list[bytes]:
    """Sends of the shapes parse_send takes: plain and idempotent, one message or many,
    keys, tags, properties, delays, the transactional and timer flags."""
    out = [
        codec.encode_batch([Message("Orders", b"x" * 100)]).to_bytes(),
        codec.encode_batch([Message("Orders", b"-")]).to_bytes(),
        codec.encode_batch(
            [
                Message("Orders", b"body%d" % i, tags="t", keys=[f"k{i}", "a"], queue_id=i % 3)
                for i in range(9)
            ]
        ).to_bytes(),
        codec.encode_batch(
            [Message("A", b"1", queue_id=1), Message("B-b_%|", b"2", properties={"p": "v"})]
        ).to_bytes(),
        codec.encode_batch(
            [Message("Later", b"d", delay_level=3), Message("Later", b"e", delay_level=1)]
        ).to_bytes(),
        _idempotent([Message("Orders", b"y" * 100)], "p-1", 0, 0),
        _idempotent([Message("Orders", b"y" * 100, keys="key")], "prod.2:x@h", 7, 123456789),
        _idempotent(
            [Message("Orders", b"m%d" % i, queue_id=2) for i in range(5)],
            "p-3",
            2**31 - 1,
            2**62 - 1,
        ),
    ]
    plain = codec.encode_batch([Message("Orders", b"t")])
    out.append(plain._evolve(transactional=True).to_bytes())
    out.append(plain._evolve(timer=True).to_bytes())
    return out


@pytest.mark.parametrize("i", range(10))
def test_the_usual_sends_take_parse_send_and_decode_as_the_python_path_does(
    i: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    blob = _usual_sends()[i]
    assert _uses_parse_send(blob)
    with_c, python = _both(blob, monkeypatch)
    assert with_c[0] == "batch"
    assert with_c == python
    # any buffer Ray or a socket hands over: a memoryview, a uint8 array
    assert _both(memoryview(blob), monkeypatch)[0] == python
    assert _both(np.frombuffer(blob, dtype=np.uint8), monkeypatch)[0] == python


def test_other_shapes_go_to_the_python_path_and_decode_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    many_runs = (
        codec.encode_batch([Message("Orders", b"r%d" % i) for i in range(6)])
        .with_runs("p-runs", 1, [(0, 2, 10), (2, 4, 40)])
        .to_bytes()
    )
    many_topics = codec.encode_batch([Message(f"T{i}", b"x") for i in range(70)]).to_bytes()
    for blob in (many_runs, many_topics):
        assert not _uses_parse_send(blob)
        with_c, python = _both(blob, monkeypatch)
        assert with_c[0] == "batch"
        assert with_c == python


def _damaged(blob: bytes, rng: random.Random) -> bytes:
    """One kind of damage a frame may carry: a byte changed, a count changed, bytes
    cut off or added."""
    b = bytearray(blob)
    kind = rng.randrange(5)
    if kind == 0:  # any byte
        at = rng.randrange(len(b))
        b[at] = rng.choice([0, 1, 2, 0x7F, 0x80, 0xFF, b[at] ^ 1])
    elif kind == 1:  # a byte of the head, the arrays or the first record's fields
        at = rng.randrange(min(len(b), 36 + 200))
        b[at] = rng.randrange(256)
    elif kind == 2:  # a count of the head
        at = 4 * rng.randrange(9)
        b[at : at + 4] = rng.choice([-1, 0, 1, 2, 64, 2**31 - 1, rng.randrange(100)]).to_bytes(
            4, "big", signed=True
        )
    elif kind == 3:
        del b[rng.randrange(len(b)) :]
    else:
        b += rng.randbytes(rng.randint(1, 8))
    return bytes(b)


@pytest.mark.parametrize("seed", range(6))
def test_damaged_sends_are_refused_or_taken_exactly_as_the_python_path_does(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    sends = _usual_sends()
    refused = 0
    for _ in range(400):
        blob = _damaged(rng.choice(sends), rng)
        with_c, python = _both(blob, monkeypatch)
        assert with_c == python, blob
        refused += with_c[0] == "error"
    assert refused > 100  # the damage was mostly of the kind the checks are there for


def test_a_mark_that_differs_from_the_runs_numbering_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = _idempotent([Message("Orders", b"z" * 10)], "p-mark", 3, 77)
    # the head's run says sequence 78 where the record's PRODUCER_SEQ says 77
    batch = codec.EncodedBatch.from_bytes(good)
    runs = np.array([[0, 78]], dtype=np.int64)
    bad = batch._evolve(seq_runs=runs).to_bytes()
    with_c, python = _both(bad, monkeypatch)
    assert with_c == python
    assert with_c[0] == "error" and "PRODUCER_SEQ" in with_c[1]


def _rule_breakers() -> dict[str, bytes]:
    """A send breaking one rule of the store's checks each, otherwise whole."""
    keyed = codec.encode_batch([Message("Orders", b"x" * 10, keys="k1")])
    delayed = codec.encode_batch([Message("Orders", b"d", delay_level=2)])
    run_blob = _idempotent(
        [Message("Orders", b"m%d" % i, queue_id=2) for i in range(5)], "p-3", 1, 5
    )
    run = codec.EncodedBatch.from_bytes(run_blob)
    lt = len("Orders")

    def patched(blob: bytes, at: int, value: int) -> bytes:
        return blob[:at] + bytes([value]) + blob[at + 1 :]

    i4 = np.dtype("<i4")
    return {
        "negative queue id": keyed._evolve(queue_ids=np.array([-1], i4)).to_bytes(),
        "negative delay level": delayed._evolve(delay_levels=np.array([-2], i4)).to_bytes(),
        "key owner past the records": keyed._evolve(key_owner=np.array([1], i4)).to_bytes(),
        "negative key owner": keyed._evolve(key_owner=np.array([-1], i4)).to_bytes(),
        "a topic with a space": keyed.to_bytes().replace(b"Orders", b"Ord rs"),
        "unique keys not ASCII": patched(keyed.to_bytes(), 36 + lt, 0xC3),
        "producer id not ASCII": patched(run_blob, 36 + lt + len(run.uniq_keys.raw), 0xC3),  # type: ignore[attr-defined]
        "a mark where no run is numbered": run._evolve(producer_id=None, seq_runs=None).to_bytes(),
        "a run over two queues": run._evolve(queue_ids=np.array([2, 2, 3, 2, 2], i4)).to_bytes(),
        "a run not from the first record": run._evolve(
            seq_runs=np.array([[1, 5]], np.int64)
        ).to_bytes(),
        "a negative sequence": run._evolve(seq_runs=np.array([[0, -1]], np.int64)).to_bytes(),
        # and marked so in the record, as the head numbers it
        "a negative sequence, its mark agreeing": run._evolve(
            seq_runs=np.array([[0, -1]], np.int64)
        )
        .to_bytes()
        .replace(b",%019d," % 5, b",%019d," % -1),
        "cut short": keyed.to_bytes()[:-1],
        "a byte too many": keyed.to_bytes() + b"\x00",
    }


@pytest.mark.parametrize("rule", list(_rule_breakers()))
def test_a_send_breaking_one_rule_is_refused_with_the_python_paths_error(
    rule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    blob = _rule_breakers()[rule]
    with_c, python = _both(blob, monkeypatch)
    assert python[0] == "error", rule
    assert with_c == python
