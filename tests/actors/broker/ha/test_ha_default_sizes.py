"""Master/slave replication with the file sizes users run (1 GiB CommitLog files, 300,000
ConsumeQueue entries, a ~420 MB index): a slave copies the master's CommitLog, and one
that was down catches up from where its store ends, as it does with small files. A cost
that grows with a file's size (a slice of the mmap copying to the file's end, a scan
from the file's start) shows here as a catch-up that does not finish."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import ray
from raymq_ha_testkit import broker_config, kill, start_broker, status_of
from raymq_testkit import DEFAULT_SIZES, SMALL_STORE, wait_until

import actors
from actors import BrokerSpec, SendStatus
from storage import Message

GROUP = [BrokerSpec("broker-a", 0), BrokerSpec("broker-a", 1)]
FAST = {"slave_sync_interval_s": 0.2, "ha_slave_timeout_s": 1.5}


def _max_offset(handle: Any) -> int:
    return int(status_of(handle).get("commitlog_max_offset", -1))


def _commitlog_prefix(store_dir: str, upto: int) -> bytes:
    """The first ``upto`` bytes of a store's CommitLog (read file by file, never more)."""
    out, left = [], upto
    for f in sorted((Path(store_dir) / "commitlog").iterdir()):
        if left <= 0:
            break
        with open(f, "rb") as fh:
            chunk = fh.read(left)
        out.append(chunk)
        left -= len(chunk)
    return b"".join(out)


def _send(producer: actors.Producer, start: int, n: int) -> None:
    results = producer.send_batch(
        [Message("HAD", b"m%06d" % i + b"." * 400, keys=f"k{i}") for i in range(start, start + n)]
    )
    assert {r.status for r in results} == {SendStatus.SEND_OK}


@pytest.mark.default_sizes
@pytest.mark.parametrize("make_cluster", ["default"], indirect=True)
def test_a_slave_that_was_down_catches_up_with_default_file_sizes(
    make_cluster: Any, tmp_path: Path
) -> None:
    cluster = make_cluster(
        nameservers=1,
        brokers=GROUP,
        topics=[actors.TopicConfig("HAD", 4, 4)],
        broker_options={"broker_role": "ASYNC_MASTER", **FAST},
    )
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    producer = cluster.producer("p-had", max_batch_messages=500)
    _send(producer, 0, 5000)
    wait_until(lambda: _max_offset(slave) == _max_offset(master) > 0, what="slave caught up")
    slave_dir = status_of(slave)["store_dir"]
    kill(slave)

    # the master goes on alone: ~10 MB the slave has to fetch when it is back
    for start in range(5000, 25_000, 5000):
        _send(producer, start, 5000)
    behind = _max_offset(master)
    config = broker_config(
        cluster,
        str(Path(slave_dir).parent),
        "broker-a",
        1,
        broker_role="ASYNC_MASTER",
        store={**SMALL_STORE, **DEFAULT_SIZES},
        **FAST,
    )
    t0 = time.monotonic()
    slave = start_broker(config)
    wait_until(lambda: _max_offset(slave) >= behind, timeout_s=60, what="the slave back in step")
    took = time.monotonic() - t0
    assert _commitlog_prefix(slave_dir, behind) == _commitlog_prefix(
        status_of(master)["store_dir"], behind
    )
    # its index follows its CommitLog (dispatched after the bytes are acknowledged)
    found = wait_until(
        lambda: ray.get(slave.query_by_key.remote("HAD", "k24999")), what="the key indexed"
    )
    assert [x.body[:7] for x in found] == [b"m024999"]
    # a restart and a catch-up of ~10 MB: seconds, not the minutes a copy to the end of
    # a 1 GiB file per read would take
    assert took < 30, f"catch-up took {took:.1f}s"
    producer.close()
    kill(slave)
