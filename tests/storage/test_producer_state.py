"""Idempotent producers in the store: a retried run is stored once, whatever happened.

Real stores on temp dirs; the crash is a SIGKILL of a child process that writes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from storage import Message, MessageStore, codec
from storage.errors import (
    DuplicateSequenceError,
    InvalidMessageError,
    OutOfOrderSequenceError,
    ProducerFencedError,
)
from storage.replica import append_bytes  # noqa: F401 - the slave side is exercised below
from tests.storage.conftest import small_config


def run(topic: str, qid: int, n: int, pid: str, epoch: int, seq: int, tag: str = "m"):
    batch = codec.encode_batch([Message(topic, f"{tag}{seq}-{i}".encode()) for i in range(n)])
    return batch.with_queue(qid).with_sequence(pid, epoch, seq)


def wire(batch: codec.EncodedBatch) -> codec.EncodedBatch:
    """As the broker gets it: through the wire form."""
    return codec.EncodedBatch.from_bytes(batch.to_bytes())


def test_a_retried_run_is_answered_with_its_first_offsets_and_not_written(store) -> None:
    sent = run("T", 0, 3, "b.0:1", 0, 0)
    first = store.put_encoded(wire(sent))
    end = store.commitlog.max_offset
    again = store.put_encoded(wire(sent))  # the same bytes, as a producer resends them
    assert store.commitlog.max_offset == end
    assert store.max_offset("T", 0) == 3
    assert again.queue_offsets.tolist() == first.queue_offsets.tolist() == [0, 1, 2]
    assert again.commitlog_offsets.tolist() == first.commitlog_offsets.tolist()
    assert [r.msg_id for r in again.results()] == [r.msg_id for r in first.results()]
    # the next run follows; its own retry too
    nxt = store.put_encoded(wire(run("T", 0, 2, "b.0:1", 0, 3)))
    assert nxt.queue_offsets.tolist() == [3, 4]
    assert store.put_encoded(wire(run("T", 0, 2, "b.0:1", 0, 3))).queue_offsets.tolist() == [3, 4]
    assert store.max_offset("T", 0) == 5
    # the run's first record carries the mark that rebuilds the table, the others not
    m = store.message_at(int(first.commitlog_offsets[0]))
    assert m.body == b"m0-0" and m.properties[codec.PROP_PRODUCER_SEQ] == "b.0:1,0,0,3"
    assert (
        codec.PROP_PRODUCER_SEQ not in store.message_at(int(first.commitlog_offsets[1])).properties
    )


def test_gaps_old_sequences_and_old_epochs_are_refused_and_change_nothing(store) -> None:
    for seq in range(0, 30, 3):  # ten runs: only the last five are remembered
        store.put_encoded(wire(run("T", 1, 3, "p:7", 2, seq)))
    end = store.commitlog.max_offset
    with pytest.raises(OutOfOrderSequenceError, match="skips 30..30"):
        store.put_encoded(wire(run("T", 1, 3, "p:7", 2, 31)))
    with pytest.raises(DuplicateSequenceError, match="stored before"):
        store.put_encoded(wire(run("T", 1, 3, "p:7", 2, 0)))  # forgotten: too old
    with pytest.raises(DuplicateSequenceError):
        store.put_encoded(wire(run("T", 1, 2, "p:7", 2, 27)))  # part of a stored run
    with pytest.raises(ProducerFencedError, match="fenced by epoch 2"):
        store.put_encoded(wire(run("T", 1, 3, "p:7", 1, 30)))
    with pytest.raises(OutOfOrderSequenceError, match="new epoch starts at sequence 0"):
        store.put_encoded(wire(run("T", 1, 3, "p:7", 3, 5)))
    assert store.commitlog.max_offset == end and store.max_offset("T", 1) == 30
    store.put_encoded(wire(run("T", 1, 1, "p:7", 3, 0)))  # a new epoch from 0
    with pytest.raises(ProducerFencedError):  # and now the old one is fenced
        store.put_encoded(wire(run("T", 1, 3, "p:7", 2, 30)))
    # another producer, another queue: their own numbering, from 0: a later run that
    # overtook the first is not taken for the start (the first would look stored)
    with pytest.raises(OutOfOrderSequenceError, match="first run here starts at sequence 0"):
        store.put_encoded(wire(run("T", 1, 1, "q:1", 0, 40)))
    assert store.max_offset("T", 1) == 31
    store.put_encoded(wire(run("T", 1, 1, "q:1", 0, 0)))
    store.put_encoded(wire(run("T", 2, 1, "p:7", 3, 0)))
    assert store.max_offset("T", 1) == 32 and store.max_offset("T", 2) == 1


def test_a_merged_call_writes_only_its_new_runs(store) -> None:
    a = run("T", 0, 2, "p:1", 0, 0, "a")
    b = run("U", 1, 3, "p:1", 0, 0, "b")
    stored_a = store.put_encoded(wire(a))
    merged = codec.EncodedBatch.concat([a, b, run("T", 0, 1, "p:1", 0, 2, "c")])
    got = store.put_encoded(wire(merged))
    assert got.queue_offsets.tolist() == [0, 1, 0, 1, 2, 2]
    assert got.commitlog_offsets[:2].tolist() == stored_a.commitlog_offsets.tolist()
    assert store.max_offset("T", 0) == 3 and store.max_offset("U", 1) == 3
    bodies = [store.message_at(int(p)).body for p in got.commitlog_offsets.tolist()]
    assert bodies == [b"a0-0", b"a0-1", b"b0-0", b"b0-1", b"b0-2", b"c2-0"]
    # the same merged call again: all of it was stored
    end = store.commitlog.max_offset
    again = store.put_encoded(wire(merged))
    assert again.commitlog_offsets.tolist() == got.commitlog_offsets.tolist()
    assert store.commitlog.max_offset == end
    # a merged call of new runs only (a send lane's usual one): written as it came, and
    # each run remembered where it went
    fresh = codec.EncodedBatch.concat(
        [run("T", 0, 2, "p:1", 0, 3, "d"), run("U", 1, 1, "p:1", 0, 3, "e")]
    )
    got = store.put_encoded(wire(fresh))
    assert got.queue_offsets.tolist() == [3, 4, 3]
    retried = store.put_encoded(wire(fresh))
    assert retried.commitlog_offsets.tolist() == got.commitlog_offsets.tolist()
    assert store.max_offset("T", 0) == 5 and store.max_offset("U", 1) == 4


def test_a_merged_call_with_a_run_stored_long_ago_still_writes_its_new_runs(store) -> None:
    for seq in range(0, 18, 3):  # six runs: the first is no longer remembered where
        store.put_encoded(wire(run("T", 0, 3, "p:1", 0, seq)))
    fresh = run("U", 0, 2, "p:1", 0, 0, "u")
    got = store.put_encoded(wire(codec.EncodedBatch.concat([run("T", 0, 3, "p:1", 0, 0), fresh])))
    # the old run is answered as stored (where: unknown), the new one is written: were the
    # whole call refused as a duplicate, its producer would take the new run as stored too
    assert got.queue_offsets.tolist() == [-1, -1, -1, 0, 1]
    assert store.max_offset("T", 0) == 18 and store.max_offset("U", 0) == 2
    assert [store.message_at(int(p)).body for p in got.commitlog_offsets[3:]] == [b"u0-0", b"u0-1"]
    with pytest.raises(DuplicateSequenceError):  # alone, the old run says so as before
        store.put_encoded(wire(run("T", 0, 3, "p:1", 0, 0)))


def test_delayed_messages_of_an_idempotent_run(store) -> None:
    batch = codec.encode_batch([Message("T", b"later", delay_level=1), Message("T", b"now")])
    marked = batch.with_queue(0).with_sequence("p:1", 0, 0)
    first = store.put_encoded(wire(marked))
    end = store.commitlog.max_offset
    again = store.put_encoded(wire(marked))
    assert again.commitlog_offsets.tolist() == first.commitlog_offsets.tolist()
    assert store.commitlog.max_offset == end


def test_bad_runs_are_refused_on_the_wire(store) -> None:
    good = run("T", 0, 2, "p:1", 0, 0)
    with pytest.raises(InvalidMessageError, match="producer_id"):
        good.with_sequence("bad id,with comma", 0, 0)
    mixed = codec.EncodedBatch.concat([good, run("T", 1, 1, "p:1", 0, 0)])
    spanning = codec.EncodedBatch(**{**mixed.__dict__, "seq_runs": np.array([[0, 0]])})
    with pytest.raises(InvalidMessageError, match="spans two queues"):
        store.put_encoded(wire(spanning))
    plain = codec.encode_batch([Message("T", b"x")]).with_queue(0)
    with pytest.raises(InvalidMessageError, match="several producers"):
        codec.EncodedBatch.concat([good, run("T", 0, 1, "p:2", 0, 0)])
    with pytest.raises(InvalidMessageError, match="several producers"):
        codec.EncodedBatch.concat([good, plain])
    assert store.commitlog.max_offset == 0


def test_the_table_survives_a_clean_restart_and_a_truncation(tmp_path: Path) -> None:
    cfg = small_config(tmp_path / "s")
    with MessageStore(cfg) as store:
        first = store.put_encoded(wire(run("T", 0, 2, "p:1", 0, 0)))
        store.put_encoded(wire(run("T", 0, 2, "p:1", 0, 2)))
    with MessageStore(cfg) as store:
        again = store.put_encoded(wire(run("T", 0, 2, "p:1", 0, 0)))
        assert again.commitlog_offsets.tolist() == first.commitlog_offsets.tolist()
        assert store.max_offset("T", 0) == 4
        # a slave cut back to the first run forgets the second: it may be written again
        store.truncate_commitlog(
            int(first.commitlog_offsets[-1])
            + store.message_at(int(first.commitlog_offsets[-1])).store_size
        )
        assert store.put_encoded(wire(run("T", 0, 2, "p:1", 0, 2))).queue_offsets.tolist() == [2, 3]


def test_a_slave_knows_what_its_master_stored(tmp_path: Path) -> None:
    with (
        MessageStore(small_config(tmp_path / "m")) as master,
        MessageStore(small_config(tmp_path / "s")) as slave,
    ):
        stored = [master.put_encoded(wire(run("T", q, 3, "p:9", 0, 0))) for q in range(3)]
        pos = 0
        while pos < master.commitlog.max_offset:
            chunk = master.read_commitlog(pos, 1000)
            pos = slave.append_commitlog(pos, chunk)
        end = slave.commitlog.max_offset
        for q in range(3):  # the retries reach the slave, promoted
            got = slave.put_encoded(wire(run("T", q, 3, "p:9", 0, 0)))
            assert got.commitlog_offsets.tolist() == stored[q].commitlog_offsets.tolist()
        assert slave.commitlog.max_offset == end
        with pytest.raises(OutOfOrderSequenceError):
            slave.put_encoded(wire(run("T", 0, 1, "p:9", 0, 4)))


CHILD = textwrap.dedent(
    """
    import json, sys
    from storage import Message, MessageStore, StoreConfig, codec
    cfg = StoreConfig(**json.loads(sys.argv[1]))
    store = MessageStore(cfg)
    seq = [0, 0, 0, 0]
    for i in range(int(sys.argv[2])):
        q = i % 4
        batch = codec.encode_batch([Message("Idem", f"{i}-{j}".encode()) for j in range(3)])
        r = store.put_encoded(batch.with_queue(q).with_sequence("p:1", 0, seq[q]))
        print(json.dumps([i, q, seq[q], r.commitlog_offsets.tolist()]), flush=True)
        seq[q] += 3
    sys.stdin.read()  # wait for the SIGKILL: no clean close
    """
)


@pytest.mark.parametrize("flush", ["SYNC_FLUSH", "ASYNC_FLUSH"])
def test_after_a_sigkill_every_batch_retried_is_stored_once(tmp_path: Path, flush: str) -> None:
    """10,000 acknowledged batches, SIGKILL, restart, every one of them retried."""
    cfg = small_config(
        tmp_path / "s",
        flush_disk_type=flush,
        commitlog_file_size=4 << 20,
        consume_queue_file_entries=100_000,
        index_hash_slots=4099,
        index_max_entries=200_000,
        producer_snapshot_interval_ms=200,
    )
    args = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__ if k != "message_delay_level"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(args), "10000"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    acked = []
    assert proc.stdout is not None
    for line in proc.stdout:
        acked.append(json.loads(line))
        if len(acked) >= 10_000:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with MessageStore(cfg) as store:
        counts = [store.max_offset("Idem", q) for q in range(4)]
        assert sum(counts) >= 3 * len(acked)  # nothing acknowledged lost
        replays = {"answered": 0, "duplicate": 0}
        for i, q, seq, offsets in acked:
            batch = codec.encode_batch([Message("Idem", f"{i}-{j}".encode()) for j in range(3)])
            try:
                got = store.put_encoded(batch.with_queue(q).with_sequence("p:1", 0, seq))
            except DuplicateSequenceError:
                replays["duplicate"] += 1  # stored long ago: refused, not written
            else:
                assert got.commitlog_offsets.tolist() == offsets
                replays["answered"] += 1
        assert [store.max_offset("Idem", q) for q in range(4)] == counts  # 0 stored twice
        assert replays["answered"] == 4 * 5  # the last 5 runs of each queue, with offsets
        assert replays["duplicate"] == len(acked) - 4 * 5
        bodies = []
        for q in range(4):
            offset = 0
            while offset < counts[q]:
                got_q = store.get("g", "Idem", q, offset, 1000).messages
                bodies += [m.body for m in got_q]
                offset += len(got_q)
        assert len(bodies) == len(set(bodies)) == sum(counts)


def test_a_reserved_slot_is_bound_in_place_and_rebuilds_the_table_as_a_copy_does(
    tmp_path: Path,
) -> None:
    """An idempotent producer's encoder reserves PRODUCER_SEQ in the first record
    (codec.seq_slot): binding patches it in place, the broker stores it as any run, and
    a replay of the CommitLog finds the same runs as the live table; a slot never bound
    is not stored."""
    from storage import producer_state
    from storage._fast_encode import encode_plain

    gen, born = codec.UniqueKeyGenerator(), codec.host_to_bytes("127.0.0.1:1")

    def slotted(n: int, tag: str) -> codec.EncodedBatch:
        msgs = [Message("T", f"{tag}-{i}".encode(), tags="x") for i in range(n)]
        batch = encode_plain(msgs, 1 << 20, 1, born, gen, codec.seq_slot("p:1"))
        assert batch is not None and batch.seq_slot_at is not None
        return batch

    with MessageStore(small_config(tmp_path / "s")) as store:
        first = slotted(20, "a")
        records = bytes(first.data)
        bound = first.with_sequence("p:1", 0, 0, 1)
        assert bound.data.obj is first.data.obj  # type: ignore[union-attr]  # not copied
        assert len(bound.data) == len(records)  # same records, a few bytes rewritten
        done = store.put_encoded(wire(bound))
        again = store.put_encoded(wire(bound))  # a retry of the same bytes: stored once
        assert again.queue_offsets.tolist() == done.queue_offsets.tolist() == list(range(20))
        m = store.message_at(int(done.commitlog_offsets[0]))
        assert m.body == b"a-0"
        assert m.properties[codec.PROP_PRODUCER_SEQ] == f"p:1,{0:010d},{0:019d},{20:010d}"
        # bound again (a new epoch after the first binding was given up): rewritten
        second = slotted(30, "b")
        second.with_sequence("p:1", 0, 20, 1)
        later = store.put_encoded(wire(second.with_sequence("p:1", 1, 0, 1)))
        assert later.queue_offsets.tolist() == list(range(20, 50))
        with pytest.raises(ProducerFencedError):
            store.put_encoded(wire(slotted(8, "c").with_sequence("p:1", 0, 20, 1)))
        # a slotted batch sent without its numbers (a plain put) is refused: a batch that
        # numbers no run carries no PRODUCER_SEQ, not even a slot never bound
        end = store.commitlog.max_offset
        with pytest.raises(InvalidMessageError, match="numbers no run"):
            store.put_encoded(wire(slotted(10, "d").with_queue(2)))
        assert store.commitlog.max_offset == end
        # a slot reserved for another producer id is refused and left as it was
        other = slotted(10, "e")
        before = bytes(other.data)
        with pytest.raises(InvalidMessageError, match="slot"):
            other.with_sequence("p:22", 0, 0, 1)
        assert bytes(other.data) == before
        replayed = producer_state.ProducerStateTable()
        found = producer_state.replay(replayed, store.commitlog, 0, store.commitlog.max_offset)
        assert found == 2  # the two bound runs

        # the same runs (the last-seen time is the store time of each: a millisecond
        # apart between the live put and the record it wrote)
        def runs(table: producer_state.ProducerStateTable) -> list[list[object]]:
            return [q[:5] + q[6:] for q in table.snapshot(0)["queues"]]

        assert runs(replayed) == runs(store.producers)
        assert [q[:5] for q in replayed.snapshot(0)["queues"]] == [["p:1", "T", 1, 1, 30]]
