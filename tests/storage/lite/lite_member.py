"""A Raft member's lite store in a child process the test SIGKILLs (real store on a temp
dir, no Ray), and the same store opened again: the lite state replay tests' tools."""

from __future__ import annotations

import textwrap
from pathlib import Path

from killed_child import STORAGE_TESTS, run_until_killed
from store_sizes import small_config

from storage import MessageStore
from storage.lite import LiteConfig, LiteStore

MEMBER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    sys.path.insert(0, sys.argv[2])
    from store_sizes import small_config

    from storage import Message, MessageStore
    from storage.lite import LiteConfig, LiteStore, encode_state

    store = MessageStore(small_config(Path(sys.argv[1])))
    # every record committed once written (the member's log as its group committed it)
    lite = LiteStore(store, LiteConfig(), committed=lambda: store.commitlog.max_offset)
    lite.declare_parent("Chat", quota=10, ttl_ms=3_600_000)
    size = store.config.max_message_size

    def send(lite_topic, *bodies):
        proposal = lite.prepare("Chat", [(lite_topic, Message("Chat", b)) for b in bodies])
        lite.settle(proposal, store.put_encoded(proposal.batch).commitlog_offsets)

    def change(**op):
        store._put_encoded(encode_state(op, size))  # the leader's proposal, committed
        lite.catch_up()

    def commit(lite_topic, offset):
        change(op="commit", group="g", parent="Chat", lite=lite_topic, offset=offset)

    exec(sys.argv[3])
    store.flush()  # the log holds every record (a Raft member's answer waits for it)
    print("done", flush=True)
    sys.stdin.read()  # until the parent kills it
    """
)


def run_member(path: Path, steps: str) -> None:
    """Run ``steps`` in a member's process on the store at ``path``, then SIGKILL it
    (its lite store not flushed since the steps' last ``lite.flush()``)."""
    run_until_killed(MEMBER, str(path), STORAGE_TESTS, textwrap.dedent(steps), ready="done")


def open_member(path: Path) -> tuple[MessageStore, LiteStore]:
    store = MessageStore(small_config(path), start_services=False)
    lite = LiteStore(store, LiteConfig(), committed=lambda: store.commitlog.max_offset)
    lite.declare_parent("Chat", quota=10, ttl_ms=3_600_000)
    return store, lite


def bodies(lite: LiteStore, lite_topic: str) -> list[bytes]:
    return [m.body for m in lite.get("Chat", lite_topic, 0, 100).messages]
