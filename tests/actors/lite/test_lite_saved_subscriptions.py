"""A broker's lite subscription tables saved and loaded (real store on a temp dir, no
Ray): the tables come back as saved, with a Raft group's log replayed after the file and
each change applied once (the order of a lite topic's subscribers, hence its owner,
depends on it), and an unreadable file starts empty tables with an error logged, or
in a Raft group tables rebuilt from the log."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from actors.broker.lite.consumers import LiteConsumers
from storage import MessageStore, StoreConfig
from storage.lite import LiteConfig, LiteStore, encode_state


class Member:
    """A Raft member's lite store, its group's commit moved by hand, with the broker's
    subscription tables over it."""

    def __init__(self, path: Path, replay: bool = True) -> None:
        config = StoreConfig(
            store_dir=str(path),
            commitlog_file_size=1 << 20,
            consume_queue_file_entries=64,
            index_hash_slots=97,
            index_max_entries=400,
            max_message_size=16 * 1024,
        )
        self.store = MessageStore(config, start_services=False)
        self.end = 0  # committed up to here: unknown at start, told by the leader
        self.lite = LiteStore(self.store, LiteConfig(index_file_entries=64), lambda: self.end)
        self.lite.declare_parent("Chat", quota=100, ttl_ms=3_600_000)
        # the broker's runtime, Raft log and held reads take no part in saving tables
        none: Any = None
        self.tables = LiteConsumers(none, self.lite, none, none, owner_lease_s=30.0)
        self.tables.load(replay=replay)
        self.lite.state_listener = self.tables.on_state

    def change(self, *ops: dict[str, Any]) -> None:
        """The leader's proposals, committed and applied."""
        for op in ops:
            self.store._put_encoded(encode_state(op, self.store.config.max_message_size))
        self.end = self.store.commitlog.max_offset
        self.lite.catch_up()

    def close(self) -> None:
        self.lite.close()
        self.store.close()


def sub(client: str, action: str, *names: str, group: str = "g") -> dict[str, Any]:
    return {
        "op": "subscribe",
        "group": group,
        "parent": "Chat",
        "client": client,
        "names": list(names),
        "action": action,
    }


def test_the_tables_come_back_with_the_log_after_the_file_applied_once(tmp_path: Path) -> None:
    m = Member(tmp_path)
    m.change(sub("c1", "add", "a", "b"), sub("c2", "add", "a"), sub("c1", "remove", "a"))
    assert m.tables.save()
    assert not m.tables.save()  # nothing changed since
    m.lite.flush()  # its upkeep's turn: the checkpoint covers them too
    checkpoint = (tmp_path / "lite" / "checkpoint").read_bytes()
    # after the file: c1 leaves b, comes back, is dropped as silent and comes back
    # behind c3, who owns b
    m.change(sub("c1", "remove", "b"), sub("c1", "add", "b"), sub("c3", "add", "b"))
    m.change({"op": "gone", "group": "g", "parent": "Chat", "clients": ["c1"]})
    m.change(sub("c1", "add", "b"), sub("c4", "add", "a", group="h"))
    before = m.tables.tables()
    assert before == {("g", "Chat"): {"a": ["c2"], "b": ["c3", "c1"]}, ("h", "Chat"): {"a": ["c4"]}}
    m.close()  # the lite store's checkpoint covers every change, the file does not
    again = Member(tmp_path)
    try:
        assert again.tables.tables() == before
        assert again.tables.owners("Chat", "b") == {"g": "c3"}
    finally:
        again.close()

    # the file ahead of the store's checkpoint (a crash between their writes): the
    # changes the store applies again are ones the tables hold, each applied once
    m = Member(tmp_path)
    m.change(sub("c3", "remove", "b"), sub("c3", "add", "b"), sub("c5", "add", "b"))
    assert m.tables.save()
    want = m.tables.tables()
    assert want[("g", "Chat")]["b"] == ["c1", "c3", "c5"]
    m.close()
    (tmp_path / "lite" / "checkpoint").write_bytes(checkpoint)  # back before them
    again = Member(tmp_path)
    try:
        again.end = again.store.commitlog.max_offset  # the leader says what is committed
        again.lite.catch_up()  # from the old checkpoint: every change since, once more
        assert again.tables.tables() == want  # applied twice, c5 would own b
    finally:
        again.close()


@pytest.mark.parametrize("replay", [False, True], ids=["plain", "raft"])
def test_an_unreadable_file_starts_empty_tables_with_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, replay: bool
) -> None:
    m = Member(tmp_path, replay=replay)
    m.change(sub("c1", "add", "a"), sub("c2", "add", "a"))
    assert m.tables.save()
    want = m.tables.tables()
    m.close()
    saved = tmp_path / "lite" / "subscriptions.json"
    twice = b'"subscribers": {"a": ["c1", "c1"]}'
    for damage in (
        b'{"version": 1, "at": 0, "groups": [{"group": 7}]}',
        b'{"version": 1, "at": 0, "groups": [{"group": "g", "parent": "Chat", %s}]}' % twice,
        b"\x00\xff{trunc",
    ):
        saved.write_bytes(damage)
        with caplog.at_level(logging.ERROR, logger="raymq.actors.broker.lite"):
            again = Member(tmp_path, replay=replay)
        try:
            errors = [r for r in caplog.records if r.levelno == logging.ERROR]
            assert len(errors) == 1 and "subscriptions.json unreadable" in errors[0].message
            assert (tmp_path / "lite" / "subscriptions.json.corrupt").read_bytes() == damage
            # a Raft member rebuilds them from the log; elsewhere they start empty
            assert again.tables.tables() == (want if replay else {})
            again.change(sub("c3", "add", "b"))  # and the broker goes on
            assert again.tables.owners("Chat", "b") == {"g": "c3"}
            assert again.tables.save()
            want = again.tables.tables()
        finally:
            again.close()
        caplog.clear()
        assert saved.exists()
