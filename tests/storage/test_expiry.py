"""Expiry of CommitLog files by age (at delete hours) and by disk use (at once)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from store_sizes import STORE_SIZES

from storage import GetStatus, Message, MessageStore

NOW = 1_800_000_000.0
HOUR = time.localtime(NOW).tm_hour


def fill(store: MessageStore, files: int) -> None:
    """Writes until the CommitLog has ``files`` files: 20 messages a batch, each 1/2,000
    of a file (900 B with the small files, 512 KiB with the default 1 GiB ones)."""
    size = max(900, store.config.commitlog_file_size // 2000)
    body = b"z" * size
    while len(store.commitlog.files) < files:
        store.put_batch([Message("E", body, keys=["k"], queue_id=0) for _ in range(20)])


def age_all_but_last(store: MessageStore, hours: float) -> None:
    for mf in store.commitlog.files.files[:-1]:
        os.utime(mf.path, (NOW - hours * 3600, NOW - hours * 3600))


@pytest.mark.parametrize("sizes", STORE_SIZES, indirect=True)
def test_old_files_go_at_the_delete_hour(tmp_path: Path, make_config, sizes: str) -> None:
    files = 6 if sizes == "small" else 2  # 1 GiB and more written with the default sizes
    cfg = make_config(
        tmp_path / "s",
        file_reserved_hours=48,
        delete_when=f"{HOUR:02d}",
        delete_files_batch_max=100,
    )
    with MessageStore(
        cfg, clock=lambda: NOW, disk_usage=lambda: 0.1, start_services=False
    ) as store:
        fill(store, files)
        age_all_but_last(store, 47)
        assert store.clean_expired_files() == 0, "younger than file_reserved_hours"
        age_all_but_last(store, 49)
        deleted = store.clean_expired_files()
        assert deleted == files - 1 and len(store.commitlog.files) == 1, "the current file stays"
        new_min = store.min_offset("E", 0)
        assert new_min > 0
        got = store.get("g", "E", 0, 0)
        assert got.status is GetStatus.OFFSET_TOO_SMALL and got.next_offset == new_min
        assert store.get("g", "E", 0, new_min).status is GetStatus.FOUND
        assert all(
            m.commitlog_offset >= store.commitlog.min_offset
            for m in store.query_by_key("E", "k", max_count=1000)
        )


def test_not_at_the_delete_hour_nothing_goes(tmp_path: Path, make_config) -> None:
    other = (HOUR + 1) % 24
    cfg = make_config(tmp_path / "s", file_reserved_hours=1, delete_when=f"{other:02d}")
    with MessageStore(
        cfg, clock=lambda: NOW, disk_usage=lambda: 0.1, start_services=False
    ) as store:
        fill(store, 3)
        age_all_but_last(store, 100)
        assert store.clean_expired_files() == 0


def test_disk_pressure_deletes_at_once_whatever_the_age(tmp_path: Path, make_config) -> None:
    cfg = make_config(
        tmp_path / "s",
        file_reserved_hours=1000,
        delete_when=f"{(HOUR + 3) % 24:02d}",
        disk_max_used_ratio=0.75,
        delete_files_batch_max=100,
        disk_space_warning_level_ratio=1.0,  # writes go on at 95% here: expiry is tested
    )
    usage = [0.95]

    def probe() -> float:
        return usage[0]

    with MessageStore(cfg, clock=lambda: NOW, disk_usage=probe, start_services=False) as store:
        fill(store, 5)
        files_before = len(store.commitlog.files)
        calls = {"n": 0}

        def shrinking() -> float:
            calls["n"] += 1
            return 0.95 if calls["n"] <= 2 else 0.5

        store._disk_usage = shrinking
        assert store.clean_expired_files() == 2
        assert len(store.commitlog.files) == files_before - 2
        store._disk_usage = lambda: 0.99
        store.clean_expired_files()
        assert len(store.commitlog.files) == 1, "never the file being written"


def test_over_the_max_used_ratio_only_expired_files_go_but_at_any_hour(
    tmp_path: Path, make_config
) -> None:
    # RocketMQ's CleanCommitLogService: over diskMaxUsedSpaceRatio files past their
    # reserved time go without waiting for deleteWhen; young files stay until the disk is
    # over diskSpaceCleanForciblyRatio
    cfg = make_config(
        tmp_path / "s",
        file_reserved_hours=48,
        delete_when=f"{(HOUR + 3) % 24:02d}",
        delete_files_batch_max=100,
        disk_space_warning_level_ratio=1.0,
    )
    assert (cfg.disk_max_used_ratio, cfg.disk_clean_forcibly_ratio) == (0.75, 0.85)
    with MessageStore(
        cfg, clock=lambda: NOW, disk_usage=lambda: 0.80, start_services=False
    ) as store:
        fill(store, 4)
        age_all_but_last(store, 47)
        assert store.clean_expired_files() == 0, "young files stay at 80 %"
        age_all_but_last(store, 49)
        assert store.clean_expired_files() == 3 and len(store.commitlog.files) == 1


def _mapped(path: Path) -> bool:
    with open("/proc/self/maps") as fh:
        return any(str(path) in line for line in fh)  # " (deleted)" once unlinked


@pytest.mark.parametrize("sizes", STORE_SIZES, indirect=True)
def test_a_file_expires_while_a_pull_holds_a_view_of_its_records(
    tmp_path: Path, make_config, sizes: str
) -> None:
    # a broker answers pulls with views of the CommitLog (get_raw(view=True)), which Ray
    # copies once after the call returns: the file may expire in between
    cfg = make_config(tmp_path / "s", file_reserved_hours=1, delete_when=f"{HOUR:02d}")
    with MessageStore(
        cfg, clock=lambda: NOW, disk_usage=lambda: 0.1, start_services=False
    ) as store:
        fill(store, 3)
        first = store.commitlog.files.files[0]
        held = store.get_raw("g", "E", 0, 0, max_count=10, view=True)
        copied = store.get_raw("g", "E", 0, 0, max_count=10)
        assert isinstance(held.data, memoryview) and isinstance(copied.data, bytes)
        assert held.data == copied.data and held.count == copied.count == 10
        age_all_but_last(store, 2)
        assert store.clean_expired_files() == 2  # no BufferError for the view
        assert not first.path.exists() and held.data == copied.data  # still readable
        assert _mapped(first.path)
        with pytest.raises(ValueError, match="closed"):
            first.read(0, 8)  # the store's own handle is closed
        assert store.get_raw("g", "E", 0, 0, view=True).status is GetStatus.OFFSET_TOO_SMALL
        del held
        assert not _mapped(first.path)  # unmapped with the last view
