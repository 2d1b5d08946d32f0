"""``storage.atomic_file.write_atomically``: a file replaced whole or not at all, on a
real directory; a write that fails half-way leaves the old file and no temp file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from storage.atomic_file import write_atomically


def test_a_new_file_and_a_replaced_one_hold_the_new_content(tmp_path: Path) -> None:
    path = tmp_path / "tables.json"
    write_atomically(path, "first")
    assert path.read_text(encoding="utf-8") == "first"
    write_atomically(path, b"second \xe2\x9c\x93")
    assert path.read_bytes() == b"second \xe2\x9c\x93"
    write_atomically(path, "third \u2713")  # a str goes as UTF-8
    assert path.read_bytes() == "third \u2713".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tables.json"]


def test_the_backup_keeps_the_previous_content(tmp_path: Path) -> None:
    path, bak = tmp_path / "topics.json", tmp_path / "topics.json.bak"
    write_atomically(path, "v1", backup=bak)
    assert not bak.exists()  # nothing before it
    write_atomically(path, "v2", tmp=tmp_path / "topics.json.tmp", backup=bak)
    assert (path.read_text(), bak.read_text()) == ("v2", "v1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["topics.json", "topics.json.bak"]


def test_a_write_that_fails_half_way_leaves_the_old_file(tmp_path: Path) -> None:
    """A file size limit (RLIMIT_FSIZE, as a full disk would) stops the write of the
    temp file after 64 KiB of its 1 MiB: the error is raised, the old file is whole and
    the partial temp file is gone. In a child process, so that the limit is its own."""
    path = tmp_path / "offsets.json"
    write_atomically(path, "old")
    child = textwrap.dedent(
        f"""
        import resource, signal, sys
        from pathlib import Path
        from storage.atomic_file import write_atomically
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
        try:
            write_atomically(Path({str(path)!r}), b"n" * (1 << 20), backup=Path({str(path)!r} + ".bak"))
        except OSError as exc:
            print("failed", exc.errno)
            sys.exit(0)
        print("written")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split()[0] == "failed", out.stdout + out.stderr
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["offsets.json"]  # no tmp, no .bak


def test_a_temp_path_that_cannot_be_written_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    write_atomically(path, "old")
    blocker = tmp_path / "a.json.tmp"
    blocker.mkdir()  # the temp file's name is taken by a directory
    with pytest.raises(IsADirectoryError):
        write_atomically(path, "new")
    assert path.read_text() == "old" and blocker.is_dir()
