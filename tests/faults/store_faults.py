"""What a power loss or a bad disk does to a broker's store files while it is down.

Each function takes a store directory (``BrokerConfig.store_dir``) of a broker that is
not running and changes its files as that fault would: :func:`lose_unflushed` (a power
loss: the CommitLog cut back to a point at or after what the store confirmed flushed),
:func:`lose_offset_journal` (the consumer offsets committed since the last save, when
the broker does not fsync them), :func:`flip_bit` and :func:`truncate` (one replica's
CommitLog or Raft index damaged).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path

from storage.checkpoint import CheckpointFile


def commitlog_bytes(store: Path) -> bytes:
    """A store's whole CommitLog, file by file, the last file's trailing zeros dropped."""
    return b"".join(f.read_bytes() for f in sorted((store / "commitlog").iterdir())).rstrip(b"\x00")


def commitlog_end(store: Path) -> int:
    """The CommitLog's written end: the offset after its last non-zero byte."""
    end = 0
    for f in sorted((store / "commitlog").iterdir()):
        data = f.read_bytes().rstrip(b"\x00")
        if data:
            end = max(end, int(f.name) + len(data))
    return end


def record_end(store: Path, offset: int) -> int:
    """The end of the CommitLog record that starts at ``offset`` (its TOTALSIZE after it)."""
    files = sorted((store / "commitlog").iterdir(), key=lambda f: int(f.name))
    f = next(f for f in reversed(files) if int(f.name) <= offset)
    with f.open("rb") as raw:
        raw.seek(offset - int(f.name))
        return offset + int.from_bytes(raw.read(4), "big", signed=True)


def record_start(store: Path, at: int) -> int:
    """The start of the CommitLog record that holds byte ``at`` (``at`` itself when a
    record starts there or nothing is written there): a cut at ``at`` loses that whole
    record, not only the records that start at or after it."""
    files = sorted((store / "commitlog").iterdir(), key=lambda f: int(f.name))
    f = next((f for f in reversed(files) if int(f.name) <= at), None)
    if f is None:
        return at
    base = int(f.name)
    data = f.read_bytes()
    pos = 0
    while pos < at - base:
        size = int.from_bytes(data[pos : pos + 4], "big", signed=True)
        if size <= 0:
            return at  # nothing written from here
        if pos + size > at - base:
            return base + pos
        pos += size
    return at


def last_record_holding(store: Path, needles: Iterable[bytes], start: int) -> int:
    """The end of the last CommitLog record at or after ``start`` whose bytes hold one of
    ``needles`` (unique message bodies), or ``start`` when none does: what a door whose
    answers name no CommitLog offset (the gRPC door, a transaction's commit) had written
    when it acknowledged them."""
    wanted = [n for n in needles if n]
    end = start
    for f in sorted((store / "commitlog").iterdir(), key=lambda f: int(f.name)):
        base = int(f.name)
        data = f.read_bytes().rstrip(b"\x00")
        if base + len(data) <= start:
            continue
        lo = max(start - base, 0)
        hits = [at for n in wanted if (at := data.rfind(n, lo)) >= 0]
        if hits:
            first = record_start(store, base + max(hits))
            end = max(end, record_end(store, first))
    return end


def flushed_offset(store: Path) -> int:
    """The CommitLog offset the store's checkpoint confirms flushed (it lags the real
    fsync: the checkpoint is written periodically)."""
    checkpoint = CheckpointFile(store / "checkpoint")
    checkpoint.close()
    if not checkpoint.valid:
        raise ValueError(f"no valid checkpoint in {store}")
    return checkpoint.value.physic_offset


def cut_commitlog(store: Path, at: int) -> None:
    """Zeros from ``at`` to its file's end, later files gone (what the disk held)."""
    for f in sorted((store / "commitlog").iterdir()):
        base, size = int(f.name), f.stat().st_size
        if base >= at and base > 0:
            f.unlink()
        elif base + size > at:
            with f.open("r+b") as out:
                out.seek(at - base)
                out.write(b"\x00" * (base + size - at))


def lose_unflushed(store: Path, floor: int = 0) -> tuple[int, int]:
    """Cut the CommitLog back to the checkpoint's flushed offset, or to ``floor`` if that is
    further (what the caller knows was fsynced: acknowledged SYNC_FLUSH writes), as a
    power loss may. Returns (the cut, the end before)."""
    end = commitlog_end(store)
    at = min(max(flushed_offset(store), floor), end)
    cut_commitlog(store, at)
    return at, end


def lose_offset_journal(store: Path) -> int:
    """A power loss of a broker that does not fsync its consumer offsets' journal
    (``ASYNC_FLUSH``): the journal's changes since the last save are gone (the save
    fsynced the one before). Returns how many bytes were lost."""
    journal = store / "config" / "consumerOffset.journal"
    if not journal.exists():
        return 0
    size = journal.stat().st_size
    journal.write_bytes(b"")
    return size


def _target(store: Path, log: str) -> Path:
    if log == "raft":
        return store / "raft" / "index"
    files = sorted((store / "commitlog").iterdir())
    return next((f for f in reversed(files) if f.read_bytes().rstrip(b"\x00")), files[0])


def flip_bit(store: Path, log: str, rng: random.Random) -> str:
    """Flip one bit in the written part of the CommitLog's last file (``log="commitlog"``)
    or of the Raft index (``"raft"``). Returns what was flipped, for the report."""
    path = _target(store, log)
    data = bytearray(path.read_bytes())
    written = len(data.rstrip(b"\x00")) or len(data)
    at = rng.randrange(written)
    bit = rng.randrange(8)
    data[at] ^= 1 << bit
    path.write_bytes(bytes(data))
    return f"{path.relative_to(store)} byte {at} bit {bit}"


def truncate(store: Path, log: str, rng: random.Random) -> str:
    """Cut the CommitLog's written end (zeros from a random point of its last file's
    written part) or the Raft index file (shortened) at a random point."""
    if log == "raft":
        path = _target(store, log)
        size = path.stat().st_size
        at = rng.randrange(size) if size else 0
        with path.open("r+b") as f:
            f.truncate(at)
        return f"raft/index to {at} of {size} bytes"
    end = commitlog_end(store)
    at = rng.randrange(end) if end else 0
    cut_commitlog(store, at)
    return f"commitlog to {at} of {end}"
