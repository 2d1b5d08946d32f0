"""The Raft (DLedger) group the lite tests start: three members of one broker name,
its leader, and a LITE parent every member took from the leader."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import ray
from raymq_ha_testkit import RAFT, RaftGroup, members
from raymq_testkit import wait_until

from actors import BrokerSpec


@pytest.fixture
def raft_group(make_cluster: Any) -> Callable[..., RaftGroup]:
    """``raft_group(broker_name, parent, quota=10, ttl_ms=3_600_000, **options)``: a
    cluster with one NameServer and a three-member Raft group (``RAFT`` timings, and
    these broker options), once it has a leader and every member holds the LITE
    ``parent`` the leader created."""

    def start(
        broker_name: str,
        parent: str,
        quota: int = 10,
        ttl_ms: int = 3_600_000,
        **options: Any,
    ) -> RaftGroup:
        cluster = make_cluster(
            nameservers=1,
            brokers=[BrokerSpec(broker_name, i) for i in range(3)],
            broker_options={**RAFT, **options},
        )
        handles = {f"{broker_name}-{i}": cluster.broker(broker_name, i) for i in range(3)}
        lead = wait_until(lambda: members(cluster, broker_name).get(0), what="a Raft leader")
        ray.get(handles[lead].lite_create_parent.remote(parent, quota=quota, ttl_ms=ttl_ms))
        settings = {parent: {"quota": quota, "ttlMs": ttl_ms}}
        wait_until(
            lambda: all(ray.get(h.lite_parents.remote()) == settings for h in handles.values()),
            what="every member took the leader's LITE parent",
        )
        return RaftGroup(cluster, handles, lead)

    return start
