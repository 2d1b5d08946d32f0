"""Store throughput next to this machine's raw limits, measured in the same run.

    python benchmarks/store_bench.py [--dir PATH] [--seconds S] [--json FILE]
    python benchmarks/store_bench.py --workloads put_batch   # MessageStore.put_batch only

Prints put throughput (100 B and 1 KiB bodies; ASYNC_FLUSH; SYNC_FLUSH with 1
and 8 writers; batches as the broker gets them off the wire, whose every record
the store verifies; ``put_batch`` of Message lists with no keys and with a key
each, beside ``put_encoded`` of such a batch encoded already, the floor once
encoding costs nothing), get throughput and abnormal-recovery scan rate, each beside
the raw figure it is bounded by (plain sequential ``os.write`` of the same
bytes, the fsync rate) as a ratio. Not a test: figures drift on shared machines,
ratios much less.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from storage import Message, MessageStore, StoreConfig, codec

BATCH = 1000


def config(root: Path, flush: str) -> StoreConfig:
    return StoreConfig(
        str(root),
        flush_disk_type=flush,
        commitlog_file_size=256 << 20,
        index_hash_slots=1_000_003,
        index_max_entries=4_000_000,
    )


def timed(fn: Callable[[], int], seconds: float) -> float:
    """Run ``fn`` (returns units done) repeatedly for ``seconds``; units per second."""
    done = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += fn()
    return done / elapsed


def batches(
    body_size: int, count: int, queues: int = 16, keyed: bool = False
) -> list[codec.EncodedBatch]:
    """``count`` batches of BATCH messages; ``keyed``: each with a key of its own (an
    order id, the common case), which the store indexes in the IndexFile."""
    body = os.urandom(body_size)
    return [
        codec.encode_batch(
            [
                Message(
                    "Bench",
                    body,
                    tags="T",
                    keys=f"order-{i}-{j}" if keyed else (),
                    queue_id=i % queues,
                )
                for j in range(BATCH)
            ]
        )
        for i in range(count)
    ]


def raw_write_rate(root: Path, data: bytes, seconds: float) -> float:
    """Bytes/s of plain sequential os.write of ``data`` into a preallocated file."""
    path = root / "raw"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        rate = timed(lambda: os.write(fd, data), seconds)
    finally:
        os.close(fd)
        path.unlink()
    return rate


def fsync_rate(root: Path, seconds: float) -> float:
    path = root / "fsync"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)

    def one() -> int:
        os.write(fd, b"x" * 4096)
        os.fsync(fd)
        return 1

    try:
        return timed(one, seconds)
    finally:
        os.close(fd)
        path.unlink()


def put_rate(
    root: Path, flush: str, body: int, writers: int, seconds: float, source: str = "encoded"
) -> tuple[float, float]:
    """(msg/s, MB/s of records) putting batches from ``source``: "encoded" (built by
    ``encode_batch`` in this process, trusted), "wire" (``EncodedBatch.from_bytes`` of a
    producer's blob per put, as a broker receives it: checked record by record),
    "keyed" ("encoded" with a unique key per message), "messages" (``put_batch`` of
    Message lists, encoding included) or "keyed messages" (those with a key each, given
    as ``keys=[order_id]``)."""
    shutil.rmtree(root, ignore_errors=True)
    pool = batches(body, 64 if source == "keyed" else 8, keyed=source == "keyed")
    wires = [b.to_bytes() for b in pool]
    record_bytes = len(pool[0].data) / BATCH
    lists = [
        [
            Message(
                "Bench",
                os.urandom(body),
                tags="T",
                keys=[f"order-{n}-{i}"] if source == "keyed messages" else (),
                queue_id=i % 16,
            )
            for i in range(BATCH)
        ]
        for n in range(8 if source == "keyed messages" else 1)
    ]
    with MessageStore(config(root, flush)) as store:
        counts = [0] * writers
        stop = time.perf_counter() + seconds

        def work(w: int) -> None:
            i = w
            while time.perf_counter() < stop:
                if source in ("encoded", "keyed"):
                    store.put_encoded(pool[i % len(pool)])
                elif source == "wire":
                    store.put_encoded(codec.EncodedBatch.from_bytes(wires[i % len(wires)]))
                else:
                    store.put_batch(lists[i % len(lists)])
                counts[w] += BATCH
                i += 1

        start = time.perf_counter()
        threads = [threading.Thread(target=work, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
    rate = sum(counts) / elapsed
    return rate, rate * record_bytes / 1e6


def get_rates(root: Path, seconds: float) -> tuple[float, float, float]:
    """(raw msg/s, decoded msg/s, MB/s) pulling 100 B messages in batches of 1000."""
    shutil.rmtree(root, ignore_errors=True)
    with MessageStore(config(root, "ASYNC_FLUSH")) as store:
        b = codec.encode_batch([Message("Get", b"g" * 100, queue_id=0) for _ in range(BATCH)])
        for _ in range(300):
            store.put_encoded(b)
        total = store.max_offset("Get", 0)
        state = {"off": 0, "bytes": 0}

        def pull_raw() -> int:
            r = store.get_raw("g", "Get", 0, state["off"], BATCH)
            state["off"] = r.next_offset if r.next_offset < total else 0
            state["bytes"] += len(r.data)
            return r.count

        state["bytes"] = 0
        start = time.perf_counter()
        raw = timed(pull_raw, seconds)
        mb = state["bytes"] / (time.perf_counter() - start) / 1e6
        state["off"] = 0

        def pull_decoded() -> int:
            r = store.get("g", "Get", 0, state["off"], BATCH)
            state["off"] = r.next_offset if r.next_offset < total else 0
            return len(r.messages)

        decoded = timed(pull_decoded, seconds)
    return raw, decoded, mb


def recovery_rate(root: Path, megabytes: int) -> tuple[float, float]:
    """(MB/s scanned by abnormal recovery, MB of CommitLog) after a simulated crash."""
    shutil.rmtree(root, ignore_errors=True)
    cfg = config(root, "ASYNC_FLUSH")
    store = MessageStore(cfg)
    b = batches(1024, 4)
    while store.commitlog.max_offset < megabytes << 20:
        for x in b:
            store.put_encoded(x)
    size = store.commitlog.max_offset
    store.commitlog.flush()
    for service in store._services:
        service.stop()
    store._release_files()  # crash: no clean checkpoint, abort file stays
    (root / "checkpoint").unlink()  # and no checkpoint either: scan everything
    start = time.perf_counter()
    store = MessageStore(cfg, start_services=False)
    elapsed = time.perf_counter() - start
    assert store.abnormal_start and store.commitlog.max_offset == size
    store.close()
    return size / elapsed / 1e6, size / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--recovery-mb", type=int, default=512)
    parser.add_argument("--json", default=None, help="also write every figure here")
    parser.add_argument(
        "--workloads",
        default="put,get,recovery",
        help="which of put, get, recovery to run; put_batch: only put_batch's rows and "
        "their baselines (ASYNC, 100 B)",
    )
    args = parser.parse_args()
    workloads = set(args.workloads.split(","))
    root = Path(args.dir or tempfile.mkdtemp(prefix="raymq-bench-", dir=os.getcwd()))
    root.mkdir(parents=True, exist_ok=True)
    s = args.seconds
    out: dict[str, float] = {}
    try:
        fsyncs = fsync_rate(root, s)
        out["fsync_per_s"] = fsyncs
        print(f"machine: {os.cpu_count()} cores; fsync rate {fsyncs:,.0f}/s")
        print(f"{'workload':44s} {'msg/s':>12s} {'MB/s':>9s} {'raw MB/s':>9s} {'ratio':>7s}")
        putting = bool(workloads & {"put", "put_batch"})
        only_put_batch = "put" not in workloads and "recovery" not in workloads
        for body in (100,) if only_put_batch else (100, 1024):
            chunk = batches(body, 1)[0].data  # the same bytes one batch put writes
            raw = raw_write_rate(root, chunk, s) / 1e6
            out[f"raw_write_mb_s_{body}"] = raw
            rows = [
                (f"put encoded batch {body}B ASYNC", "ASYNC_FLUSH", 1, "encoded"),
                (f"put wire batch {body}B ASYNC (checked)", "ASYNC_FLUSH", 1, "wire"),
                (f"put encoded batch {body}B ASYNC, a key each", "ASYNC_FLUSH", 1, "keyed"),
                (f"put Message list {body}B ASYNC (encode incl.)", "ASYNC_FLUSH", 1, "messages"),
                (f"put Message list {body}B ASYNC, a key each", "ASYNC_FLUSH", 1, "keyed messages"),
                (f"put encoded batch {body}B SYNC, 1 writer", "SYNC_FLUSH", 1, "encoded"),
                (f"put encoded batch {body}B SYNC, 8 writers", "SYNC_FLUSH", 8, "encoded"),
            ]
            if "put" not in workloads:
                rows = [r for r in rows if r[1] == "ASYNC_FLUSH" and r[3] != "wire"]
            for label, flush, writers, source in rows if putting else []:
                rate, mb = put_rate(root / "store", flush, body, writers, s, source)
                key = label.replace(" ", "_").replace(",", "")
                out[key] = rate
                print(f"{label:44s} {rate:12,.0f} {mb:9.1f} {raw:9.1f} {mb / raw:7.2f}")
        if putting:
            async100 = out["put_encoded_batch_100B_ASYNC"]
            keyed = out["put_encoded_batch_100B_ASYNC_a_key_each"]
            if "put" in workloads:
                sync8 = out["put_encoded_batch_100B_SYNC_8_writers"]
                print(f"SYNC 8 writers / ASYNC at 100 B: {sync8 / async100:.2f}")
            print(f"a key each / no keys at 100 B: {keyed / async100:.2f} (target >= 0.70)")
            listed = out["put_Message_list_100B_ASYNC_(encode_incl.)"]
            listed_keyed = out["put_Message_list_100B_ASYNC_a_key_each"]
            print(
                f"put_batch / put_encoded of the batch encoded already at 100 B: "
                f"{listed / async100:.2f} no keys, {listed_keyed / keyed:.2f} a key each"
            )
            print(
                f"put_batch a key each / no keys at 100 B: {listed_keyed / listed:.2f} "
                "(target >= 0.70; put_batch no keys target >= 1 M msg/s)"
            )
        if "get" in workloads:
            raw_get, decoded, mb = get_rates(root / "get", s)
            out.update(get_raw_msg_s=raw_get, get_decoded_msg_s=decoded)
            print(f"{'get (raw blob, 1000/pull)':44s} {raw_get:12,.0f} {mb:9.1f}")
            print(f"{'get + decode to MessageExt':44s} {decoded:12,.0f}")
        if "recovery" in workloads:
            rate, size = recovery_rate(root / "recovery", args.recovery_mb)
            out["recovery_mb_s"] = rate
            raw = out["raw_write_mb_s_1024"]
            print(
                f"abnormal recovery scan of {size:.0f} MB: {rate:,.0f} MB/s "
                f"(raw sequential write {raw:,.0f} MB/s, ratio {rate / raw:.2f})"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
