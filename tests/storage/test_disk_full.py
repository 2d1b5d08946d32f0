"""A full disk: writes are refused with a clear error and resume once there is room;
nothing is left half-allocated; a store on a full disk opens and serves all it holds.

RocketMQ refuses writes over ``diskSpaceWarningLevelRatio`` (0.90). Here the issue
was worse: a raw ``OSError``, a 0-byte CommitLog file left by the failed allocation,
and a store that then never opened again (``posix_fallocate`` on that file, ENOSPC).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from storage import DiskFullError, GetStatus, Message, MessageStore, PutResult
from storage.mapped_file import offset_to_name
from storage.store import disk_used_ratio


def test_writes_are_refused_over_the_warning_level_and_resume_below_it(
    tmp_path: Path, make_config
) -> None:
    usage, now = [0.5], [1_000.0]
    cfg = make_config(tmp_path / "s")  # disk_space_warning_level_ratio: 0.90
    with MessageStore(
        cfg, disk_usage=lambda: usage[0], clock=lambda: now[0], start_services=False
    ) as store:
        first = store.put(Message("D", b"before"))
        usage[0] = 0.93
        now[0] += 1  # past the 100 ms between two looks at the disk
        with pytest.raises(
            DiskFullError,
            match=r"disk_used_ratio=0\.930 is over "
            r"disk_space_warning_level_ratio=0\.9",
        ):
            store.put(Message("D", b"refused"))
        assert store.disk_full and store.stats()["disk_full"] is True
        assert store.stats()["disk_used_ratio"] == 0.93
        assert store.max_offset("D", 0) == 1  # nothing of it written
        assert store.get("g", "D", 0, 0, 8).messages[0].msg_id == first.msg_id  # reads go on
        usage[0] = 0.89  # room again: the next put looks at once
        assert store.put(Message("D", b"after")).queue_offset == 1
        assert not store.disk_full


@pytest.fixture
def small_disk(tmpfs: Callable[[int], Path]) -> Path:
    """An 8 MiB tmpfs for the store (``tests/conftest.py``)."""
    return tmpfs(8)


def files_of(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def test_a_full_disk_refuses_writes_leaves_no_partial_file_and_the_store_reopens(
    small_disk: Path, make_config
) -> None:
    ballast = small_disk / "ballast"
    ballast.write_bytes(bytes(3 << 20))  # someone else's 3 MiB on the same disk
    cfg = make_config(
        small_disk / "store",
        commitlog_file_size=1 << 20,
        max_message_size=200_000,
        consume_queue_file_entries=64,
        index_hash_slots=97,
        index_max_entries=400,
    )
    acked: list[PutResult] = []
    with MessageStore(cfg) as store, pytest.raises(DiskFullError) as refused:
        for i in range(200):
            acked.append(store.put(Message("Full", os.urandom(100_000), keys=[f"k{i}"])))
    assert 20 < len(acked) < 60
    assert "disk" in str(refused.value)  # over the warning level, or no room for a file
    # every file is whole: no short, empty or half-allocated (.tmp) file
    sizes = files_of(small_disk / "store")
    assert not [name for name in sizes if name.endswith(".tmp")]
    assert {s for n, s in sizes.items() if n.startswith("commitlog/")} == {1 << 20}

    # an older version left the next CommitLog file at 0 bytes when its allocation failed
    last = max(int(n.split("/")[1]) for n in sizes if n.startswith("commitlog/"))
    (small_disk / "store" / "commitlog" / offset_to_name(last + (1 << 20))).touch()
    with MessageStore(cfg) as store:  # on the full disk: opens, serves every message
        for r in acked:
            got = store.get("g", "Full", 0, r.queue_offset, 1)
            assert got.status is GetStatus.FOUND and got.messages[0].msg_id == r.msg_id
            assert [m.msg_id for m in store.query_by_key("Full", f"k{r.queue_offset}")] == [
                r.msg_id
            ]
        with pytest.raises(DiskFullError):
            store.put(Message("Full", os.urandom(100_000)))
        assert store.stats()["disk_full"] is True  # what a broker's status shows
        assert store.max_offset("Full", 0) == len(acked)
        ballast.unlink()  # room again: writes resume
        r = store.put(Message("Full", os.urandom(100_000)))
        assert r.queue_offset == len(acked) and not store.disk_full
    sizes = files_of(small_disk / "store")
    assert {s for n, s in sizes.items() if n.startswith("commitlog/")} == {1 << 20}


def test_the_disk_is_measured_as_df_measures_it(tmp_path: Path, make_config) -> None:
    """The store's ratio is df's Use% and RocketMQ's: used / (used + available)."""
    with MessageStore(make_config(tmp_path / "s"), start_services=False) as store:
        ratio = store.stats()["disk_used_ratio"]
        st = os.statvfs(tmp_path)
        used = st.f_blocks - st.f_bfree
        assert ratio == pytest.approx(used / (used + st.f_bavail), abs=0.01)


def test_the_disk_ratio_is_of_the_space_a_writer_can_have(tmp_path: Path) -> None:
    # an ext4 with half its blocks reserved for root: df and RocketMQ read it as nearly
    # empty; reading the reserve as used (1 - available / total) called it 50 % full
    # before a byte was written, and a broker's pressure cleaning deleted fresh files
    image, where = tmp_path / "disk.img", tmp_path / "disk"
    where.mkdir()
    with open(image, "wb") as fh:
        fh.truncate(64 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", "-m", "50", str(image)], capture_output=True)
    mounted = (
        made.returncode == 0
        and (
            subprocess.run(["mount", "-o", "loop", str(image), str(where)], capture_output=True)
        ).returncode
        == 0
    )
    if not mounted:
        pytest.skip("cannot make and mount an ext4 image here (needs root and a loop device)")
    try:
        empty = disk_used_ratio(where)
        assert empty < 0.05
        free = shutil.disk_usage(where).free
        with open(where / "half", "wb") as fh:
            fh.write(b"x" * (free // 2))
            fh.flush()
            os.fsync(fh.fileno())
        assert 0.45 < disk_used_ratio(where) < 0.6
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_put_does_not_wait_for_the_disk_to_be_measured(tmp_path: Path, make_config) -> None:
    import threading
    import time

    usage, now = [0.5], [1_000.0]
    measuring, answer = threading.Event(), threading.Event()

    def slow_disk() -> float:  # statvfs on a busy disk
        measuring.set()
        answer.wait(10)
        return usage[0]

    cfg = make_config(tmp_path / "s")
    with MessageStore(cfg, disk_usage=slow_disk, clock=lambda: now[0]) as store:
        usage[0] = 0.93
        store.put(Message("D", b"a"))  # the measure is due: the disk watch takes it
        assert measuring.wait(10)
        assert store.put(Message("D", b"b")).queue_offset == 1  # taken meanwhile
        answer.set()
        deadline = time.monotonic() + 10
        while not store.disk_full and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.disk_full  # the watch's measure refuses what comes next
        with pytest.raises(DiskFullError):
            store.put(Message("D", b"refused"))
        usage[0] = 0.5  # room again: a store refusing writes measures at the next put
        assert store.put(Message("D", b"c")).queue_offset == 2
