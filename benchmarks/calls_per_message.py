"""The Python a single message runs on the client side, counted: calls per message.

    python benchmarks/calls_per_message.py [--messages 200] [--top 15]

One broker (ASYNC_FLUSH) on this machine's local Ray; a producer and a PushConsumer
(the subscription stream) in this process. Each of ``--messages`` 100 B messages is
sent alone (``send_async``), and the next one leaves once the listener had it, so
every message takes the path a message takes at a low rate: alone, through every
layer. A profiler hook (``threading.setprofile``) counts the Python functions and the
C functions they call on each thread, and the run prints, per message and per thread
(the caller's, the client I/O loop's, the consume threads'), how many calls it made
and which functions were called most.

Why count calls: at 1,000 msg/s every message runs through cold caches (the broker
and the consumer run between two messages), and what a process spends on a message
grows with the code it runs, which a warm loop's timing hides and this VM's timings
(drifting 2x within minutes) blur. A count does not drift: a change that removes calls
shows in one run. The counts are of this process (the broker's Python is not in
them); the hook makes the run itself several times slower, so it prints no times.
Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import threading
import time
from types import FrameType
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _local import start_local_ray  # noqa: E402

import actors  # noqa: E402
from actors import ConsumeStatus, PushConsumer  # noqa: E402
from actors.protocol.connection import IOLoop  # noqa: E402
from storage import Message  # noqa: E402

GROUPS = ("raymq-client-io", "raymq-consume", "MainThread")
"""The threads a message passes, by name prefix; any other thread is counted as
'other'."""


class Counter:
    """Calls per thread group, from a profile hook installed on every thread."""

    def __init__(self) -> None:
        self.calls: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.on = False

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event not in ("call", "c_call"):
            return
        name = threading.current_thread().name
        group = next((g for g in GROUPS if name.startswith(g)), "other")
        if event == "call":
            code = frame.f_code
            key = f"{os.path.basename(code.co_filename)}:{code.co_name}"
        else:
            key = f"C {getattr(arg, '__qualname__', arg)}"
        self.calls[group][key] += 1

    def clear(self) -> None:
        self.calls.clear()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--top", type=int, default=15, help="functions listed per thread")
    args = parser.parse_args()
    counter = Counter()
    threading.setprofile(counter.hook)  # threads started from here on: the client's
    sys.setprofile(counter.hook)
    start_local_ray()
    root = tempfile.mkdtemp(prefix="raymq-calls-")
    namespace, topic = "raymq-calls", "Calls"
    cluster = actors.start_cluster(
        namespace=namespace,
        nameservers=1,
        brokers=1,
        store_root=root,
        topics=[actors.TopicConfig(topic, 4, 4)],
        broker_options={"store": {"flush_disk_type": "ASYNC_FLUSH"}},
    )
    got = threading.Semaphore(0)

    def listener(messages: list[Any]) -> ConsumeStatus:
        for _ in messages:
            got.release()
        return ConsumeStatus.SUCCESS

    consumer = PushConsumer("calls", topic, listener=listener, namespace=namespace)
    producer = cluster.producer("calls")
    try:
        consumer.start()
        IOLoop.get().loop.call_soon_threadsafe(sys.setprofile, counter.hook)  # started before
        body = b"x" * 100

        def one() -> None:
            producer.send_async(Message(topic, body))
            if not got.acquire(timeout=30):
                raise TimeoutError("the listener did not get a message within 30 s")

        for _ in range(300):  # warm: routes, the producer id, the stream's queues
            one()
        counter.on = True
        counter.clear()
        for _ in range(args.messages):
            one()
            time.sleep(0.002)  # the answers and the stream's credit are read meanwhile
        counter.on = False
        n = args.messages
        print(f"calls per message, {n} messages sent alone (Python functions + C functions)")
        total_py = total_c = 0.0
        for group in (*GROUPS, "other"):
            calls = counter.calls.get(group)
            if not calls:
                continue
            py = sum(v for k, v in calls.items() if not k.startswith("C ")) / n
            c = sum(v for k, v in calls.items() if k.startswith("C ")) / n
            total_py += py
            total_c += c
            print(f"  {group:18s} {py:7.1f} + {c:7.1f}")
            for key, count in calls.most_common(args.top):
                print(f"      {count / n:6.2f}  {key}")
        print(f"  {'all':18s} {total_py:7.1f} + {total_c:7.1f}")
    finally:
        counter.on = False
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        consumer.shutdown()
        producer.close()
        cluster.shutdown()
        import ray

        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
