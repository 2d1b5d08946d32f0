"""What saving and loading a broker's lite subscription tables costs, no Ray.

    python -m benchmarks.lite_subscriptions_bench [--topics N] [--clients C] [--rounds R]

One consumer group of C clients subscribing N lite topics of one parent (each lite
topic subscribed by two clients, the tables' usual shape under exclusive consumption):

* the copy a save takes of a changed group while it holds the tables' lock (the
  broker's lite calls wait meanwhile), the file's write (JSON, fsync, rename) and
  its size, and the load at start (read, checks, the tables rebuilt);
* the baseline, in the same run: the save of the same group's committed offsets in
  the N lite topics (``offsets.npz``, the lite store's flush of a snapshot).

Alternated, R rounds, medians and the ratios to the baseline. Deletes its files. Not
a test: figures drift on shared machines, ratios much less.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from actors.broker.lite.groups import LiteGroup
from actors.broker.lite.saved import SavedTables, part_of
from storage.lite.offsets import LiteOffsets


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topics", type=int, default=100_000)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n, c = args.topics, args.clients
    root = Path(tempfile.mkdtemp(prefix="lite-subs-bench-"))
    try:
        g = LiteGroup()
        started = time.perf_counter()
        for i in range(n):
            name = f"session-{i:08d}"
            g.change(f"client-{i % c}", [name], "add")
            g.change(f"client-{(i + 1) % c}", [name], "add")
        print(f"{n} lite topics, {c} clients: tables built in {time.perf_counter() - started:.2f}s")
        offsets = LiteOffsets(root / "offsets.npz")
        for lid in range(n):
            offsets.commit("readers", lid, 1, lid)
        tables = SavedTables(root)
        figures: dict[str, list[float]] = {"copy": [], "write": [], "load": [], "offsets": []}
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            offsets.changed = True
            snap = offsets.snapshot()
            assert snap is not None
            offsets.write(snap)
            t1 = time.perf_counter()
            part = part_of(g)
            t2 = time.perf_counter()
            tables.write(0, [(("readers", "Sessions"), part)])
            t3 = time.perf_counter()
            loaded = tables.read()
            t4 = time.perf_counter()
            assert loaded is not None and len(loaded[1][("readers", "Sessions")].subscribers) == n
            figures["offsets"].append(t1 - t0)
            figures["copy"].append(t2 - t1)
            figures["write"].append(t3 - t2)
            figures["load"].append(t4 - t3)
        med = {k: statistics.median(v) for k, v in figures.items()}
        base = med["offsets"]
        size = tables.path.stat().st_size
        print(
            f"offsets.npz save (baseline): {base * 1000:8.1f} ms  ({(root / 'offsets.npz').stat().st_size / 1e6:.1f} MB)"
        )
        for k, label in (
            ("copy", "tables copied under the lock"),
            ("write", "subscriptions.json written"),
            ("load", "subscriptions.json loaded"),
        ):
            print(f"{label:32s} {med[k] * 1000:8.1f} ms  {med[k] / base:6.2f}x the baseline")
        print(f"subscriptions.json: {size / 1e6:.1f} MB ({size / n:.0f} bytes per lite topic)")
        print(f"medians of {args.rounds} alternated rounds")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
