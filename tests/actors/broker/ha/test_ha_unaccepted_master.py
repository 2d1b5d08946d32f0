"""A master takes writes only once a NameServer has accepted it: one that reaches none
(cut off from them while it starts, and a slave may have been promoted meanwhile) stays
unwritable and keeps asking, however many rounds of registration pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
from raymq_ha_testkit import broker_config, kill, start_broker, status_of
from raymq_testkit import wait_until

from actors import BrokerSpec


def test_a_master_no_nameserver_accepted_takes_no_writes(make_cluster: Any, tmp_path: Path) -> None:
    cluster = make_cluster(nameservers=1, brokers=[BrokerSpec("broker-a", 0)])
    accepted = cluster.broker("broker-a", 0)
    wait_until(lambda: status_of(accepted).get("accepted_as_master"), what="master accepted")

    config = broker_config(cluster, str(tmp_path), "broker-z", 0)
    # it asks the NameServers for its slaves first, for ha_ask_slaves_s (short here):
    # none answering is no answer, so its first registration waits that long
    alone = start_broker(
        config.replace(nameservers=("nameserver-unreachable",), ha_ask_slaves_s=1.0)
    )
    try:
        for _ in range(3):
            assert ray.get(alone.register_all.remote(), timeout=30) == 0
            assert status_of(alone)["accepted_as_master"] is False
    finally:
        kill(alone)
