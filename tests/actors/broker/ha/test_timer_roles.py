"""Only a master (DLedger leader) runs the timer service, as it runs the schedule service:
a broker's StoreServices starts it with the master's services and stops it on demotion,
and a new one takes over the same wheel when the broker leads again."""

from __future__ import annotations

import time
from pathlib import Path

from raymq_testkit import SMALL_STORE, wait_until

from actors.broker.ha.replication import StoreServices
from storage import Message, MessageStore, StoreConfig


def test_the_timer_runs_only_while_master(tmp_path: Path) -> None:
    cfg = StoreConfig(str(tmp_path / "s"), **SMALL_STORE)  # type: ignore[arg-type]
    with MessageStore(cfg, start_services=False) as store:
        services = StoreServices(store)
        services.start()  # what every role runs: flush, checkpoint, expiry
        try:
            assert services.timer is None
            store.put(Message("T", b"one", deliver_at_ms=int(time.time() * 1000) + 200))
            services.start_schedule()  # this broker became master
            first = services.timer
            assert first is not None
            wait_until(lambda: store.max_offset("T", 0) == 1, timeout_s=5, what="delivery")
            services.stop_schedule()  # demoted: nothing delivers
            assert services.timer is None and first.wheel is store.timer_wheel
            store.put(Message("T", b"two", deliver_at_ms=int(time.time() * 1000) + 200))
            services.start_schedule()  # master again: a new service, the same wheel
            assert services.timer is not None and services.timer is not first
            wait_until(lambda: store.max_offset("T", 0) == 2, timeout_s=5, what="delivery")
            assert [m.body for m in store.get("g", "T", 0, 0).messages] == [b"one", b"two"]
        finally:
            services.stop()
