"""CommitLog files: fixed size, 20-digit names, records never straddle files."""

from __future__ import annotations

import os
import struct
import threading
import time
from pathlib import Path

import pytest

from storage import Message, MessageStore, StoreConfig, codec
from storage.mapped_file import MappedFile, MappedFileQueue, offset_to_name


def test_rolls_across_many_small_files_with_blank_markers(
    store: MessageStore, config: StoreConfig
) -> None:
    bodies = [bytes([i % 251]) * (300 + (i * 37) % 900) for i in range(600)]
    results = []
    for start in range(0, 600, 50):
        results += store.put_batch(
            [Message("Roll", b, queue_id=0) for b in bodies[start : start + 50]]
        )
    files = sorted((config_dir := store.root / "commitlog").iterdir())
    assert len(files) > 5
    size = config.commitlog_file_size
    for i, path in enumerate(files):
        assert path.name == f"{i * size:020d}" and len(path.name) == 20
        assert path.stat().st_size == size
    for r, body in zip(results, bodies):
        start_file = r.commitlog_offset // size
        end_file = (r.commitlog_offset + codec.FIXED_LEN + len(body) - 1) // size
        assert start_file == end_file, "a record straddles two files"
    for path in files[:-1]:
        data = path.read_bytes()
        pos = 0
        while True:
            total, magic = struct.unpack_from(">iI", data, pos)
            if magic == codec.BLANK_MAGIC:
                assert pos + total == size
                break
            assert magic == codec.MAGIC
            pos += total
    got = store.get("g", "Roll", 0, 0, 600)
    assert [m.body for m in got.messages] == bodies[: len(got.messages)]
    offset, seen = 0, []
    while offset < 600:
        res = store.get("g", "Roll", 0, offset, 64)
        seen += [m.body for m in res.messages]
        offset = res.next_offset
    assert seen == bodies
    assert config_dir.exists()


def test_a_batch_is_one_write_with_store_fields_patched(store: MessageStore) -> None:
    res = store.put_batch([Message("P", b"a" * 10, queue_id=1) for _ in range(20)])
    for i, r in enumerate(res):
        m = store.message_at(r.commitlog_offset)
        assert m.commitlog_offset == r.commitlog_offset
        assert m.queue_offset == i == r.queue_offset
        assert m.store_host == "10.1.2.3:10911"
        assert m.store_timestamp > 0
    offsets = [r.commitlog_offset for r in res]
    assert offsets == sorted(offsets)


def test_queue_id_field_is_written_from_the_batch(store: MessageStore) -> None:
    batch = codec.encode_batch([Message("Q", b"x", queue_id=0) for _ in range(3)])
    results = store.put_encoded(batch.with_queue(5)).results()
    assert [r.queue_id for r in results] == [5, 5, 5]
    assert [store.message_at(r.commitlog_offset).queue_id for r in results] == [5, 5, 5]
    assert store.max_offset("Q", 5) == 3 and store.max_offset("Q", 0) == 0


def test_a_commitlog_file_created_cold_is_warmed_while_it_is_written(
    store: MessageStore,
) -> None:
    """The first file has no prepared (warmed) successor to take: it is warmed in the
    background from its creation, so the first appends do not each fault pages in."""
    files = store.commitlog.files
    assert files.warming is None
    store.put_batch([Message("Warm", b"x", queue_id=0)])
    assert files.warming is not None and files.warming.result(30) is True
    # ConsumeQueue files take small appends: they are not warmed
    assert all(cq.files.warming is None for cq in store._cqs.values())
    assert [m.body for m in store.get("g", "Warm", 0, 0, 1).messages] == [b"x"]
    # a store opened again writes on into its last file: that one is warmed too
    store.close()
    again = MessageStore(store.config)
    try:
        warming = again.commitlog.files.warming
        assert warming is not None and warming.result(30) is True
        again.put_batch([Message("Warm", b"y", queue_id=0)])
        assert [m.body for m in again.get("g", "Warm", 0, 0, 2).messages] == [b"x", b"y"]
    finally:
        again.close()


