"""An awaited transactional producer's one-phase commit whose master dies in the middle
of it (the append made, no answer) and whose slave is promoted: another actor, under
another name.

The commit reads the route again and sends the same commit to the promoted slave, as
the threaded producer does (``test_ha_one_phase_restart.py``). It went on asking the
dead master's name, which the route from the start of the commit gives, until its
deadline, and failed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import ray
from raymq_ha_testkit import is_dead, members, read_all
from raymq_testkit import wait_until

import actors
from actors import BrokerSpec, TransactionState
from actors.aio import AsyncTransactionalProducer
from storage import Message

TOPIC = "OnePhasePromoted"
FAST = {"slave_sync_interval_s": 0.2, "ha_slave_timeout_s": 1.5}


def test_an_awaited_one_phase_commit_follows_the_promoted_slave(
    make_cluster: Any, tmp_path: Path
) -> None:
    cluster = make_cluster(
        nameservers=1,
        brokers=[BrokerSpec("broker-a", 0), BrokerSpec("broker-a", 1)],
        topics=[actors.TopicConfig(TOPIC, 2, 2)],
        store_root=str(tmp_path / "one-phase-promoted"),
        broker_options={"broker_role": "SYNC_MASTER", **FAST},
        max_restarts=0,  # a crash is the end of the actor
    )
    master = cluster.broker("broker-a", 0)

    async def main() -> tuple[TransactionState, int]:
        async with AsyncTransactionalProducer(
            "p-one-phase-promoted",
            transactional_id="tid-one-phase-promoted",
            namespace=cluster.namespace,
            coordinator_log_dir=str(tmp_path / "coordinator"),
        ) as p:
            async with p.begin() as warm:  # the routes cached, the one-phase path taken
                await warm.send(Message(TOPIC, b"warm"))
            assert p.one_phase_commits == 1
            # the append is made, then the process exits before it answers
            await asyncio.to_thread(ray.get, master.inject_fault.remote("crash_after_one_phase"))
            txn = p.begin()
            await txn.send([Message(TOPIC, b"op-%d" % i) for i in range(5)])
            commit = asyncio.ensure_future(txn.commit())

            def promote() -> None:
                wait_until(lambda: is_dead(master), what="the master's actor dead")
                wait_until(lambda: 0 not in members(cluster, "broker-a"), what="master gone")
                cluster.admin.promote("broker-a", 1)

            await asyncio.to_thread(promote)
            await asyncio.wait_for(commit, 40)
            return txn.state, p.one_phase_commits

    state, commits = asyncio.run(asyncio.wait_for(main(), 120))
    assert state is TransactionState.COMMITTED and commits == 2
    wait_until(
        lambda: members(cluster, "broker-a").get(0) == "broker-a-1", what="promoted in routes"
    )
    bodies = read_all(cluster.pull_consumer("g-one-phase-promoted"), TOPIC)
    assert sorted(bodies) == [b"op-%d" % i for i in range(5)] + [b"warm"]
