"""What the transactional writes' tests look at in the package's cluster (``raymq`` of
``conftest.py``, brokers ``broker-a`` and ``broker-b``): the bodies a consumer gets,
the half messages still pending, the brokers' transaction counters."""

from __future__ import annotations

from collections import Counter

import ray

import actors

BROKERS = ("broker-a", "broker-b")


def bodies(cluster: actors.Cluster, topic: str) -> Counter[bytes]:
    """Every body a consumer of ``topic`` gets, counted."""
    consumer = cluster.pull_consumer("probe-bodies")
    out: Counter[bytes] = Counter()
    for mq in consumer.fetch_subscribe_queues(topic):
        offset, end = 0, consumer.max_offset(mq)
        while offset < end:
            got = consumer.pull(mq, offset, 1000)
            out.update(got.bodies)
            offset = got.next_offset
    consumer.close()
    return out


def pending(cluster: actors.Cluster, topic: str) -> int:
    """Half messages for ``topic`` not ended yet, on every broker."""
    return sum(
        1
        for name in BROKERS
        for h in ray.get(cluster.broker(name).pending_transactions.remote())
        if h["topic"] == topic
    )


def txn_stats(cluster: actors.Cluster) -> Counter[str]:
    """Half messages committed and rolled back so far, over the brokers."""
    out: Counter[str] = Counter()
    for name in BROKERS:
        status = ray.get(cluster.broker(name).status.remote())
        out.update({k: status[k] for k in ("txn_committed", "txn_rolled_back")})
    return out
