"""Timer messages: put rate and delivery lag, beside plain puts and the 18-level delay path
measured in the same run.

    python benchmarks/timer_bench.py [--dir PATH] [--count N] [--spread S] [--json FILE]

One store on a temp directory, its services running on the real clock. Three runs of
``count`` 100-byte messages, put in batches of 1000: plain (no delay), delay level 1
(1 s, the schedule service) and timer messages whose times are spread evenly over
``spread`` seconds starting 2 s after the first put (the timer wheel). For the delayed
runs a reader follows the real topic and records, for each message, how long after its
due time it became readable (lag); the time is in the body. Prints put rates and lag
percentiles (ms). Not a test: figures drift on shared machines.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from storage import Message, MessageStore, StoreConfig

BATCH = 1000


def follow(store: MessageStore, topic: str, count: int, lags: list[float], stop: threading.Event):
    """Read ``topic`` queue 0 as messages arrive; a lag per message (now - due, ms)."""
    offset = 0
    while len(lags) < count and not stop.is_set():
        got = store.get("bench", topic, 0, offset, 4096)
        now = time.time() * 1000
        if not got.messages:
            time.sleep(0.005)
            continue
        for m in got.messages:
            lags.append(now - float(m.body[:16]))
        offset = got.next_offset


def run(store: MessageStore, kind: str, count: int, spread_s: float) -> dict[str, float]:
    topic = f"Bench-{kind}"
    lags: list[float] = []
    stop = threading.Event()
    reader = threading.Thread(target=follow, args=(store, topic, count, lags, stop), daemon=True)
    if kind != "plain":
        reader.start()
    first = time.time() + 2.0
    started = time.perf_counter()
    for start in range(0, count, BATCH):
        msgs = []
        for i in range(start, min(start + BATCH, count)):
            if kind == "timer":
                due_ms = int((first + spread_s * i / count) * 1000)
                msgs.append(Message(topic, b"%016d" % due_ms + b"x" * 84, deliver_at_ms=due_ms))
            elif kind == "level1":
                due_ms = int(time.time() * 1000) + 1000
                msgs.append(Message(topic, b"%016d" % due_ms + b"x" * 84, delay_level=1))
            else:
                msgs.append(Message(topic, b"%016d" % 0 + b"x" * 84))
        store.put_batch(msgs)
    put_s = time.perf_counter() - started
    out = {"put_per_s": count / put_s}
    if kind != "plain":
        reader.join(timeout=spread_s + 60)
        stop.set()
        arr = np.array(lags)
        out.update(
            delivered=float(len(arr)),
            lag_p50_ms=float(np.percentile(arr, 50)),
            lag_p99_ms=float(np.percentile(arr, 99)),
            lag_max_ms=float(arr.max()),
            lag_min_ms=float(arr.min()),
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="store directory (default: a temp dir, removed after)")
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--spread", type=float, default=10.0, help="seconds the times cover")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="raymq-timer-bench-"))
    results = {}
    try:
        cfg = StoreConfig(
            str(root / "store"),
            commitlog_file_size=256 << 20,
            index_hash_slots=1_000_003,
            index_max_entries=4_000_000,
        )
        with MessageStore(cfg) as store:
            for kind in ("plain", "level1", "timer"):
                results[kind] = run(store, kind, args.count, args.spread)
                line = ", ".join(f"{k}={v:,.1f}" for k, v in results[kind].items())
                print(f"{kind:>7}: {line}", flush=True)
            results["timer_wheel_disk_bytes"] = {"bytes": float(store.timer_wheel.disk_bytes())}
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
