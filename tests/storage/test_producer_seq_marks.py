"""An idempotent batch's numbering, told twice, must agree (issue #27's follow-up).

The header (producer id, epoch, each run's first sequence and count) is what the put
de-duplicates by; the ``PRODUCER_SEQ`` of each run's first record is what recovery and
slaves rebuild the producer table from. A client that makes them differ, or plants a
mark where no run is numbered, is refused where the broker parses the batch, before
anything is stored. Real stores on temp dirs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from storage import Message, MessageStore, codec, producer_state, record
from storage._fast_encode import encode_plain
from storage.errors import InvalidMessageError
from tests.storage.conftest import small_config

GEN, BORN = codec.UniqueKeyGenerator(), codec.host_to_bytes("127.0.0.1:1")


def plain(n: int, tag: str, qid: int = 0, **props: str) -> codec.EncodedBatch:
    msgs = [Message("T", f"{tag}-{i}".encode(), properties=props or None) for i in range(n)]
    return codec.encode_batch(msgs).with_queue(qid)


def slotted(n: int, tag: str, pid: str = "p:1") -> codec.EncodedBatch:
    """As an idempotent producer's encoder makes it: a PRODUCER_SEQ slot reserved."""
    msgs = [Message("T", f"{tag}-{i}".encode()) for i in range(n)]
    batch = encode_plain(msgs, 1 << 20, 1, BORN, GEN, codec.seq_slot(pid))
    assert batch is not None and batch.seq_slot_at is not None
    return batch


def wire(batch: codec.EncodedBatch) -> codec.EncodedBatch:
    """As the broker gets it: through the wire form, parsed and checked there."""
    return codec.EncodedBatch.from_bytes(batch.to_bytes())


def header(batch: codec.EncodedBatch, **changes: object) -> codec.EncodedBatch:
    """The same records under another header (what a faulty or hostile client sends)."""
    return dataclasses.replace(batch, checked=False, **changes)  # type: ignore[arg-type]


def ends(store: MessageStore) -> tuple[int, list[int]]:
    return store.commitlog.max_offset, [store.max_offset("T", q) for q in range(3)]


def planted(batch: codec.EncodedBatch, i: int, value: str) -> codec.EncodedBatch:
    """``batch`` with a ``PRODUCER_SEQ=value`` added to record ``i``'s properties, its
    header unchanged (the bytes any client can write)."""
    view = memoryview(bytes(batch.data))
    starts = np.concatenate(([0], np.cumsum(batch.sizes, dtype=np.int64))).tolist()
    record = codec._marked(view[starts[i] : starts[i + 1]], value)
    sizes = batch.sizes.astype(np.int32)
    sizes[i] = len(record)
    data = bytes(view[: starts[i]]) + record + bytes(view[starts[i + 1] :])
    return header(batch, data=data, sizes=sizes)


def cases() -> dict[str, codec.EncodedBatch]:
    """Batches whose header and marks differ, each in one way (all structurally sound)."""
    good = plain(3, "x").with_sequence("p:1", 2, 6)  # marked "p:1,2,6,3"
    numbered = {"producer_id": "p:1", "producer_epoch": 2, "seq_runs": np.array([[0, 6]])}
    merged = codec.EncodedBatch.concat(
        [plain(2, "m", 1).with_sequence("p:1", 2, 0), plain(2, "n").with_sequence("p:1", 2, 6)]
    )
    return {
        "id": header(good, producer_id="p:2"),
        "epoch": header(good, producer_epoch=3),
        "first sequence": header(good, seq_runs=np.array([[0, 9]])),
        "first sequence, slot bound in place": header(
            slotted(8, "s").with_sequence("p:1", 2, 6, 0), seq_runs=np.array([[0, 5]])
        ),
        "count": plain(3, "x").with_runs("p:1", 2, [(0, 2, 6)]),  # marked 2, the run is 3
        "a merged call's second run": header(merged, seq_runs=np.array([[0, 0], [2, 7]])),
        "a mark that is not numbers": planted(header(plain(3, "x"), **numbered), 0, "p:1,2,six,3"),
        "no mark on a run's first record": header(plain(3, "x"), **numbered),
        # two marks alike on one record: a replay reads the first, a slave the last
        "two marks on a run's first record": planted(good, 0, "p:1,2,6,3"),
        "a mark inside a run": planted(good, 2, "p:1,2,6,3"),
        # a batch that numbers no run carries no mark at all
        "planted on a plain batch": planted(plain(3, "x"), 0, "p:1,2,6,3"),
        "planted on a plain batch's last record": planted(plain(3, "x"), 2, "p:1,2,6,3"),
        "a slot never bound": slotted(8, "u").with_queue(0),
    }


@pytest.mark.parametrize("case", list(cases()))
def test_a_batch_whose_marks_differ_from_its_header_is_refused_and_nothing_stored(
    store: MessageStore, case: str
) -> None:
    store.put_encoded(wire(plain(2, "before").with_sequence("p:1", 2, 0)))
    before = ends(store)
    with pytest.raises(InvalidMessageError, match="PRODUCER_SEQ"):
        store.put_encoded(wire(cases()[case]))
    # nor when handed to the store without the wire (a batch built in the broker)
    with pytest.raises(InvalidMessageError, match="PRODUCER_SEQ"):
        store.put_encoded(header(cases()[case]))
    assert ends(store) == before
    assert len(store.producers) == 1
    # the producer goes on where it was: nothing of the refused batch was taken
    assert (
        store.put_encoded(wire(plain(1, "next").with_sequence("p:1", 2, 2))).queue_offsets[0] == 2
    )


