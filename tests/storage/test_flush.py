"""Durability: SYNC_FLUSH puts share fsyncs."""

from __future__ import annotations

import threading
from pathlib import Path

from storage import Message, MessageStore, PutStatus


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
