"""``send_async`` batches that queue up behind a broker's calls leave merged, and each
caller still learns where its own messages went."""

from __future__ import annotations

from typing import Any

import pytest
import ray

from actors import PullStatus, SendStatus
from storage import Message
from storage.errors import InvalidMessageError


def test_batches_waiting_for_a_broker_leave_in_one_call_with_their_own_results(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(brokers=1)
    cluster.admin.create_topic("Lanes", 4, 4)
    # lists that are not short (here: no list is): short ones merge in the coalescer
    producer = cluster.producer("lanes", max_in_flight_per_broker=1, coalesce_list_max=0)
    broker = cluster.broker("broker-a")
    before = ray.get(broker.status.remote())["put_batches"]

    futures = [
        producer.send_async([Message("Lanes", b"%d-%d" % (b, i)) for i in range(5)])
        for b in range(200)
    ]
    results = [f.result(timeout=60) for f in futures]

    calls = ray.get(broker.status.remote())["put_batches"] - before
    assert calls < 100  # with one call in flight, waiting batches went out together
    consumer = cluster.pull_consumer("lanes-check")
    stored: dict[tuple[int, int], bytes] = {}
    for mq in consumer.fetch_subscribe_queues("Lanes"):
        r = consumer.pull(mq, 0, 10_000)
        assert r.status is PullStatus.FOUND
        stored.update({(mq.queue_id, off): m.body for off, m in enumerate(r.messages, start=0)})
    assert len(stored) == 1000  # every message once
    for b, result in enumerate(results):
        queues = {s.message_queue.queue_id for s in result}
        assert len(queues) == 1  # a batch keeps the one queue it was given
        for i, sent in enumerate(result):
            assert stored[(sent.message_queue.queue_id, sent.queue_offset)] == b"%d-%d" % (b, i)
    producer.close()


def test_a_merged_call_that_fails_fails_over_each_batch_on_its_own(make_cluster: Any) -> None:
    cluster = make_cluster(brokers=2)
    cluster.admin.create_topic("LanesFail", 2, 2)
    # RocketMQ's at-least-once failover: an idempotent producer (the default) sends what
    # may be stored on broker-b only to broker-b again (tests/actors/client/test_idempotence.py)
    producer = cluster.producer("lanes-fail", max_in_flight_per_broker=1, enable_idempotence=False)
    producer.send_batch([Message("LanesFail", b"warm")] * 4)  # both brokers routed
    ray.kill(cluster.broker("broker-b"), no_restart=True)
    futures = [producer.send_async([Message("LanesFail", b"m%d" % i)] * 3) for i in range(40)]
    results = [f.result(timeout=60) for f in futures]
    assert all(s.message_queue.broker_name == "broker-a" for r in results for s in r)
    producer.close()


def test_a_refused_merged_call_fails_only_the_batches_it_is_about(make_cluster: Any) -> None:
    # the broker takes smaller bodies than the producer checks for: it refuses big ones
    cluster = make_cluster(brokers=1, broker_options={"store": {"max_message_size": 1024}})
    cluster.admin.create_topic("LanesMix", 2, 2)
    producer = cluster.producer("lanes-mix", max_in_flight_per_broker=1, coalesce_list_max=0)
    futures = [
        producer.send_async([Message("LanesMix", b"x" * (100 if i % 2 else 2000))] * 3)
        for i in range(40)
    ]
    for i, future in enumerate(futures):
        if i % 2:
            assert all(s.status is SendStatus.SEND_OK for s in future.result(timeout=60))
        else:
            with pytest.raises(InvalidMessageError, match="over max_message_size=1024"):
                future.result(timeout=60)
    consumer = cluster.pull_consumer("lanes-mix-check")
    stored = sum(consumer.max_offset(mq) for mq in consumer.fetch_subscribe_queues("LanesMix"))
    assert stored == 20 * 3
    producer.close()
