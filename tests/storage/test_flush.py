"""Durability: SYNC_FLUSH puts share fsyncs and honour their timeout; the
consume-queue flush follows its page and interval settings, and the checkpoint
never claims what it did not flush."""

from __future__ import annotations

import threading
from pathlib import Path

from storage import GetStatus, Message, MessageStore, PutStatus
from storage.checkpoint import CheckpointFile
from storage.consume_queue import UNIT
from storage.services import FlushConsumeQueueService


def test_sustained_sync_writers_share_fsyncs(tmp_path: Path, make_config) -> None:
    # RocketMQ's GroupCommitService: one flush serves every put waiting on it. Here 8
    # writers x 50 puts used to cost 393 fsyncs: each flush served one or two puts
    cfg = make_config(tmp_path / "s", flush_disk_type="SYNC_FLUSH", commitlog_file_size=1 << 22)
    with MessageStore(cfg, start_services=False) as store:
        store.put(Message("G", b"first"))
        before = store.stats()["commitlog_flushes"]
        go = threading.Barrier(8)
        statuses: list[PutStatus] = []

        def writer(w: int) -> None:
            go.wait()
            for i in range(50):
                r = store.put(Message("G", f"{w}-{i}".encode(), queue_id=w % 4))
                statuses.append(r.status)
                assert store.commitlog.flushed_offset >= r.commitlog_offset  # durable

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        fsyncs = store.stats()["commitlog_flushes"] - before
        assert statuses == [PutStatus.PUT_OK] * 400
        assert fsyncs <= 400 / 4, f"{fsyncs} fsyncs for 400 puts"
        assert sum(store.max_offset("G", q) for q in range(4)) == 401


def test_a_flush_slower_than_the_timeout_answers_flush_disk_timeout(
    tmp_path: Path, make_config
) -> None:
    # long enough for a real fsync on a loaded machine (the quick puts must make it),
    # waited out once by the put whose disk never answers
    cfg = make_config(tmp_path / "s", flush_disk_type="SYNC_FLUSH", sync_flush_timeout_ms=1000)
    with MessageStore(cfg, start_services=False) as store:
        assert store.put(Message("T", b"quick")).status is PutStatus.PUT_OK
        disk = threading.Event()  # the disk answers when the test says so
        store.commitlog.before_sync = disk.wait
        r = store.put(Message("T", b"slow"))
        assert r.status is PutStatus.FLUSH_DISK_TIMEOUT
        # stored and served all the same (RocketMQ's FLUSH_DISK_TIMEOUT), just not durable yet
        got = store.get("g", "T", 0, 1, 1)
        assert got.status is GetStatus.FOUND and got.messages[0].body == b"slow"
        assert store.commitlog.flushed_offset <= r.commitlog_offset
        disk.set()
        end = r.commitlog_offset + got.messages[0].store_size
        assert store.commitlog.wait_flushed(end, timeout_s=30)
        store.commitlog.before_sync = None
        assert store.put(Message("T", b"after")).status is PutStatus.PUT_OK


def durable_logics(store: MessageStore) -> int:
    """The CommitLog offset below which the checkpoint on disk vouches for the queues."""
    checkpoint = CheckpointFile(store.root / "checkpoint")
    try:
        return checkpoint.value.logics_offset
    finally:
        checkpoint.close()


def cq_flushed(store: MessageStore, topic: str, queue_id: int) -> int:
    cq = store.find_consume_queue(topic, queue_id)
    assert cq is not None
    return cq.files.flushed_offset // UNIT


def test_consume_queues_flush_by_pages_and_all_at_the_thorough_interval(
    tmp_path: Path, make_config
) -> None:
    cfg = make_config(
        tmp_path / "s",
        consume_queue_file_entries=4096,  # 80 KiB files: 2 pages are 409 entries
        flush_consume_queue_least_pages=2,
        flush_consume_queue_thorough_interval_ms=3_600_000,
    )
    with MessageStore(cfg, start_services=False) as store:
        busy = store.put_batch([Message("Busy", b"b", queue_id=0) for _ in range(500)])
        quiet = store.put_batch([Message("Quiet", b"q", queue_id=0) for _ in range(10)])
        service = FlushConsumeQueueService(store)
        service.run_once()  # not thorough: only the queue with 2 dirty pages
        assert cq_flushed(store, "Busy", 0) == 500
        assert cq_flushed(store, "Quiet", 0) == 0
        # the checkpoint claims no more than what is durable: up to Quiet's first record
        assert durable_logics(store) == quiet[0].commitlog_offset
        assert busy[-1].commitlog_offset < durable_logics(store)

    cfg = cfg.replace(flush_consume_queue_thorough_interval_ms=0)
    with MessageStore(cfg, start_services=False) as store:
        store.put_batch([Message("Quiet", b"q", queue_id=0) for _ in range(10)])
        FlushConsumeQueueService(store).run_once()  # thorough every time: all queues
        assert cq_flushed(store, "Quiet", 0) == 20
        assert durable_logics(store) == store.commitlog.max_offset
