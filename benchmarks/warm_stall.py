"""What warming a fresh CommitLog file costs the threads beside it.

    python benchmarks/warm_stall.py [--file-mib 1024] [--rounds 3] [--chunks-mib 1,64]

A new 1 GiB CommitLog file is warmed on a thread of its own (``MappedFile.warm``:
``madvise(MADV_POPULATE_WRITE)`` a chunk at a time, the GIL released), while the broker
goes on serving. Each ``madvise`` holds the process's ``mmap_lock`` for reading while
it faults its chunk in; a thread that maps or unmaps memory meanwhile (Python's
allocator does, for its arenas) waits for the chunk to finish, and every page fault
after it waits behind that writer. This prints how long such a thread's steps take
while a file warms, with the store's chunk and with the others given, against the
same thread with no warming at all, in alternated rounds (medians of rounds).

The thread beside it: every 0.5 ms it maps 256 KiB (an arena's size), touches two of
its pages and unmaps it. Not a test: it prints figures (this VM's timings drift 2x
within minutes; compare the rows of one run).
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage import mapped_file  # noqa: E402


def _mapper(stop: threading.Event, steps: list[float]) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        m = mmap.mmap(-1, 256 << 10)
        m[0:1] = b"x"
        m[131072:131073] = b"y"
        m.close()
        time.sleep(0.0005)
        steps.append(time.perf_counter() - t)


def one(folder: Path, file_size: int, chunk: int | None) -> tuple[float, float, float]:
    """(seconds the warming took, the mapper's p99 and longest step in ms); ``chunk``
    None: no warming, the mapper alone on a fresh file for 0.5 s."""
    path = folder / mapped_file.offset_to_name(0)
    mf = mapped_file.MappedFile(path, file_size, create=True, preallocate=True)
    steps: list[float] = []
    stop = threading.Event()
    beside = threading.Thread(target=_mapper, args=(stop, steps))
    beside.start()
    started = time.perf_counter()
    try:
        if chunk is None:
            time.sleep(0.5)
        else:
            saved = mapped_file._WARM_CHUNK
            mapped_file._WARM_CHUNK = chunk
            try:
                warmer = threading.Thread(target=lambda: (mapped_file._lower_priority(), mf.warm()))
                warmer.start()
                warmer.join()
            finally:
                mapped_file._WARM_CHUNK = saved
        took = time.perf_counter() - started
    finally:
        stop.set()
        beside.join()
        mf.close()
        path.unlink()
    steps.sort()
    return took, steps[int(len(steps) * 0.99)] * 1e3, steps[-1] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunks-mib", default="1,64", help="chunk sizes compared (MiB)")
    args = parser.parse_args()
    store_chunk = mapped_file._WARM_CHUNK
    chunks: list[int | None] = [None, store_chunk]
    for text in args.chunks_mib.split(","):
        size = int(float(text) * (1 << 20))
        if size not in chunks:
            chunks.append(size)
    rows: dict[int | None, list[tuple[float, float, float]]] = {c: [] for c in chunks}
    folder = Path(tempfile.mkdtemp(prefix="raymq-warm-stall-"))
    try:
        for r in range(args.rounds):
            for chunk in chunks:
                rows[chunk].append(one(folder, args.file_mib << 20, chunk))
                print(
                    f"  round {r + 1}/{args.rounds}: {_name(chunk, store_chunk)} done", flush=True
                )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    base_max = statistics.median(m for _, _, m in rows[None])
    print(f"a {args.file_mib} MiB file; a mapping thread's steps, medians of {args.rounds} rounds:")
    for chunk in chunks:
        took = statistics.median(t for t, _, _ in rows[chunk])
        p99 = statistics.median(p for _, p, _ in rows[chunk])
        worst = statistics.median(m for _, _, m in rows[chunk])
        warm = "" if chunk is None else f"warmed in {took:.2f} s, "
        print(
            f"  {_name(chunk, store_chunk):<26} {warm}step p99 {p99:.2f} ms, "
            f"longest {worst:.2f} ms ({worst / base_max:.1f}x no warming)"
        )


def _name(chunk: int | None, store_chunk: int) -> str:
    if chunk is None:
        return "no warming"
    mine = " (the store's)" if chunk == store_chunk else ""
    return f"{chunk / (1 << 20):g} MiB chunks{mine}"


if __name__ == "__main__":
    if os.name != "posix":
        sys.exit("Linux only: MADV_POPULATE_WRITE")
    main()
