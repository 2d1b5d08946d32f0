"""A file replaced whole or not at all: :func:`write_atomically`.

The new content goes to a temp file beside the file, is fsynced, and the temp file is
renamed over the file; then the directory is fsynced, so that the rename itself
survives a crash. A reader (or a restart after a crash) finds the old content or the
new, never a torn file. A write that fails on the way leaves the old file as it was and
removes its temp file.

Writers of one file take turns by themselves (they share the temp file's name).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["fsync_directory", "write_atomically"]


def fsync_directory(directory: Path) -> None:
    """Make the renames and creations in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(
    path: Path,
    data: bytes | str,
    *,
    tmp: Path | None = None,
    backup: Path | None = None,
    mode: int = 0o666,
) -> None:
    """Replace ``path``'s content with ``data`` (a ``str`` is written as UTF-8).

    ``tmp``: the temp file (default ``<name>.tmp`` beside ``path``). ``backup``: where
    the previous file is moved just before the rename (kept for a reader that finds
    the new file damaged); a crash between the two moves leaves only the backup.
    ``mode``: the new file's permissions (less the umask), 0o600 for a secret."""
    blob = data.encode("utf-8") if isinstance(data, str) else data
    tmp = tmp if tmp is not None else path.with_name(path.name + ".tmp")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        if backup is not None and path.exists():
            os.replace(path, backup)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_directory(path.parent)
