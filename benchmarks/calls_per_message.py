"""The Python a single message runs, counted: calls per message, in the client's
process and in the broker's.

    python benchmarks/calls_per_message.py [--messages 200] [--top 15] [--by-caller]

One broker (ASYNC_FLUSH) on this machine's local Ray; a producer and a PushConsumer
(the subscription stream) in this process. Each of ``--messages`` 100 B messages is
sent alone (``send_async``), and the next one leaves once the listener had it, so
every message takes the path a message takes at a low rate: alone, through every
layer. A profiler hook (``threading.setprofile``) counts the Python functions and the
C functions they call on each thread, here and in the broker's process (installed
there by a Ray ``worker_process_setup_hook``: the library is not changed), and the run
prints, per message and per thread (the caller's, the client I/O loop's, the consume
threads'; the broker's event loop), how many calls it made and which functions were
called most.

Why count calls: at 1,000 msg/s every message runs through cold caches (the other
processes run between two messages), and what a process spends on a message grows
with the code it runs, which a warm loop's timing hides and this VM's timings
(drifting 2x within minutes) blur. A count does not drift: a change that removes calls
shows in one run. The hook makes the run itself several times slower, so it prints no
times. ``--by-caller`` counts each function by the function that called it. Not a
test: it prints figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from types import FrameType
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _local import actor_pids, start_local_ray  # noqa: E402

import actors  # noqa: E402
from actors import ConsumeStatus, PushConsumer  # noqa: E402
from actors.protocol.connection import IOLoop  # noqa: E402
from storage import Message  # noqa: E402

ENV_DIR = "RAYMQ_CALLS_DIR"
ENV_BY_CALLER = "RAYMQ_CALLS_BY_CALLER"
BY_CALLER = os.environ.get(ENV_BY_CALLER) == "1"
"""Where the Ray workers' counters look for ``on`` and ``dump`` and write their counts."""

GROUPS = ("raymq-client-io", "raymq-consume", "AsyncIO Thread", "MainThread")
"""The threads a message passes, by name prefix (the broker's event loop is Ray's
``AsyncIO Thread``); any other thread is counted as 'other'."""


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
            caller = frame.f_back
        else:
            key = f"C {getattr(arg, '__qualname__', arg)}"
            caller = frame
        if BY_CALLER and caller is not None:
            code = caller.f_code
            key += f" <- {os.path.basename(code.co_filename)}:{code.co_name}"
        self.calls[group][key] += 1

    def install(self) -> None:
        threading.setprofile(self.hook)  # threads started from here on
        sys.setprofile(self.hook)

    def uninstall(self) -> None:
        self.on = False
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def install_in_worker() -> None:
    """A Ray worker's setup hook: count this process's calls while ``<dir>/on`` exists,
    and write them to ``<dir>/<pid>.json`` when ``<dir>/dump`` appears."""
    out = os.environ.get(ENV_DIR)
    if not out:
        return
    counter = Counter()

    def control() -> None:  # started before the hook: its own polling is not counted
        while True:
            counter.on = os.path.exists(os.path.join(out, "on"))
            dump = os.path.join(out, "dump")
            mine = os.path.join(out, f"{os.getpid()}.json")
            if os.path.exists(dump) and not os.path.exists(mine):
                with open(mine + ".tmp", "w") as f:
                    json.dump({g: dict(c) for g, c in counter.calls.items()}, f)
                os.replace(mine + ".tmp", mine)
            time.sleep(0.02)

    threading.Thread(target=control, name="raymq-calls-control", daemon=True).start()
    counter.install()


def report(title: str, calls: Mapping[str, Mapping[str, int]], n: int, top: int) -> None:
    print(f"{title}: calls per message (Python functions + C functions)")
    total_py = total_c = 0.0
    for group in (*GROUPS, "other"):
        counts = calls.get(group)
        if not counts:
            continue
        py = sum(v for k, v in counts.items() if not k.startswith("C ")) / n
        c = sum(v for k, v in counts.items() if k.startswith("C ")) / n
        total_py += py
        total_c += c
        print(f"  {group:18s} {py:7.1f} + {c:7.1f}")
        for key, count in collections.Counter(counts).most_common(top):
            print(f"      {count / n:6.2f}  {key}")
    print(f"  {'all':18s} {total_py:7.1f} + {total_c:7.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--top", type=int, default=15, help="functions listed per thread")
    parser.add_argument(
        "--by-caller", action="store_true", help="count each function by the function calling it"
    )
    args = parser.parse_args()
    global BY_CALLER
    BY_CALLER = args.by_caller
    counter = Counter()
    counter.install()
    out = tempfile.mkdtemp(prefix="raymq-calls-out-")
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    start_local_ray(
        runtime_env={
            "env_vars": {ENV_DIR: out, "PYTHONPATH": path, ENV_BY_CALLER: str(int(BY_CALLER))},
            "worker_process_setup_hook": "calls_per_message.install_in_worker",
        }
    )
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
        broker = actor_pids("Broker")[0]
        open(os.path.join(out, "on"), "w").close()
        time.sleep(0.2)  # the broker's control thread looks every 20 ms
        counter.calls.clear()
        counter.on = True
        for _ in range(args.messages):
            one()
            time.sleep(0.002)  # the answers and the stream's credit are read meanwhile
        counter.on = False
        os.remove(os.path.join(out, "on"))
        time.sleep(0.2)
        open(os.path.join(out, "dump"), "w").close()
        dumped = os.path.join(out, f"{broker}.json")
        deadline = time.monotonic() + 30
        while not os.path.exists(dumped) and time.monotonic() < deadline:
            time.sleep(0.05)
        n = args.messages
        print(f"{n} messages of 100 B, each sent alone and consumed before the next")
        report("client (producer and PushConsumer)", counter.calls, n, args.top)
        if os.path.exists(dumped):
            with open(dumped) as f:
                report("broker", json.load(f), n, args.top)
        else:
            print("broker: its counts did not come (the setup hook did not run?)")
    finally:
        counter.uninstall()
        consumer.shutdown()
        producer.close()
        cluster.shutdown()
        import ray

        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
