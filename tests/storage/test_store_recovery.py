"""Crash recovery: nothing acknowledged under SYNC_FLUSH is lost, nothing corrupt is served."""

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
from store_sizes import STORE_SIZES

from storage import GetStatus, Message, MessageStore, StoreConfig, codec, record

CHILD = textwrap.dedent(
    """
    import json, sys
    from storage import Message, MessageStore, StoreConfig
    cfg = StoreConfig(**json.loads(sys.argv[1]))
    store = MessageStore(cfg)
    i = 0
    while True:
        batch = [Message("Crash", f"m{i + j}".encode(), keys=[f"key{i + j}"], queue_id=(i + j) % 3)
                 for j in range(7)]
        for r in store.put_batch(batch):
            print(json.dumps([r.msg_id, r.offset_msg_id, r.commitlog_offset, r.queue_id,
                              r.queue_offset]), flush=True)
        i += 7
    """
)


def run_and_kill(cfg: StoreConfig, acked_wanted: int) -> list[list]:
    """Start a child appending with the config, SIGKILL it once it acked enough."""
    args = {
        k: getattr(cfg, k)
        for k in (
            "store_dir",
            "flush_disk_type",
            "commitlog_file_size",
            "consume_queue_file_entries",
            "index_hash_slots",
            "index_max_entries",
            "max_message_size",
            "flush_interval_consume_queue_ms",
            "store_host",
        )
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(args)], stdout=subprocess.PIPE, text=True
    )
    acked = []
    assert proc.stdout is not None
    for line in proc.stdout:
        acked.append(json.loads(line))
        if len(acked) >= acked_wanted:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return acked


def body_of(msg_id_row: list) -> bytes:
    return msg_id_row[0]


def check_all_acked(store: MessageStore, acked: list[list]) -> None:
    for uniq, offset_id, phys, qid, qoff in acked:
        m = store.message_at(phys)
        assert m.msg_id == uniq and (m.queue_id, m.queue_offset) == (qid, qoff)
        assert store.message_by_id(offset_id).msg_id == uniq
        key = f"key{m.body.decode()[1:]}"
        assert [x.msg_id for x in store.query_by_key("Crash", key)] == [uniq]
        got = store.get("g", "Crash", qid, qoff, 1)
        assert got.messages[0].msg_id == uniq


@pytest.mark.parametrize("sizes", STORE_SIZES, indirect=True)
def test_sigkill_under_sync_flush_loses_nothing_acknowledged(tmp_path: Path, make_config) -> None:
    cfg = make_config(tmp_path / "s", flush_disk_type="SYNC_FLUSH")
    acked = run_and_kill(cfg, 2000)
    assert (tmp_path / "s" / "abort").exists()
    with MessageStore(cfg) as store:
        assert store.abnormal_start
        check_all_acked(store, acked)
        # every queue is dense and every served record is intact
        for qid in range(3):
            offset = 0
            while offset < store.max_offset("Crash", qid):
                got = store.get("g", "Crash", qid, offset, 64)
                assert got.status is GetStatus.FOUND
                assert [m.queue_offset for m in got.messages] == list(
                    range(offset, offset + len(got.messages))
                )
                offset = got.next_offset


@pytest.mark.parametrize("sizes", STORE_SIZES, indirect=True)
def test_torn_tail_record_is_never_served(tmp_path: Path, make_config) -> None:
    cfg = make_config(tmp_path / "s", flush_disk_type="SYNC_FLUSH")
    acked = run_and_kill(cfg, 300)
    with MessageStore(cfg, start_services=False) as store:
        end = store.commitlog.max_offset
        counts = [store.max_offset("Crash", q) for q in range(3)]
        store.put(Message("Crash", b"torn-to-be", queue_id=0))
        mf = store.commitlog.files.last()
        assert mf is not None
    # a crash mid-write: reopen with abort present and the last record's body half-written
    (tmp_path / "s" / "abort").touch()
    rel = end - int(mf.path.name)
    with open(mf.path, "r+b") as fh:  # in place: the file may be a gigabyte
        fh.seek(rel)
        size = int.from_bytes(fh.read(4), "big")
        fh.seek(rel + size - 20)
        fh.write(bytes(20))  # torn: the tail never reached the disk
        fh.seek(rel + codec.HEADER.size)
        flipped = fh.read(1)[0] ^ 0xFF
        fh.seek(rel + codec.HEADER.size)
        fh.write(bytes([flipped]))
    with MessageStore(cfg) as store:
        assert store.commitlog.max_offset == end
        assert [store.max_offset("Crash", q) for q in range(3)] == counts
        assert all(m.body != b"torn-to-be" for m in store.get("g", "Crash", 0, 0, 1000).messages)
        check_all_acked(store, acked)
        r = store.put(Message("Crash", b"after", queue_id=0))
        assert r.commitlog_offset == end and r.queue_offset == counts[0]