def test_the_warming_thread_yields_the_cores_to_everything_else(tmp_path: Path) -> None:
    """Faulting a file in takes a core for seconds: the thread doing it runs at the
    lowest priority, and only that thread (the process's own threads keep theirs)."""
    files = MappedFileQueue(tmp_path / "cl", 1 << 20, warm_new=True)
    try:
        files.create(0)
        assert files.warming is not None and files.warming.result(30) is True
        (warmer,) = [t for t in threading.enumerate() if t.name.startswith("raymq-warm")]

        def nice(tid: int) -> int:  # field 19 of /proc/<pid>/task/<tid>/stat
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            return int(stat.rsplit(")", 1)[1].split()[16])

        assert nice(warmer.native_id) == 19
        assert nice(threading.get_native_id()) == os.getpriority(os.PRIO_PROCESS, 0) != 19
    finally:
        files.close()


def test_a_file_created_after_its_queue_closed_starts_no_warming(tmp_path: Path) -> None:
    """A write that races a close and creates a file after it: the closed queue starts
    no warming thread again (it would idle there, warming for nobody)."""
    files = MappedFileQueue(tmp_path / "cl", 1 << 20, warm_new=True)
    files.create(0)
    first = files.warming
    assert first is not None and first.result(30) is True
    files.close()
    before = set(threading.enumerate())
    try:
        files.create(1 << 20)  # the racing write, arriving after the close
        started = [t.name for t in set(threading.enumerate()) - before]
        assert [n for n in started if n.startswith("raymq-warm")] == []
        assert files.warming is first
    finally:
        files.close()


@pytest.mark.default_sizes
def test_a_roll_to_the_next_1_gib_file_does_not_wait_for_its_warming(tmp_path: Path) -> None:
    """The next CommitLog file is created in the background and warmed after: a put
    that rolls waits for the creation (milliseconds), not the warming (2-3 s for a
    1 GiB file here), which once stalled every put for 2.2 s at each roll of the
    default files."""
    config = StoreConfig(store_dir=str(tmp_path / "s"), flush_disk_type="ASYNC_FLUSH")
    assert config.commitlog_file_size == 1 << 30  # the default
    store = MessageStore(config)
    try:
        batch = [Message("Roll", b"r" * 4000, queue_id=i % 4) for i in range(256)]  # ~1 MiB
        slowest_roll = 0.0
        while len(store.commitlog.files) < 3:
            before = len(store.commitlog.files)
            t = time.perf_counter()
            store.put_batch(batch)
            if len(store.commitlog.files) > before > 0:
                slowest_roll = max(slowest_roll, time.perf_counter() - t)
        assert 0 < slowest_roll < 1.0, f"a put that rolled took {slowest_roll:.2f}s"
        warming = store.commitlog.files.warming
        assert warming is not None and warming.result(60) is True  # it was warmed after
    finally:
        store.close()
        for f in (tmp_path / "s").rglob("*"):
            if f.is_file():
                f.unlink()


def test_a_flush_leaves_the_other_threads_running(tmp_path: Path) -> None:
    # mmap.flush (msync) holds the GIL: flushing 64 MiB here froze every other thread
    # (a broker's event loop) for ~50 ms; the flush must wait in the kernel without it
    mf = MappedFile(tmp_path / offset_to_name(0), 64 << 20, create=True)
    try:
        mf.append(os.urandom(1 << 20) * 64)
        done = threading.Event()
        flusher = threading.Thread(target=lambda: (mf.flush(), done.set()))
        longest, last = 0.0, time.perf_counter()
        started = last
        flusher.start()
        while not done.is_set():
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
        longest = max(longest, time.perf_counter() - last)
        took = time.perf_counter() - started
        flusher.join()
        assert mf.flushed_position == 64 << 20
        # a flush holding the GIL stalls this thread for all of it; the scheduler of a busy
        # machine may take it away for a few ms now and then, never for half the flush
        assert longest < max(0.02, took / 2), (
            f"another thread stalled {longest * 1e3:.0f} ms of a {took * 1e3:.0f} ms flush"
        )
    finally:
        mf.destroy()
