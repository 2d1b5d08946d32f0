"""What idempotence costs a sync batch of 1,000, measured against itself on one machine.

    PYTHONPATH=$PWD flock /tmp/raymq-ray.lock python benchmarks/idempotence_profile.py \
        [--blocks 40] [--calls 15]

``e2e_bench.py --idempotence-only`` compares two producers' throughput in short
alternated slices; on a shared 2-core machine the pairs' ratios span 0.5..1.6, so a
cost of a few per cent is lost in them. This runs one cluster (one broker, as the
bench does) and two producers, each sending sync batches of 1,000 messages of 100 B
with its sequencer switched on and off, in blocks of ``--calls`` sends, the four
variants rotated (and reversed every other round) for ``--blocks`` rounds:

* ``A on``: an idempotent producer's batches, bound in place in the slot its encoder
  reserved (``storage.codec.seq_slot``);
* ``A off``: the same producer, its sequencer off (its encoder's too: a batch that
  numbers no run may carry no ``PRODUCER_SEQ``, not even a slot never bound);
* ``B on``: a producer whose encoder reserves no slot, its sequencer on: each batch
  copied to mark its first record (the path before the slot);
* ``B off``: plain batches, no sequence at all.

So idempotence is measured on the same producer (the same connections, ring and
queues), apart from which producer it is. It prints per variant the median and mean
wall time of a send, and the CPU per send of this process (encode, bind, send, wait)
and of the broker's process (``process_time`` there, every thread: receive, check,
store, answer). With ``--broker-timing`` the broker's ``EncodedBatch.from_bytes`` and
its send processor's ``_send`` (the put and the answer) are timed in the broker's
process, per variant, through ``__ray_call__`` (wrappers installed in the live actor).
Not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

sys.path.insert(0, str(Path(__file__).parent.parent))

from _local import start_local_ray  # noqa: E402

import actors  # noqa: E402
from actors.client.idempotence import Sequencer  # noqa: E402
from storage import Message  # noqa: E402

TOPIC = "IdemProfile"


def _switch(p: Any, a: Any, s: Sequencer | None) -> None:
    """``p`` numbers its batches with ``s`` (None: not at all). A's encoder follows its
    sequencer (a slot only when numbered); B's never reserves one (B on: the copy)."""
    p._sender.sequencer = s
    if p is a:
        p._encoder.sequencer = s


def _broker_cpu_s(broker: Any) -> float:
    cpu: float = ray.get(broker.__ray_call__.remote(lambda self: time.process_time()))
    return cpu


def _install_timers(self: Any) -> None:
    """In the broker's process: time ``from_bytes`` and ``_send`` under the variant set."""
    from storage.codec import EncodedBatch

    log: dict[str, Any] = {"variant": None, "from_bytes": [], "send": []}
    self._idem_profile = log
    from_bytes = EncodedBatch.from_bytes.__func__  # type: ignore[attr-defined]

    def timed_from_bytes(cls: Any, blob: Any) -> Any:
        t = time.perf_counter()
        batch = from_bytes(cls, blob)
        log["from_bytes"].append((log["variant"], time.perf_counter() - t))
        return batch

    EncodedBatch.from_bytes = classmethod(timed_from_bytes)  # type: ignore[method-assign,assignment]
    send = self.sender._send

    async def timed_send(batch: Any, auto_n: int) -> Any:
        t = time.perf_counter()
        try:
            return await send(batch, auto_n)
        finally:
            log["send"].append((log["variant"], time.perf_counter() - t))

    self.sender._send = timed_send


def _set_variant(self: Any, name: str | None) -> None:
    self._idem_profile["variant"] = name


def _timings(self: Any) -> dict[str, list[tuple[str | None, float]]]:
    log = self._idem_profile
    return {"from_bytes": list(log["from_bytes"]), "send": list(log["send"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=40, help="rounds of the four variants")
    parser.add_argument("--calls", type=int, default=15, help="sends per variant and round")
    parser.add_argument(
        "--broker-timing", action="store_true", help="time from_bytes and _send in the broker"
    )
    args = parser.parse_args(argv)
    start_local_ray()
    with tempfile.TemporaryDirectory(prefix="raymq-idem-profile-") as root:
        cluster = actors.start_cluster(
            namespace="raymq-idem-profile",
            nameservers=1,
            brokers=1,
            store_root=root,
            topics=[actors.TopicConfig(TOPIC, 4, 4)],
            broker_options={
                "store": {"commitlog_file_size": 256 << 20, "flush_disk_type": "ASYNC_FLUSH"}
            },
        )
        try:
            broker = cluster.broker("broker-a")
            a = cluster.producer("idem-a", enable_idempotence=True, max_batch_messages=4096)
            b = cluster.producer("idem-b", enable_idempotence=False, max_batch_messages=4096)
            seq_a, seq_b = a._sender.sequencer, Sequencer(b._allocate_id)
            variants = {
                "A on": (a, seq_a),
                "A off": (a, None),
                "B on": (b, seq_b),
                "B off": (b, None),
            }
            msgs = [Message(TOPIC, b"i" * 100) for _ in range(1000)]
            for p, s in variants.values():  # warm up; A gets its id, so its encoder a slot
                _switch(p, a, s)
                for _ in range(10):
                    p.send_batch(msgs)
            wall: dict[str, list[float]] = {k: [] for k in variants}
            client_cpu = dict.fromkeys(variants, 0.0)
            broker_cpu = dict.fromkeys(variants, 0.0)
            names = list(variants)
            if args.broker_timing:
                ray.get(broker.__ray_call__.remote(_install_timers))
            for r in range(args.blocks):
                order = names[r % 4 :] + names[: r % 4]
                for name in reversed(order) if r % 8 >= 4 else order:
                    p, s = variants[name]
                    _switch(p, a, s)
                    if args.broker_timing:
                        ray.get(broker.__ray_call__.remote(_set_variant, name))
                    b0, c0 = _broker_cpu_s(broker), time.process_time()
                    for _ in range(args.calls):
                        t = time.perf_counter()
                        p.send_batch(msgs)
                        wall[name].append(time.perf_counter() - t)
                    client_cpu[name] += time.process_time() - c0
                    broker_cpu[name] += _broker_cpu_s(broker) - b0
            _switch(a, a, seq_a)
            b._sender.sequencer = None
            n = args.blocks * args.calls
            print(f"sync batches of 1,000 x 100 B; {n} sends per variant")
            for name in names:
                v = wall[name]
                print(
                    f"  {name:5s}  wall median {statistics.median(v) * 1e6:6.0f} us  "
                    f"mean {statistics.fmean(v) * 1e6:6.0f} us  |  CPU per send: client "
                    f"{client_cpu[name] / n * 1e6:5.0f} us, broker {broker_cpu[name] / n * 1e6:5.0f} us"
                )
            if args.broker_timing:
                got = ray.get(broker.__ray_call__.remote(_timings))
                print("in the broker (median per send):")
                for name in names:
                    fb = [d for v, d in got["from_bytes"] if v == name]
                    sent = [d for v, d in got["send"] if v == name]
                    print(
                        f"  {name:5s}  from_bytes {statistics.median(fb) * 1e6:5.0f} us  "
                        f"_send {statistics.median(sent) * 1e6:5.0f} us  (n={len(sent)})"
                    )
            for p in (a, b):
                p.close()
        finally:
            cluster.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
