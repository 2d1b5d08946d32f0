"""A Raft member's lite store killed after its last flush (real store on a temp dir,
a child process SIGKILLed, no Ray): the consumer state records it applied since are
applied again at open, although its index (kept whole by the page cache) covers lite
records past them; and applied again, a record changes only the lite topic it meant,
not a later topic of the same name that a send or a subscription created after it."""

from __future__ import annotations

from pathlib import Path

from lite_member import bodies, open_member, run_member
from store_sizes import small_config

from storage import Message, MessageStore
from storage.lite.names import OLD_BIND, OLD_DELETE, PARENT, REC


def test_commits_applied_after_the_last_flush_survive_a_kill(tmp_path: Path) -> None:
    run_member(
        tmp_path / "s",
        """
        send("a", b"a0", b"a1", b"a2", b"a3", b"a4", b"a5")
        commit("a", 2)
        lite.flush()
        commit("a", 4)  # applied, not saved: only the log holds it
        change(op="subscribe", group="g", parent="Chat", client="c1", names=["b"], action="add")
        commit("b", 0)
        send("z", b"z0")  # the index now covers records past the commits
        """,
    )
    store, lite = open_member(tmp_path / "s")
    try:
        assert lite.committed_offset("g", "Chat", "a") == 4  # not 2: nothing delivered again
        assert lite.committed_offset("g", "Chat", "b") == 0
        assert sorted(lite.lite_topics("Chat")) == ["a", "b", "z"]
        assert bodies(lite, "a") == [b"a%d" % i for i in range(6)]
        # the checkpoint now holds them: a second open after a clean close agrees
        lite.commit_offset("g", "Chat", "a", 5)
    finally:
        lite.close()
        store.close()
    store, lite = open_member(tmp_path / "s")
    try:
        assert lite.committed_offset("g", "Chat", "a") == 5
    finally:
        lite.close()
        store.close()


def test_a_delete_and_a_new_topic_of_the_same_name_after_the_flush_keep_the_new_one(
    tmp_path: Path,
) -> None:
    run_member(
        tmp_path / "s",
        """
        send("a", b"old0", b"old1", b"old2", b"old3")
        send("b", b"b0", b"b1")
        commit("a", 1)
        lite.flush()
        commit("a", 3)  # the old topic's, then it goes
        change(op="delete", parent="Chat", lite="a")
        send("a", b"new0", b"new1")  # a new topic of the name, from offset 0
        commit("a", 1)  # the new topic's
        change(op="delete", parent="Chat", lite="b")
        # a subscription creates b again; a commit in it
        change(op="subscribe", group="g", parent="Chat", client="c1", names=["b"], action="add")
        commit("b", 0)
        send("z", b"z0")  # the index now covers records past all of it
        """,
    )
    store, lite = open_member(tmp_path / "s")
    try:
        assert bodies(lite, "a") == [b"new0", b"new1"]  # the new topic, not deleted again
        assert lite.max_offset("Chat", "a") == 2
        assert lite.committed_offset("g", "Chat", "a") == 1  # its own, not the old topic's 3
        assert lite.exists("Chat", "b") and lite.max_offset("Chat", "b") == 0
        assert lite.committed_offset("g", "Chat", "b") == 0
        assert sorted(lite.lite_topics("Chat")) == ["a", "b", "z"]
        assert lite.count("Chat") == 3
    finally:
        lite.close()
        store.close()


def test_a_subscription_replayed_does_not_create_again_a_topic_expired_after_it(
    tmp_path: Path,
) -> None:
    run_member(
        tmp_path / "s",
        """
        send("a", b"a0")
        lite.flush()
        change(op="subscribe", group="g", parent="Chat", client="c1", names=["b"], action="add")
        assert lite.expire(now_ms=store.now_ms() + 7_200_000) == 2  # a and b, TTL passed
        send("z", b"z0")
        """,
    )
    store, lite = open_member(tmp_path / "s")
    try:
        assert lite.lite_topics("Chat") == ["z"]  # b stays expired, a too
    finally:
        lite.close()
        store.close()


def test_a_names_file_written_before_positions_were_kept_opens(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = MessageStore(small_config(root), start_services=False)
    store.close()
    lite_dir = root / "lite"
    lite_dir.mkdir()

    def rec(kind: int, lid: int, gen: int, pid: int, name: str = "") -> bytes:
        return REC.pack(kind, lid, gen, pid, len(name)) + name.encode()

    (lite_dir / "names").write_bytes(
        rec(PARENT, 0, 0, 0, "Chat")
        + rec(OLD_BIND, 0, 0, 0, "a")
        + rec(OLD_BIND, 1, 0, 0, "b")
        + rec(OLD_DELETE, 1, 0, 0)
    )
    (lite_dir / "checkpoint").write_text('{"covered": 0}')
    store, lite = open_member(root)
    try:
        assert lite.lite_topics("Chat") == ["a"]
        lite.put("Chat", "a", Message("Chat", b"x"))
        lite.put("Chat", "b", Message("Chat", b"y"))  # id 1 again, a generation on
        lite.commit_offset("g", "Chat", "b", 1)
    finally:
        lite.close()
        store.close()
    store, lite = open_member(root)
    try:
        assert (bodies(lite, "a"), bodies(lite, "b")) == ([b"x"], [b"y"])
        assert lite.committed_offset("g", "Chat", "b") == 1
    finally:
        lite.close()
        store.close()
