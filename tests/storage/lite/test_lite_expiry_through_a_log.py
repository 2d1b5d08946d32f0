"""Lite TTL expiry in a Raft group (real stores on temp dirs, no Ray): the leader finds
what is due and proposes an ``expire`` record; every member, the leader too, deletes the
same lite topics when it applies it, at the same point of the log; a topic written after
the leader looked stays; the listeners hear which names went. A store outside a group
tells its own expiry to its ``expired_listener``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lite_member import bodies as member_bodies
from lite_member import open_member as reopen_member
from lite_member import run_member
from store_sizes import small_config

from storage import Message, MessageStore
from storage.lite import LiteConfig, LiteStore, encode_state

LATER_MS = 7_200_000
"""Past the parents' one-hour TTL."""


class Member:
    """One member of a group: its store, lite store and what its listener heard."""

    def __init__(self, path: Path, commit: list[int]) -> None:
        self.store = MessageStore(small_config(path), start_services=False)
        self.lite = LiteStore(self.store, LiteConfig(), committed=lambda: commit[0])
        self.lite.declare_parent("Chat", quota=10, ttl_ms=3_600_000)
        self.heard: list[dict[str, Any]] = []
        self.lite.state_listener = self.heard.append

    def close(self) -> None:
        self.lite.close()
        self.store.close()


def test_an_expire_record_deletes_the_same_topics_everywhere_but_one_written_since(
    tmp_path: Path,
) -> None:
    commit = [0]
    leader, follower = Member(tmp_path / "l", commit), Member(tmp_path / "f", commit)

    def replicate() -> None:
        start = follower.store.commitlog.max_offset
        data = leader.store.read_commitlog(start, 1 << 24)
        follower.store.append_commitlog(start, data)
        commit[0] = leader.store.commitlog.max_offset
        leader.lite.catch_up()
        follower.lite.catch_up()

    def send(lite_topic: str, body: bytes) -> None:
        proposal = leader.lite.prepare("Chat", [(lite_topic, Message("Chat", body))])
        result = leader.store.put_encoded(proposal.batch)
        commit[0] = leader.store.commitlog.max_offset
        leader.lite.settle(proposal, result.commitlog_offsets)

    try:
        for name in ("a", "b", "c"):
            send(name, name.encode())
        replicate()
        now = leader.store.now_ms() + LATER_MS
        due = leader.lite.due_for_expiry(now_ms=now)
        assert [(p, sorted(names)) for p, _, names in due] == [("Chat", ["a", "b", "c"])]
        _, seen, names = due[0]
        assert seen == leader.store.commitlog.max_offset
        # looking deleted nothing, on either member
        assert leader.lite.count("Chat") == follower.lite.count("Chat") == 3
        send("b", b"b again")  # written after the leader looked, before its record
        op = {"op": "expire", "parent": "Chat", "seen": seen, "names": names}
        leader.store._put_encoded(encode_state(op, leader.store.config.max_message_size))
        replicate()
        for member in (leader, follower):
            assert member.lite.lite_topics("Chat") == ["b"]
            assert [m.body for m in member.lite.get("Chat", "b", 0).messages] == [
                b"b",
                b"b again",
            ]
            [heard] = [h for h in member.heard if h["op"] == "expire"]
            assert sorted(heard["names"]) == ["a", "c"]  # what went, not what was asked
        send("a", b"a anew")  # created again, from offset 0
        replicate()
        assert [m.body for m in follower.lite.get("Chat", "a", 0).messages] == [b"a anew"]
    finally:
        leader.close()
        follower.close()
    reopened = Member(tmp_path / "f", commit)
    try:
        assert sorted(reopened.lite.lite_topics("Chat")) == ["a", "b"]
        assert [m.body for m in reopened.lite.get("Chat", "a", 0).messages] == [b"a anew"]
    finally:
        reopened.close()


def test_an_expire_record_applied_again_spares_the_topic_created_after_it(
    tmp_path: Path,
) -> None:
    run_member(
        tmp_path / "s",
        """
        send("a", b"old")
        lite.flush()
        (parent, seen, names), = lite.due_for_expiry(now_ms=store.now_ms() + 7_200_000)
        change(op="expire", parent=parent, seen=seen, names=names)
        assert not lite.exists("Chat", "a")
        send("a", b"new")
        """,
    )
    store, lite = reopen_member(tmp_path / "s")  # the expire record is applied again
    try:
        assert member_bodies(lite, "a") == [b"new"]
        assert lite.count("Chat") == 1
    finally:
        lite.close()
        store.close()


def test_a_store_outside_a_group_tells_its_listener_what_its_expiry_deleted(
    tmp_path: Path,
) -> None:
    store = MessageStore(small_config(tmp_path / "s"), start_services=False)
    lite = LiteStore(store, LiteConfig(expire_slice=2))
    lite.declare_parent("Chat", quota=10, ttl_ms=3_600_000)
    lite.declare_parent("Other", quota=10, ttl_ms=3_600_000)
    told: list[tuple[str, list[str]]] = []
    lite.expired_listener = lambda parent, names: told.append((parent, names))
    try:
        for name in ("a", "b", "c"):
            lite.put("Chat", name, Message("Chat", name.encode()))
        lite.create("Other", "x")
        assert lite.expire(now_ms=store.now_ms() + LATER_MS) == 4
        by_parent: dict[str, list[str]] = {}
        for parent, names in told:
            by_parent.setdefault(parent, []).extend(names)
        assert {p: sorted(n) for p, n in by_parent.items()} == {
            "Chat": ["a", "b", "c"],
            "Other": ["x"],
        }
        assert len(told) >= 2  # a slice of 2 topics at most: told per slice
    finally:
        lite.close()
        store.close()
