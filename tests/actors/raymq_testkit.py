"""Helpers shared by the actors tests (a uniquely named module, imported by name)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import actors
from actors import PullStatus
from rebalance import MessageQueue
from storage import StoreConfig

SMALL_STORE = {
    "commitlog_file_size": 8 << 20,
    "consume_queue_file_entries": 20_000,
    "index_hash_slots": 4099,
    "index_max_entries": 200_000,
    "max_message_size": 1 << 20,
    "flush_interval_commitlog_ms": 50,
    "flush_interval_consume_queue_ms": 100,
}


DEFAULT_SIZES = {
    field.name: field.default
    for field in dataclasses.fields(StoreConfig)
    if field.name
    in (
        "commitlog_file_size",
        "consume_queue_file_entries",
        "index_hash_slots",
        "index_max_entries",
        "max_message_size",
    )
}
"""The file sizes users run (a 1 GiB CommitLog file, 300,000 ConsumeQueue entries, a
~420 MB index file): a test's store with these instead of ``SMALL_STORE``'s shows a
cost that grows with a file's size. Each such broker takes ~1.4 GB of disk."""

STORE_SIZES = [
    pytest.param("small"),
    pytest.param("default", marks=pytest.mark.default_sizes, id="default-sizes"),
]
"""For ``@pytest.mark.parametrize("make_cluster", STORE_SIZES, indirect=True)``: the
test with small store files and again with ``DEFAULT_SIZES`` (marked ``default_sizes``)."""


_RAY_STREAMED_LINE = re.compile(r"^(\x1b\[[0-9;]*m)*\(")


def printed_json(out: str) -> Any:
    """The JSON a CLI command printed to ``out`` (captured stdout), without the lines Ray
    streams from workers to this driver's stdout meanwhile (``(name pid=N) ...``, colored
    or not): a JSON document never starts a line with ``(``."""
    return json.loads("\n".join(ln for ln in out.splitlines() if not _RAY_STREAMED_LINE.match(ln)))


def stored_ends(cluster: Any, topic: str, host_of: dict[str, str]) -> dict[tuple[str, int], int]:
    """Each queue of ``topic``'s max offset, keyed (its broker's address, queue id), as
    a delivery log's ``missing`` takes them."""
    return {
        (host_of[r["broker"]], r["queue_id"]): r["max_offset"]
        for r in cluster.admin.topic_status(topic)
    }


def unique_namespace(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@contextlib.contextmanager
def paused(pid: int) -> Iterator[None]:
    """Process ``pid`` stopped (SIGSTOP) for the block, resumed (SIGCONT) after it,
    whatever the block raised: a loaded machine's or a GC's pause, made on purpose."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def wait_until(
    predicate: Callable[[], Any],
    timeout_s: float = 20.0,
    interval_s: float = 0.02,
    what: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


PUSH_FAST = {
    "rebalance_interval_s": 0.3,
    "heartbeat_interval_s": 0.3,
    "persist_offset_interval_s": 0.2,
    "pull_suspend_s": 2.0,
    "pull_retry_delay_s": 0.2,
    "local_retry_delay_s": 0.2,
}
"""PushConsumer intervals short enough for tests."""


def start_push_cluster(name: str, root: str, **store: Any) -> Any:
    """One NameServer and two brokers with small stores and quick consumer expiry, for
    the push-consumer tests (``store`` overrides ``SMALL_STORE``)."""
    import actors

    return actors.start_cluster(
        namespace=unique_namespace(name),
        nameservers=1,
        brokers=2,
        store_root=root,
        broker_options={
            "store": {**SMALL_STORE, **store},
            "heartbeat_interval_s": 2.0,
            "channel_expired_s": 4.0,
        },
    )


def drain(
    consumer: actors.PullConsumer, topic: str, tags: str | None = None, batch: int = 1000
) -> dict[MessageQueue, list[Any]]:
    """Every message of every queue from offset 0, queue by queue in offset order."""
    out: dict[MessageQueue, list[Any]] = defaultdict(list)
    queues = consumer.fetch_subscribe_queues(topic)
    offsets = dict.fromkeys(queues, 0)
    while offsets:
        results = consumer.pull_many(list(offsets.items()), batch, tags=tags)
        for r in results:
            if r.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG):
                out[r.queue].extend(r.messages)
                offsets[r.queue] = r.next_offset
            else:
                del offsets[r.queue]
    return out


# source, so that a fresh process and a broker actor (which can't import tests) run it too
CHURN = """
def churn(rounds=5):
    '''Page faults of each round of allocating 3 x 6 MB (as a large pull's buffers) and
    freeing them.'''
    def minor_faults():
        with open("/proc/self/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[7])

    faults = []
    for _ in range(rounds):
        before = minor_faults()
        blocks = [bytearray(6 << 20) for _ in range(3)]
        del blocks
        faults.append(minor_faults() - before)
    return faults
"""
