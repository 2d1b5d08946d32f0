"""A slave acknowledges the master's bytes once appended and builds their queue entries
just after. A checkpoint or a clean stop between the two must not say those records are
in the ConsumeQueues: a restart would then never build their entries, and the next
records dispatched would leave holes at their queue offsets (messages the master
acknowledged, read nowhere on this member, also once it is promoted)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from storage import Message, MessageStore
from tests.storage.conftest import small_config

TOPIC = "Replicated"


def copy(master: MessageStore, slave: MessageStore, *, dispatch: bool) -> None:
    offset = slave.commitlog.max_offset
    while offset < master.commitlog.max_offset:
        chunk = master.read_commitlog(offset, 1 << 20)
        offset = slave.append_commitlog(offset, chunk, dispatch=dispatch)


def put(master: MessageStore, prefix: str) -> list[bytes]:
    bodies = [f"{prefix}-{i}".encode() for i in range(4)]
    master.put_batch([Message(TOPIC, b, queue_id=0) for b in bodies])
    return bodies


def read_queue(store: MessageStore) -> list[bytes]:
    got = store.get("g", TOPIC, 0, 0, 100)
    assert got.next_offset == store.max_offset(TOPIC, 0)
    return [m.body for m in got.messages]


@pytest.mark.parametrize("stop", ["crash after a checkpoint", "clean stop"])
def test_records_appended_but_not_dispatched_get_their_entries_after_a_restart(
    tmp_path: Path, stop: str
) -> None:
    with MessageStore(small_config(tmp_path / "master"), start_services=False) as master:
        slave = MessageStore(small_config(tmp_path / "slave"), start_services=False)
        expected = put(master, "first")
        copy(master, slave, dispatch=True)
        expected += put(master, "acked")
        copy(master, slave, dispatch=False)  # acknowledged, its entries not built yet
        assert slave.dispatched_offset < slave.commitlog.max_offset
        restarted = tmp_path / "slave"
        if stop == "clean stop":
            slave.close()
        else:
            slave.checkpoint_now()
            restarted = tmp_path / "killed"  # what a SIGKILL leaves: the page cache, abort
            shutil.copytree(tmp_path / "slave", restarted)
            slave.close()
        expected += put(master, "after")
        with MessageStore(small_config(restarted), start_services=False) as again:
            copy(master, again, dispatch=True)
            assert read_queue(again) == expected
            assert read_queue(again) == read_queue(master)