def test_a_flipped_byte_sets_that_record_aside_and_keeps_what_follows(
    tmp_path: Path, make_config, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_config(tmp_path / "s", flush_disk_type="SYNC_FLUSH")
    acked = run_and_kill(cfg, 700)
    acked.sort(key=lambda row: row[2])
    last_file_start = (acked[-1][2] // cfg.commitlog_file_size) * cfg.commitlog_file_size
    in_last = [row for row in acked if row[2] >= last_file_start]
    victim = in_last[len(in_last) // 2]
    path = tmp_path / "s" / "commitlog" / f"{last_file_start:020d}"
    raw = bytearray(path.read_bytes())
    at = victim[2] - last_file_start
    size = int.from_bytes(raw[at : at + 4], "big")
    damaged = bytes(raw[at : at + size])
    raw[at + codec.HEADER.size] ^= 0x55  # first body byte
    path.write_bytes(bytes(raw))
    with caplog.at_level("ERROR", logger="raymq.storage"), MessageStore(cfg) as store:
        check_all_acked(store, [row for row in acked if row != victim])
        got = store.get("g", "Crash", victim[3], victim[4], 1)
        assert got.status is GetStatus.NO_MATCHED_MESSAGE and got.next_offset == victim[4] + 1
        original = codec.decode_record(damaged)[0]
        assert original.msg_id == victim[0]
        assert store.query_by_key("Crash", original.keys[0]) == []
    saved = tmp_path / "s" / "quarantine" / f"{victim[2]:020d}.damaged"
    assert saved.read_bytes()[codec.HEADER.size + 1 :] == damaged[codec.HEADER.size + 1 :]
    assert f"[{victim[2]}, {victim[2] + size}) are damaged (BODYCRC=" in caplog.text
    assert str(saved) in caplog.text


@pytest.mark.parametrize("sizes", STORE_SIZES, indirect=True)
def test_queues_and_index_are_rebuilt_from_the_commitlog(tmp_path: Path, make_config) -> None:
    import shutil

    cfg = make_config(tmp_path / "s", flush_disk_type="SYNC_FLUSH")
    acked = run_and_kill(cfg, 500)
    for part in ("consumequeue", "index", "checkpoint"):
        path = tmp_path / "s" / part
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    with MessageStore(cfg) as store:
        check_all_acked(store, acked)
        assert sum(store.max_offset("Crash", q) for q in range(3)) >= len(acked)


def test_keys_stored_at_many_times_are_indexed_as_one_put_per_time(tmp_path: Path) -> None:
    """What a rebuild or a slave indexes (``IndexService.put_stamped``): one put per store
    timestamp, the earliest first, each key in its order. Byte for byte the index a put
    per distinct timestamp makes, with a sort in place of a mask over every key for each
    timestamp (as many timestamps as keys, for records stored one a millisecond)."""
    from storage.index_file import IndexService

    rng = np.random.default_rng(7)
    n = 3000
    hashes = rng.integers(1, 2**31 - 1, n)
    offsets = np.arange(n, dtype=np.int64) * 100
    stamps = 1_700_000_000_000 + rng.integers(0, 5_000, n)  # ms, some shared
    stamped = IndexService(tmp_path / "stamped", slots=101, max_entries=2000)
    stamped.put_stamped(hashes, offsets, stamps)
    each = IndexService(tmp_path / "each", slots=101, max_entries=2000)
    for value in np.unique(stamps).tolist():
        sel = stamps == value
        each.put(hashes[sel], offsets[sel], int(value))
    stamped.flush()
    each.flush()
    assert len(stamped.files) == 2  # it rolled over to a second file
    assert [f.path.read_bytes() for f in stamped.files] == [f.path.read_bytes() for f in each.files]
    key = int(hashes[1234])
    assert int(offsets[1234]) in stamped.query(key, 10, 0, 2**62)


@pytest.mark.parametrize("path", ["few", "numpy", "c"])
def test_an_index_put_cut_by_a_crash_loses_no_older_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    # a crash between a put's slot writes and its header write leaves slots pointing
    # past the header's count; the put that re-indexes those records after recovery
    # must still find every key indexed before (13 slots: every chain is shared), and
    # so must a query while such a put is under way
    from storage.index_file import HEADER_SIZE, IndexFile

    if path == "numpy":
        monkeypatch.setattr(record, "_native", None)
    size = 10 if path == "few" else 60
    rng = np.random.default_rng(11)
    older = rng.integers(0, 1 << 31, size=3 * size)
    cut = rng.integers(0, 1 << 31, size=size)
    f = IndexFile(tmp_path / "1", slots=13, max_entries=1000, create=True)
    for part in np.split(older, 3):
        f.put(part, part % 100_000, 1_700_000_000_000)
    header = f.file.read(0, HEADER_SIZE)
    count = f.index_count
    f.put(cut, cut % 100_000, 1_700_000_000_000)
    f.file.write_at(0, header)  # the crash: the header never got this put
    # what a query running beside that put (another thread) sees: slots moved, the
    # count not yet; every older key is still found
    f.index_count = count
    for h in older.tolist():
        assert h % 100_000 in f.query(h, 1000, 0, 1 << 62), h
    f.close()

    f = IndexFile(tmp_path / "1", slots=13, max_entries=1000, create=False)
    f.put(cut, cut % 100_000, 1_700_000_000_000)  # recovery indexes those records again
    for h in [*older.tolist(), *cut.tolist()]:
        assert h % 100_000 in f.query(h, 1000, 0, 1 << 62), h
    f.close()
