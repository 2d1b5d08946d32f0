"""A master cut off from Ray's GCS and its NameServer, while a client holding its route
still reaches its socket, stops acknowledging within its cluster lease
(``actors/broker/lease.py``), takes writes again after the heal, and every message it
acknowledged is read back exactly once.

Nodes: ``a`` (Ray head: the GCS and the NameServer), ``b`` (the only broker, a master
with no slave: nothing but the lease stops it from acknowledging) and ``client`` (the
producer and the checker), each in its own network namespace (``c`` and ``d`` idle: the
lab is shared with other tests). Schedule: sends for a
while, b partitioned from a (the client still reaches both) for ``CUT_S``, longer than
the lease, healed, a quiet period of ``QUIET_S`` with sends going on, then every queue
read back from offset 0. The lease is shortened to ``LEASE_S`` (renewed every
``RENEW_S``) to keep the run short; the default is 10 s every 2 s.
"""

from __future__ import annotations

import time
from typing import Any

from checker import ACK, Verdict
from workload import SHARED_NODES, assert_exactly_once, brokers_on, finish, start_workload

LAB_GROUP = "shared"  # one lab for the tests on SHARED_NODES (conftest.py)

LEASE_S = 4.0
RENEW_S = 0.5
MARGIN_S = 2.0
"""An acknowledgement of a send made later than cut + ``LEASE_S`` + this, before the
heal, is one the cut-off master should have refused (the margin covers a renewal
interval and the send's own round trip)."""
CUT_S = 16.0
QUIET_S = 5.0
TOPIC = "FaultCutOffMaster"
BROKER = "broker-a"


def test_cut_off_master_stops_acknowledging_within_its_lease(lab_factory: Any) -> None:
    began = time.monotonic()
    lab = lab_factory(SHARED_NODES, cpus={"client": 0})
    b = lab.nodes["b"]
    client = start_workload(
        lab,
        TOPIC,
        brokers_on(lab, BROKER, ["b"]),
        {
            "broker_role": "ASYNC_MASTER",
            "cluster_lease_s": LEASE_S,
            "lease_renew_interval_s": RENEW_S,
            "heartbeat_interval_s": 2.0,
        },
    )
    ready = client.wait_for("ready", timeout_s=120)
    master_pid = ready["brokers"][f"{BROKER}-0"]["pid"]
    assert master_pid in b.actor_pids("Broker"), "the master is not on b"
    client.wait_for("progress", timeout_s=60, until=lambda e: e["acked"] >= 200)

    lab.partition(["b"], ["a"])  # b keeps the client, loses the GCS and the NameServer
    cut = time.monotonic()
    time.sleep(CUT_S)  # the fault schedule
    heal_began = time.monotonic()  # from here the network may carry b's lease again
    lab.heal()
    healed = time.monotonic()
    at_heal = client.last["progress"]["acked"]
    client.wait_for("progress", timeout_s=30, until=lambda e: e["acked"] > at_heal)
    time.sleep(QUIET_S)
    master_stayed = master_pid in b.actor_pids("Broker")  # Ray did not declare b dead
    raw, verdict = finish(client)
    acks = [o for o in raw if o["outcome"] == ACK and BROKER in o["brokers"]]
    # a send made while the heal was under way may be answered by a master whose lease
    # the healed network renewed: neither during the cut nor after it
    during = [o for o in acks if cut <= o["invoked"] < heal_began]
    late = [o for o in during if o["invoked"] > cut + LEASE_S + MARGIN_S]
    after = [o for o in acks if o["invoked"] >= healed]
    last = max(during, key=lambda o: o["invoked"], default=None)
    print()
    print(Verdict.HEADER)
    print(verdict.row(f"cut-off master b|a {CUT_S:.0f}s"))
    print(
        f"lease {LEASE_S:g}s/{RENEW_S:g}s; cut {healed - cut:.1f}s; acknowledging until "
        + (
            f"t = cut + {last['invoked'] - cut:.1f} s (acked at cut + "
            f"{last['completed'] - cut:.1f} s)"
            if last
            else "the cut (nothing sent during it acknowledged)"
        )
        + f"; {len(late)} acks sent after cut + {LEASE_S + MARGIN_S:g} s"
    )
    print(
        "acknowledged again at heal + "
        + (f"{min(o['completed'] for o in after) - healed:.1f} s" if after else "never")
        + f"; master {'still' if master_stayed else 'no longer'} on b (pid {master_pid}); "
        f"{verdict.messages} messages sent, {verdict.read} read; "
        f"run {time.monotonic() - began:.0f}s"
    )
    assert not late, (
        f"{len(late)} sends made after cut + {LEASE_S + MARGIN_S:g} s acknowledged by the "
        f"cut-off master, the last sent at cut + {late[-1]['invoked'] - cut:.1f} s"
    )
    assert after, "no send acknowledged after the heal"
    assert_exactly_once(verdict)
