"""A group's lite offsets on a real store in a temp dir: every commit made before a
flush is on disk when the flush returns, the second and later ones too (each flush
saves the commits since the one before), so it survives a SIGKILL right after; and a
clean close keeps the last commit."""

from __future__ import annotations

import textwrap
from pathlib import Path

from killed_child import STORAGE_TESTS, run_until_killed
from store_sizes import small_config

from storage import Message, MessageStore
from storage.lite import LiteConfig, LiteStore

CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    sys.path.insert(0, sys.argv[2])
    from store_sizes import small_config

    from storage import Message, MessageStore
    from storage.lite import LiteConfig, LiteStore

    store = MessageStore(small_config(Path(sys.argv[1])))
    lite = LiteStore(store, LiteConfig())  # no upkeep thread: only the flushes below
    lite.declare_parent("Chat", quota=10, ttl_ms=3_600_000)
    for i in range(5):
        lite.put("Chat", "a", Message("Chat", b"%d" % i))
    store.flush()
    for offset in (1, 3):  # nothing written between the two flushes but the commit
        lite.commit_offset("g", "Chat", "a", offset)
        lite.flush()
    print("flushed", flush=True)
    sys.stdin.read()  # until the parent kills it
    """
)


def open_lite(path: Path) -> tuple[MessageStore, LiteStore]:
    store = MessageStore(small_config(path), start_services=False)
    lite = LiteStore(store, LiteConfig())
    lite.declare_parent("Chat", quota=10, ttl_ms=3_600_000)
    return store, lite


def test_a_commit_flushed_after_an_earlier_flushed_commit_survives_a_sigkill(
    tmp_path: Path,
) -> None:
    run_until_killed(CHILD, str(tmp_path / "s"), STORAGE_TESTS, ready="flushed")
    store, lite = open_lite(tmp_path / "s")
    try:
        assert lite.committed_offset("g", "Chat", "a") == 3  # not 1: no redelivery
    finally:
        lite.close()
        store.close()


def test_a_clean_close_keeps_a_commit_made_after_the_last_flush(tmp_path: Path) -> None:
    store, lite = open_lite(tmp_path / "s")
    for i in range(4):
        lite.put("Chat", "a", Message("Chat", b"%d" % i))
    lite.commit_offset("g", "Chat", "a", 2)
    lite.flush()
    lite.commit_offset("g", "Chat", "a", 4)
    lite.close()
    store.close()
    store, lite = open_lite(tmp_path / "s")
    try:
        assert lite.committed_offset("g", "Chat", "a") == 4
        assert [m.body for m in lite.get("Chat", "a", 4).messages] == []
    finally:
        lite.close()
        store.close()
