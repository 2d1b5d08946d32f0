"""The broker's store work for one single send at a time, in one process, beside the
store's array paths measured in the same run.

    python benchmarks/single_send_store.py [--messages 20000] [--rounds 3]

An idempotent producer's one-message batches of 100 B, as the broker receives them
off the wire, are decoded and checked (``EncodedBatch.from_bytes``), stored
(``MessageStore.put_encoded``) and read back from the queue's tail as a held pull
reads them (``get_raw`` of the newest record, then ``pulls_to_wire``). Each figure is
the CPU time of this thread per message (``time.thread_time``: what another process
on the core does not change), the median of ``--rounds``, once on the scalar paths a
single send takes (``MessageStore._append_one``, ``_get_few``) and once on the array
paths every batch took before them (``_append_many``, ``get_raw``'s general read),
alternating; the ratio is scalar / arrays. ASYNC_FLUSH, no services, a temporary
store under /tmp (deleted). Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

from actors.protocol.wire import pulls_to_wire
from storage import Message, MessageStore, StoreConfig, codec
from storage._fast_encode import encode_plain
from storage.seq_slots import seq_slot


def blobs(n: int) -> list[bytes]:
    """``n`` single sends of one idempotent producer to queue 0, as wire blobs."""
    uniq = codec.UniqueKeyGenerator()
    born = codec.host_to_bytes("127.0.0.1:1")
    producer = "bench-producer"
    slot = seq_slot(producer)
    now = int(time.time() * 1000)
    return [
        encode_plain([Message("Single", b"x" * 100)], 4 << 20, now, born, uniq, slot)
        .with_sequence(producer, 0, seq, 0)
        .to_bytes()
        for seq in range(n)
    ]


def cpu_us(fn: Callable[[], object], n: int) -> float:
    started = time.thread_time()
    fn()
    return 1e6 * (time.thread_time() - started) / n


def one_round(wire: list[bytes], scalar: bool) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="raymq-single-send-")
    try:
        store = MessageStore(
            StoreConfig(
                root,
                flush_disk_type="ASYNC_FLUSH",
                commitlog_file_size=256 << 20,
                index_hash_slots=1_000_003,
                index_max_entries=4_000_000,
            ),
            start_services=False,
        )
        if not scalar:
            store._append_one = store._append_many  # type: ignore[method-assign]
            store._get_few = lambda *args: None  # type: ignore[method-assign]
        n = len(wire)
        batches: list[codec.EncodedBatch] = []
        got: dict[str, float] = {}
        got["decode and check"] = cpu_us(
            lambda: batches.extend(codec.EncodedBatch.from_bytes(b) for b in wire), n
        )
        reads: list[object] = []
        half = n // 2
        started = time.thread_time()
        for batch in batches[:half]:
            store.put_encoded(batch)
        got["put"] = 1e6 * (time.thread_time() - started) / half
        started = time.thread_time()
        for i in range(half, n):  # each put, then its record read as a woken held pull does
            store.put_encoded(batches[i])
            reads.append(store.get_raw("g", "Single", 0, i, 32, view=True))
        got["tail read"] = 1e6 * (time.thread_time() - started) / (n - half) - got["put"]
        answers = reads[-1000:]
        got["pull answer"] = cpu_us(
            lambda: [pulls_to_wire([r]) for r in answers],  # type: ignore[list-item]
            len(answers),
        )
        store.close()
        return got
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    wire = blobs(args.messages)
    rows: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for rnd in range(args.rounds):
        for scalar in (True, False) if rnd % 2 else (False, True):
            rows[scalar].append(one_round(wire, scalar))
    print(f"CPU per message (us), median of {args.rounds} rounds of {args.messages} sends")
    print(f"  {'':20s}{'scalar':>10s}{'arrays':>10s}{'ratio':>8s}")
    for name in rows[True][0]:
        a = statistics.median(r[name] for r in rows[True])
        b = statistics.median(r[name] for r in rows[False])
        print(f"  {name:20s}{a:>10.1f}{b:>10.1f}{a / b:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
