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
from storage.errors import BrokerUnavailableError


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
        settings = {parent: {"quota": quota, "ttlMs": ttl_ms}}

        def created_on_the_leader() -> str | None:
            # as an admin would: on the member leading now, again if leadership moved
            # before the followers copied it (a deposed leader refuses to create it)
            lead = members(cluster, broker_name).get(0)
            if lead is None:
                return None
            leader = handles[lead]
            if ray.get(leader.lite_parents.remote()) != settings:
                try:
                    ray.get(leader.lite_create_parent.remote(parent, quota=quota, ttl_ms=ttl_ms))
                except BrokerUnavailableError:
                    return None
            return lead

        def everyone_holds_it() -> str | None:
            lead = created_on_the_leader()
            held = all(ray.get(h.lite_parents.remote()) == settings for h in handles.values())
            return lead if held and members(cluster, broker_name).get(0) == lead else None

        lead = wait_until(everyone_holds_it, what="every member took the leader's LITE parent")
        return RaftGroup(cluster, handles, lead)

    return start