def test_the_count_of_marks_agrees_in_c_and_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """The records' check counts the PRODUCER_SEQ properties as it walks them; a name
    that only ends with PRODUCER_SEQ is another property."""
    batches = [*cases().values(), plain(5, "y", MY_PRODUCER_SEQ="1,2,3,4")]
    batches.append(plain(4, "z", MY_PRODUCER_SEQ="x").with_sequence("p:1", 0, 0))

    def counts() -> list[int | None]:
        return [codec._verify_records(b.data, b.sizes, b.topics, b.topic_idx)[2] for b in batches]

    assert codec._native is not None
    with_c = counts()
    monkeypatch.setattr(record, "_native", None)
    assert counts() == with_c
    assert with_c[-2:] == [0, 1]


def test_with_a_c_module_built_before_it_counted_marks_the_search_still_finds_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tree whose storage/_native was built before verify_records counted the marks
    (six fields, not seven) searches the records for them instead: same verdicts."""
    native = codec._native
    assert native is not None

    class Older:
        def __getattr__(self, name: str) -> object:
            return getattr(native, name)

        @staticmethod
        def verify_records(*args: object) -> tuple[object, ...]:
            return native.verify_records(*args)[:6]  # type: ignore[arg-type]

    monkeypatch.setattr(record, "_native", Older())
    for bad in cases().values():
        with pytest.raises(InvalidMessageError, match="PRODUCER_SEQ"):
            wire(bad)
    for good in (
        plain(3, "x", MY_PRODUCER_SEQ="p:1,0,0,3").with_sequence("p:1", 0, 0),
        plain(3, "x", MY_PRODUCER_SEQ="p:1,0,0,3"),
        slotted(8, "s").with_sequence("p:1", 0, 0, 0),
    ):
        assert codec._verify_records(good.data, good.sizes, good.topics, good.topic_idx)[2] is None
        wire(good)


def test_good_batches_are_stored_and_a_restart_rebuilds_the_table_the_puts_built(
    tmp_path: Path,
) -> None:
    """Correct batches of every shape pass (a bound slot, a copy marked, a merged call of
    several runs, a property whose name ends with PRODUCER_SEQ); refused ones in between
    change nothing; after a restart that replays the whole CommitLog (no snapshot), and
    on a slave that copied it, the table is the one the puts built."""
    cfg = small_config(tmp_path / "m")
    refused = 0
    with (
        MessageStore(cfg) as store,
        MessageStore(small_config(tmp_path / "s")) as slave,
    ):
        sent = [
            slotted(20, "a").with_sequence("p:1", 0, 0, 0),
            plain(3, "b", 1, MY_PRODUCER_SEQ="p:1,0,0,1").with_sequence("p:1", 0, 0),
            codec.EncodedBatch.concat(
                [
                    plain(2, "c", 2).with_sequence("p:1", 0, 0),
                    plain(2, "d").with_sequence("p:1", 0, 20),
                ]
            ),
            plain(2, "e", 1).with_sequence("p:2", 4, 0),
            plain(1, "f", 2, MY_PRODUCER_SEQ="x"),  # no numbering, no mark: a plain put
        ]
        for batch in sent:
            store.put_encoded(wire(batch))
            for bad in cases().values():
                with pytest.raises(InvalidMessageError):
                    store.put_encoded(wire(bad))
                refused += 1
        assert [store.max_offset("T", q) for q in range(3)] == [22, 5, 3]
        assert refused == len(sent) * len(cases())
        live = store.producers.snapshot(0)["queues"]
        assert sorted(q[:5] for q in live) == [
            ["p:1", "T", 0, 0, 22],
            ["p:1", "T", 1, 0, 3],
            ["p:1", "T", 2, 0, 2],
            ["p:2", "T", 1, 4, 2],
        ]
        pos = 0
        while pos < store.commitlog.max_offset:
            pos = slave.append_commitlog(pos, store.read_commitlog(pos, 4096))
        assert slave.commitlog.max_offset == store.commitlog.max_offset
        on_slave = slave.producers.snapshot(0)["queues"]

    for name in ("producer_state.json", "producer_state.json.bak"):  # replay it all
        (Path(cfg.store_dir) / "config" / name).unlink(missing_ok=True)
    with MessageStore(cfg) as store:
        replayed = store.producers.snapshot(0)["queues"]

    def runs(queues: list[list[object]]) -> list[list[object]]:
        # the last-seen time is each record's store time on a replay (not the put's clock)
        return sorted(q[:5] + q[6:] for q in queues)

    assert runs(replayed) == runs(on_slave) == runs(live)


def test_recovery_finds_a_mark_after_a_property_named_like_it() -> None:
    """A replay reads the first PRODUCER_SEQ pair, not the first text that looks like
    one: a name ending with PRODUCER_SEQ before it is another property's."""
    props = b"MY_PRODUCER_SEQ\x01p:9,9,9,9\x02PRODUCER_SEQ\x01p:1,0,4,2\x02"
    assert producer_state.pseq_value(props) == b"p:1,0,4,2"
    assert producer_state.pseq_value(b"MY_PRODUCER_SEQ\x01p:9,9,9,9\x02") is None
    assert codec.parse_seq_value(b"p:1,0000000003,0000000000000000007,0000001000") == (
        "p:1",
        3,
        7,
        1000,
    )
