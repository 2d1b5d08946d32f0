"""The store on its own: write 100 000 messages, read them back, look one up, recover.

python examples/store_demo.py [--messages N] [--dir PATH | --keep]
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
import time

from storage import GetStatus, Message, MessageStore, StoreConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument(
        "--dir", default=None, help="store directory (default: a temp dir, removed at the end)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir to look at")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    root = args.dir or tempfile.mkdtemp(prefix="raymq-demo-")
    cfg = StoreConfig(
        root,
        commitlog_file_size=64 << 20,
        index_hash_slots=100_003,
        index_max_entries=400_000,
        flush_disk_type="SYNC_FLUSH",
    )
    queues = 8
    started = time.perf_counter()
    with MessageStore(cfg) as store:
        for start in range(0, args.messages, 1000):
            stop = min(start + 1000, args.messages)
            store.put_batch(
                [
                    Message(
                        "Orders",
                        f"order-{i}".encode(),
                        tags="Created",
                        keys=[f"order-{i}"],
                        queue_id=(start // 1000) % queues,
                    )
                    for i in range(start, stop)
                ]
            )
    wrote = time.perf_counter() - started
    started = time.perf_counter()
    with MessageStore(cfg) as store:  # a clean restart
        seen = 0
        for q in range(queues):
            offset = 0
            while True:
                got = store.get("demo", "Orders", q, offset, 1000)
                if got.status is not GetStatus.FOUND:
                    break
                seen += len(got.messages)
                offset = got.next_offset
        found = store.query_by_key("Orders", "order-4242")
    read = time.perf_counter() - started
    assert seen == args.messages, f"read back {seen} of {args.messages}"
    assert [m.body for m in found] == [b"order-4242"]
    if args.dir is None and not args.keep:
        shutil.rmtree(root)
        print(f"store was at {root} (removed; --keep keeps it)")
    else:
        print(f"store at {root}")
    print(
        f"wrote {args.messages} messages with SYNC_FLUSH in {wrote:.2f}s "
        f"({args.messages / wrote:,.0f} msg/s)"
    )
    print(f"reopened and read them all back in {read:.2f}s; key order-4242 -> {found[0].msg_id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
