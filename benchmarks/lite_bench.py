"""Lite topics at a million per store, store-level, no Ray.

    python benchmarks/lite_bench.py [--dir PATH] [--topics N] [--batch B] [--rounds R]
                                    [--puts-only] [--expiry-only] [--expiry-rounds E]

With the default store file sizes (1 GiB CommitLog files), in one run:

* creation: N lite topics with one 64-byte message each, put in batches of B
  encoded as a producer encodes them (the time in the store, and with the encoding);
* the process's anonymous memory (``RssAnon``) before and after, and the in-memory
  table's share;
* restart: the LiteStore and its MessageStore closed and opened again (normal start),
  and again with the lite checkpoint removed (the index's tail checked against the
  CommitLog from its start);
* one lite topic among the N vs a normal topic's queue: single-message puts (and
  puts of a normal message carrying the same ``__LITE_TOPIC`` property, the lite
  record's size, without the lite index; and lite puts whose records the general
  Python loop encodes instead of the C encoder), batches of 32 messages to 32 lite
  topics against a normal batch of 32, plain and with a property each (and the same
  lite batches encoded by the general loop), and 32-message reads from random
  offsets, alternated, best and median of the rounds, with the ratios;
* pages of 100 lite topic names from random places (``lite_topics_page``) against
  sorting every name per page;
* expiry of all N while a writer thread puts single messages to another parent: the
  expiry's time, its slices and the longest, the writer's puts during it, their max,
  p99, p99.9 and how many took over 50 ms, beside the same writer as long without
  expiry right after; ``--expiry-rounds`` times (the N created again before each),
  with the medians and ratios.

With ``--socket N`` it measures instead, on a local Ray cluster of one broker whose
parent holds N lite topics: a send to one lite topic (``LiteProducer.send``) against a
send to a normal topic's queue (``Producer.send``), and a 32-message read of each
(``LiteConsumer.pull`` against ``PullConsumer.pull``), both over the broker's socket,
alternated, with the ratios.

``--puts-only`` stops after the single puts and reads; ``--expiry-only`` skips from the
restart to the expiry. Prints figures and ratios;
deletes its store. Not a test: figures drift on shared
machines, ratios much less.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from storage import Message, MessageStore, StoreConfig, encode_batch
from storage.lite import PROP_LITE_TOPIC, LiteConfig, LiteStore

BODY = b"t" * 64


def rss_anon_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return -1


def config(root: Path) -> StoreConfig:
    return StoreConfig(str(root))  # the default sizes: 1 GiB CommitLog files


def open_both(root: Path) -> tuple[MessageStore, LiteStore]:
    store = MessageStore(config(root))
    lite = LiteStore(store, LiteConfig())
    lite.declare_parent("Sessions", quota=2_000_000, ttl_ms=3_600_000)
    lite.declare_parent("Agents", quota=1000, ttl_ms=24 * 3_600_000)
    return store, lite


def create(lite: LiteStore, n: int, batch: int) -> tuple[float, float]:
    """Wall time, and the time in ``put_encoded`` alone (what the broker spends on
    batches its producers encoded)."""
    started = time.perf_counter()
    in_store = 0.0
    for a in range(0, n, batch):
        messages = [
            Message("Sessions", BODY, properties={PROP_LITE_TOPIC: f"session-{i:08d}"})
            for i in range(a, min(n, a + batch))
        ]
        encoded = encode_batch(messages)  # the producer's part
        t = time.perf_counter()
        lite.put_encoded("Sessions", encoded)
        in_store += time.perf_counter() - t
    return time.perf_counter() - started, in_store


def put_latencies(fn, stop: threading.Event | None, count: int) -> list[float]:
    out = []
    for i in range(count):
        if stop is not None and stop.is_set() and i > 0:
            break
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def one_among_many(store: MessageStore, lite: LiteStore, rounds: int) -> None:
    hot = "session-00000007"
    lite_put = lambda i: lite.put("Sessions", hot, Message("Sessions", BODY))  # noqa: E731
    plain_put = lambda i: store.put(Message("Plain", BODY))  # noqa: E731
    # the same record as the lite put's: the property naming the lite topic, no lite index
    tagged = {PROP_LITE_TOPIC: hot}
    prop_put = lambda i: store.put(Message("Plain", BODY, properties=tagged))  # noqa: E731

    def general_loop(fn):  # the lite put with its records encoded by the general loop
        def run(i: int) -> None:
            lite._encode_plain = lambda *a: None  # type: ignore[method-assign]
            try:
                fn(i)
            finally:
                del lite._encode_plain

        return run

    slow_put = general_loop(lite_put)
    for _ in range(200):  # all warm
        lite_put(0)
        plain_put(0)
        prop_put(0)
        slow_put(0)
    lp, pp, qp, sp = [], [], [], []
    kinds = [(lite_put, lp), (plain_put, pp), (prop_put, qp), (slow_put, sp)]
    for _ in range(rounds):  # alternated: 10 slices of 100 each, the order turning
        took = [0.0] * len(kinds)
        for s in range(10):
            for k in [(s + j) % len(kinds) for j in range(len(kinds))]:
                fn = kinds[k][0]
                t = time.perf_counter()
                for i in range(100):
                    fn(i)
                took[k] += time.perf_counter() - t
        for (_, times), spent in zip(kinds, took):
            times.append(spent)
    # per put, µs: best and median of the rounds
    lite_us, plain_us, prop_us, slow_us = (
        (min(x) * 1000, float(np.median(x)) * 1000) for x in (lp, pp, qp, sp)
    )
    print(
        f"put one message (best / median of {rounds} rounds of 1000, in alternated slices of 100)"
    )
    print(f"  lite topic among {lite.count():,}:  {lite_us[0]:6.1f} / {lite_us[1]:6.1f} us")
    print(f"  normal topic's queue:              {plain_us[0]:6.1f} / {plain_us[1]:6.1f} us")
    print(f"  normal, with the lite property:    {prop_us[0]:6.1f} / {prop_us[1]:6.1f} us")
    print(f"  lite, general-loop encoding:       {slow_us[0]:6.1f} / {slow_us[1]:6.1f} us")

    def ratio(a: list[float], b: list[float]) -> str:  # best, and median of each round's
        return f"{min(a) / min(b):.2f} / {np.median(np.array(a) / np.array(b)):.2f}"

    print("  ratios (best / median of the rounds' own ratios):")
    print(f"    lite/normal {ratio(lp, pp)}; general-loop lite/normal {ratio(sp, pp)}")
    print(f"    lite/normal with the lite property {ratio(lp, qp)}")
    batch_puts(store, lite, rounds, ratio)
    top = lite.max_offset("Sessions", hot)
    rng = random.Random(7)
    for n in (1, 32):  # a single message, and a consumer's batch
        lr, pr = [], []
        for r in range(rounds + 1):  # alternated; the first warms the pages, not timed
            offs = [rng.randrange(0, top - 32) for _ in range(500)]
            t = time.perf_counter()
            for o in offs:
                r = lite.get_raw("Sessions", hot, o, n)
                assert r.count == n
            lr.append(time.perf_counter() - t)
            t = time.perf_counter()
            for o in offs:
                r = store.get_raw("g", "Plain", 0, o, n)
                assert r.count == n
            pr.append(time.perf_counter() - t)
            if not r:
                lr.clear()
                pr.clear()
        lite_us, plain_us = min(lr) / 500 * 1e6, min(pr) / 500 * 1e6
        print(f"read {n:2} message(s)  lite topic ({top:,} msgs): {lite_us:7.1f} us (best)")
        print(f"                     normal topic's queue:      {plain_us:7.1f} us")
        print(f"                     ratio lite/normal (best / median): {ratio(lr, pr)}")
    # a resume near the tail of a long stream, the gateway's case
    t = time.perf_counter()
    for _ in range(500):
        lite.get_raw("Sessions", hot, top - 5, 32)
    print(
        f"resume 5 from the tail:                        {(time.perf_counter() - t) / 500 * 1e6:7.1f} us"
    )


def batch_puts(store: MessageStore, lite: LiteStore, rounds: int, ratio) -> None:
    """A batch of 32 plain messages, each to a lite topic of its own (a gateway's
    tokens for 32 sessions), against a normal batch of 32 to one queue; the same with
    a property of their own on every message; and the lite batches encoded by the
    general loop instead of the C encoder: alternated."""
    names = [f"session-{i * 7919 % 1_000_000:08d}" for i in range(32)]
    trace = {"trace": "on"}

    def lite_put(props: dict[str, str] | None) -> None:
        lite.put_batch(
            "Sessions", [(n, Message("Sessions", BODY, properties=props)) for n in names]
        )

    def plain_put(props: dict[str, str] | None) -> None:
        store.put_batch([Message("Plain", BODY, properties=props) for _ in range(32)])

    def slow_put(props: dict[str, str] | None) -> None:
        lite._encode_plain = lambda *a: None  # type: ignore[method-assign]
        try:
            lite_put(props)
        finally:
            del lite._encode_plain

    for props, what in ((None, "plain messages"), (trace, "messages with a property")):
        for _ in range(50):  # all warm
            lite_put(props)
            plain_put(props)
            slow_put(props)
        lb, pb, sb = [], [], []
        for _ in range(rounds):  # alternated
            for fn, times in ((lite_put, lb), (plain_put, pb), (slow_put, sb)):
                t = time.perf_counter()
                for _ in range(100):
                    fn(props)
                times.append(time.perf_counter() - t)
        per = [(min(x) / 3200 * 1e6, float(np.median(x)) / 3200 * 1e6) for x in (lb, pb, sb)]
        print(f"put a batch of 32 {what} (best / median of {rounds} alternated rounds of 100)")
        print(
            f"  to 32 lite topics:               {per[0][0]:6.2f} / {per[0][1]:6.2f} us a message"
        )
        print(
            f"  to a normal topic's queue:       {per[1][0]:6.2f} / {per[1][1]:6.2f} us a message"
        )
        print(
            f"  lite, general-loop encoding:     {per[2][0]:6.2f} / {per[2][1]:6.2f} us a message"
        )
        print(f"  ratios: lite/normal {ratio(lb, pb)}; general-loop lite/normal {ratio(sb, pb)}")


def pages(lite: LiteStore, rounds: int) -> None:
    """Pages of 100 names from random places among all lite topics: with the sorted
    index (built by the first page) against sorting every name per page."""
    t = time.perf_counter()
    lite.lite_topics_page("Sessions", "", 100)
    first_s = time.perf_counter() - t
    rng = random.Random(11)
    names = lite.lite_topics("Sessions")
    afters = [rng.choice(names) for _ in range(200)]
    indexed = []
    for _ in range(rounds):
        t = time.perf_counter()
        for after in afters:
            assert len(lite.lite_topics_page("Sessions", after, 100)[0]) <= 100
        indexed.append((time.perf_counter() - t) / len(afters))
    sorted_all = []
    for after in afters[:3]:  # the baseline: sort all, then bisect
        t = time.perf_counter()
        every = lite.lite_topics("Sessions")
        start = bisect.bisect_right(every, after)
        assert every[start : start + 100] == lite.lite_topics_page("Sessions", after, 100)[0]
        sorted_all.append(time.perf_counter() - t)
    idx_us, all_us = min(indexed) * 1e6, min(sorted_all) * 1e6
    print(f"page of 100 names among {len(names):,}: sorted index {idx_us:9.1f} us")
    print(f"                  (the first page builds it: {first_s:.2f} s)")
    print(f"                  sorting all names per page:  {all_us:9.1f} us")
    print(f"                  ratio all/index:             {all_us / idx_us:9.0f}")


def writer_during(lite: LiteStore, work, seconds: float | None) -> tuple[np.ndarray, float]:
    """Single puts to another parent on a thread of their own while ``work()`` runs
    (or, with ``work`` None, for ``seconds``): each put's latency in ms, and the time
    ``work`` took."""
    writer = lambda i: lite.put("Agents", f"agent-{i % 100}", Message("Agents", BODY))  # noqa: E731
    stop = threading.Event()
    got: list[float] = []
    w = threading.Thread(target=lambda: got.extend(put_latencies(writer, stop, 10**9)))
    w.start()
    time.sleep(0.2)  # the writer is putting before the work starts
    t = time.perf_counter()
    if work is None:
        stop.wait(seconds)
    else:
        work()
    took = time.perf_counter() - t
    stop.set()
    w.join()
    return np.array(got) * 1000, took


def expiry_under_writes(
    store: MessageStore, lite: LiteStore, n: int, batch: int, rounds: int
) -> None:
    """Expiry of all of ``Sessions`` while a writer puts to ``Agents``, alternated with
    the same writer as long without expiry (the topics are created again before each
    expiry, outside the times)."""
    rows = []
    for r in range(rounds):
        if r:
            create(lite, n, batch)
        live = lite.count("Sessions")
        expired_box: list[int] = []
        expire = lambda box=expired_box: box.append(lite.expire(store.now_ms() + 3_600_001))  # noqa: E731
        during, took = writer_during(lite, expire, None)
        assert expired_box == [live] and lite.count("Sessions") == 0, (expired_box, live)
        held = dict(lite.last_expiry)
        base, _ = writer_during(lite, None, took)
        rows.append((took, held, during, base))
        print(
            f"round {r}: expiry of {live:,} lite topics {took:.2f} s ({live / took:,.0f}/s), "
            f"{held['slices']} slices, longest {held['max_hold_ms']:.2f} ms "
            f"({held['max_hold_cpu_ms']:.2f} ms CPU)"
        )
        for label, lat in (("during expiry", during), ("without expiry", base)):
            print(
                f"  writer {label:14}: {len(lat):7,} puts, max {lat.max():6.2f} ms, p99 "
                f"{np.percentile(lat, 99):.3f} ms, p99.9 {np.percentile(lat, 99.9):.3f} ms, "
                f"> 50 ms: {int((lat > 50).sum())}"
            )
    med = lambda xs: float(np.median(xs))  # noqa: E731
    d_max = med([row[2].max() for row in rows])
    b_max = med([row[3].max() for row in rows])
    d_99 = med([np.percentile(row[2], 99) for row in rows])
    b_99 = med([np.percentile(row[3], 99) for row in rows])
    print(
        f"median of {rounds} rounds: expiry {med([row[0] for row in rows]):.2f} s, longest "
        f"slice {med([row[1]['max_hold_ms'] for row in rows]):.2f} ms; writer max "
        f"{d_max:.2f} ms during vs {b_max:.2f} ms without (ratio {d_max / b_max:.2f}), "
        f"p99 {d_99:.3f} vs {b_99:.3f} ms (ratio {d_99 / b_99:.2f})"
    )


def over_socket(lite_topics: int, rounds: int, root: Path) -> None:
    import sys

    import ray

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _local import start_local_ray

    import actors
    from actors.client.lite import LiteConsumer, LiteProducer
    from rebalance import MessageQueue

    start_local_ray()
    cluster = actors.start_cluster(
        namespace="raymq-lite-bench",
        nameservers=1,
        brokers=1,
        store_root=str(root),
        topics=[actors.TopicConfig("Plain", 1, 1)],
        broker_options={"store": {"flush_disk_type": "ASYNC_FLUSH"}},
    )
    try:
        broker = cluster.broker("broker-a")
        ray.get(broker.lite_create_parent.remote("Sessions", quota=lite_topics + 10))
        ns = cluster.namespace
        lp = LiteProducer("Sessions", namespace=ns)
        lc = LiteConsumer("bench", "Sessions", namespace=ns)
        producer = cluster.producer("bench-p")
        consumer = cluster.pull_consumer("bench")
        for start in range(0, lite_topics, 1000):  # the other lite topics, one message each
            lp.send_batch([(f"other-{i:07d}", BODY) for i in range(start, start + 1000)])
        hot, mq = "session-hot", MessageQueue("Plain", "broker-a", 0)
        lite_send = lambda: lp.send(hot, BODY)  # noqa: E731
        plain_send = lambda: producer.send(Message("Plain", BODY))  # noqa: E731
        for _ in range(300):  # both warm, the sockets open
            lite_send()
            plain_send()
        n = 1000
        ls, ps, lr, pr = [], [], [], []
        rng = random.Random(7)
        for _ in range(rounds):  # alternated
            t = time.perf_counter()
            for _ in range(n):
                lite_send()
            ls.append(time.perf_counter() - t)
            t = time.perf_counter()
            for _ in range(n):
                plain_send()
            ps.append(time.perf_counter() - t)
            top = min(lp.send(hot, BODY)["offset"], consumer.max_offset(mq)) - 32
            offs = [rng.randrange(0, top) for _ in range(n)]
            t = time.perf_counter()
            for o in offs:
                assert len(lc.pull(hot, o, 32).messages) == 32
            lr.append(time.perf_counter() - t)
            t = time.perf_counter()
            for o in offs:
                assert len(consumer.pull(mq, o, 32).messages) == 32
            pr.append(time.perf_counter() - t)
        for what, a, b in (("send one message", ls, ps), ("read 32 messages", lr, pr)):
            lite_us, plain_us = min(a) / n * 1e6, min(b) / n * 1e6
            print(
                f"over the socket, {what}: lite topic among {lite_topics + 1:,} "
                f"{lite_us:7.1f} us, normal queue {plain_us:7.1f} us, "
                f"ratio {lite_us / plain_us:5.2f}"
            )
        for c in (lp, lc, producer, consumer):
            c.close()
    finally:
        cluster.shutdown()
        ray.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="parent of the store (default: a temp dir)")
    parser.add_argument("--topics", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--socket", type=int, default=None, metavar="N", help="over a broker's socket instead"
    )
    parser.add_argument(
        "--puts-only",
        action="store_true",
        help="after creating the lite topics, only the single puts and reads",
    )
    parser.add_argument(
        "--expiry-only",
        action="store_true",
        help="after creating the lite topics, only the expiry under writes",
    )
    parser.add_argument(
        "--expiry-rounds",
        type=int,
        default=3,
        help="expiries (all lite topics created again before each), alternated with the writer alone",
    )
    args = parser.parse_args()
    top = Path(tempfile.mkdtemp(prefix="lite_bench_", dir=args.dir))
    root = top / "store"
    if args.socket is not None:
        try:
            over_socket(args.socket, args.rounds, root)
        finally:
            shutil.rmtree(top, ignore_errors=True)
        return 0
    try:
        store, lite = open_both(root)
        gc.collect()
        before = rss_anon_kib()
        took, in_store = create(lite, args.topics, args.batch)
        gc.collect()
        after = rss_anon_kib()
        print(
            f"created {args.topics:,} lite topics (one message each, batches of "
            f"{args.batch}): in the store (put_encoded) {in_store:.2f} s, "
            f"{args.topics / in_store:,.0f}/s; with the producer's encoding {took:.2f} s, "
            f"{args.topics / took:,.0f}/s"
        )
        print(
            f"RssAnon: {before / 1024:.0f} MiB before, {after / 1024:.0f} MiB after: "
            f"+{(after - before) / 1024:.0f} MiB for the lite topics (table "
            f"{lite.table.memory_bytes() / 2**20:.0f} MiB); index "
            f"{lite.stats()['lite_index_entries'] * 56 / 2**20:.0f} MiB on disk"
        )
        lite.close()
        store.close()
        t = time.perf_counter()
        store, lite = open_both(root)
        t_open = time.perf_counter() - t
        assert lite.count("Sessions") == args.topics
        print(f"restart (MessageStore + LiteStore open, normal): {t_open:.2f} s")
        lite.close()
        store.close()
        os.unlink(root / "lite" / "checkpoint")
        t = time.perf_counter()
        store, lite = open_both(root)
        print(f"restart without the lite checkpoint:             {time.perf_counter() - t:.2f} s")
        assert lite.count("Sessions") == args.topics
        if args.expiry_only:
            expiry_under_writes(store, lite, args.topics, args.batch, args.expiry_rounds)
            lite.close()
            store.close()
            return 0
        one_among_many(store, lite, args.rounds)
        if args.puts_only:
            lite.close()
            store.close()
            return 0
        pages(lite, args.rounds)
        expiry_under_writes(store, lite, args.topics, args.batch, args.expiry_rounds)
        lite.close()
        store.close()
    finally:
        shutil.rmtree(top, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
