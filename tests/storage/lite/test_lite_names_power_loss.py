"""A power loss that cuts the unfsynced tail of the lite store's ``names`` file (real
store on a temp dir, SYNC_FLUSH, no Ray).

A power loss keeps of each file what reached the disk, each file on its own: ``names``
(written with ``os.write``, fsynced only by a flush) back to its last flush or torn
mid-record, while the index entries of the lite topics bound in its lost tail (mmap'd
pages the kernel may have written back) survive, or not; the CommitLog keeps every
acknowledged record (SYNC_FLUSH). The checkpoint is the last flush's: it is written
after ``names`` and the index are fsynced, so it never points past them.

The simulation: the lite directory is copied aside at the "power loss" (what the page
cache holds), the stores closed (the CommitLog whole, as SYNC_FLUSH made it), the copy
put back and its files cut as the power loss would. After the reopen every
acknowledged lite message reads under its own lite topic at its lite offset, in order;
a send continues from the right offset; the counts hold; a second reopen agrees."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from store_sizes import small_config

from storage import Message, MessageStore
from storage.lite import LiteConfig, LiteStore, LiteTopicQuotaExceededError
from storage.lite.index import ENTRY

QUOTA = 12
PER_FILE = 16  # index entries a file: the lost tail spans files


def open_lite(path: Path) -> tuple[MessageStore, LiteStore]:
    store = MessageStore(small_config(path, flush_disk_type="SYNC_FLUSH"))
    lite = LiteStore(store, LiteConfig(index_file_entries=PER_FILE))
    lite.declare_parent("Chat", quota=QUOTA, ttl_ms=3_600_000)
    return store, lite


class Sent:
    """What the store acknowledged: per lite topic, its bodies by lite offset."""

    def __init__(self, lite: LiteStore) -> None:
        self.lite = lite
        self.bodies: dict[str, list[bytes]] = {}
        self.n = 0

    def send(self, *names: str) -> None:
        """One put of a message to each name (a batch when several)."""
        items = []
        for name in names:
            self.n += 1
            items.append((name, Message("Chat", f"{name}/{self.n}".encode())))
        result = self.lite.put_batch("Chat", items)
        assert result.flushed
        for (name, m), off in zip(items, result.lite_offsets.tolist()):
            got = self.bodies.setdefault(name, [])
            assert off == len(got)  # the run itself: offsets as they were acknowledged
            got.append(m.body)


def crash(
    path: Path, names_cut: str, index_cut: str, recreate: bool
) -> tuple[dict[str, list[bytes]], set[str]]:
    """Write, flush, write more, lose power with ``names`` cut back to the flush
    (``flush``: at its record boundary; ``torn``: mid-record; ``zeros``: its tail read
    back as zeros; ``delete``: right after the delete's record) and the index kept whole or cut back (``kept``, ``flush``,
    ``midway``); ``recreate``: a topic deleted and created again after the flush. The
    messages acknowledged, and the names that may exist without one (subscriptions)."""
    store, lite = open_lite(path)
    sent = Sent(lite)
    for _ in range(3):
        sent.send("a")
        sent.send("b")
    sent.send("x", "x", "a")
    lite.flush()
    names = lite.root / "names"
    names_at_flush = names.stat().st_size
    index_at_flush = lite.index.end
    # after the flush: new topics (one by a subscription, no message), batches, and
    # the old topics written on
    sent.send("c")
    sent.send("a", "c", "b")
    assert lite.create("Chat", "e")
    sent.send("d", "d", "c")
    names_at_delete = 0
    if recreate:
        sent.send("x")
        assert lite.delete("Chat", "x")
        names_at_delete = names.stat().st_size
        sent.bodies["x"] = []
        sent.send("x", "f")
        sent.send("x")
    for _ in range(4):
        sent.send("f", "a", "d")
    sent.send("b")
    index_at_crash = lite.index.end
    assert names.stat().st_size > names_at_flush + 30
    aside = path.parent / "aside"
    shutil.copytree(lite.root, aside)  # the page cache at the power loss
    lite.close()
    store.close()
    shutil.rmtree(path / "lite")
    shutil.move(aside, path / "lite")
    names_at_crash = names.stat().st_size
    if names_cut == "flush":
        os.truncate(names, names_at_flush)
    elif names_cut == "delete":
        os.truncate(names, names_at_delete)
    elif names_cut == "torn":
        os.truncate(names, names_at_flush + 9)  # inside the next record's head
    else:
        os.truncate(names, names_at_flush)
        os.truncate(names, names_at_crash)  # the file's length kept, its tail zeros
    if index_cut != "kept":
        cut = index_at_flush if index_cut == "flush" else (index_at_flush + index_at_crash) // 2
        for f in sorted((path / "lite" / "index").iterdir()):
            start = int(f.name)
            if start > 0 and start >= cut:
                f.unlink()  # a file made after the flush: its directory entry lost
            elif start + PER_FILE > cut:
                with open(f, "r+b") as out:
                    out.seek((cut - start) * ENTRY.itemsize)
                    out.write(bytes((start + PER_FILE - cut) * ENTRY.itemsize))
    return sent.bodies, {"e"}


def check(lite: LiteStore, acked: dict[str, list[bytes]], maybe: set[str]) -> None:
    """Every acknowledged message under its own name at its offset, in order, and
    nothing else there; the counts agree with the names."""
    for name, bodies in acked.items():
        got = lite.get("Chat", name, 0, 1000)
        assert [m.body for m in got.messages] == bodies, name
        assert lite.max_offset("Chat", name) == len(bodies), name
    live = set(lite.lite_topics("Chat"))
    assert set(acked) <= live <= set(acked) | maybe
    assert lite.count("Chat") == len(live)
    assert lite.parent_settings("Chat")["lite_topics"] == len(live)


CASES = [
    pytest.param(names_cut, index_cut, recreate, id=f"names-{names_cut}-index-{index_cut}{tag}")
    for recreate, tag in ((False, ""), (True, "-recreated"))
    for names_cut in ("flush", "torn", "zeros", "delete")
    for index_cut in ("kept", "flush", "midway")
    # ``delete`` is a cut after a delete's record: only with one; a topic created after
    # a delete fsyncs ``names`` first, so a power loss that takes the index entries
    # after the flush keeps the delete of a topic created again
    if (names_cut == "delete") == recreate or (recreate and index_cut == "kept")
]


@pytest.mark.parametrize(("names_cut", "index_cut", "recreate"), CASES)
def test_a_power_loss_cutting_names_keeps_every_acknowledged_lite_message(
    tmp_path: Path, names_cut: str, index_cut: str, recreate: bool
) -> None:
    path = tmp_path / "s"
    acked, maybe = crash(path, names_cut, index_cut, recreate)
    store, lite = open_lite(path)
    try:
        check(lite, acked, maybe)
        # sends after the reopen continue each topic's offsets, and a new topic's
        sent = Sent(lite)
        sent.bodies = {name: list(bodies) for name, bodies in acked.items()}
        for name in sorted(acked):
            sent.send(name)
        sent.send("n", "a")
        check(lite, sent.bodies, maybe)
        # the quota counts what is there
        made = 0
        with pytest.raises(LiteTopicQuotaExceededError):
            while True:
                lite.create("Chat", f"q{made}")
                made += 1
        assert lite.count("Chat") == QUOTA
        live = set(lite.lite_topics("Chat"))
        assert len(live) == QUOTA
    finally:
        lite.close()
        store.close()
    store, lite = open_lite(path)  # a second reopen: the same answer
    try:
        check(lite, sent.bodies, live - set(sent.bodies))
        assert set(lite.lite_topics("Chat")) == live
        assert lite.count("Chat") == QUOTA
    finally:
        lite.close()
        store.close()


@pytest.mark.parametrize("how", ["delete", "expire"])
def test_a_topic_created_after_a_delete_is_acknowledged_only_once_the_delete_is_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The states the cases above leave out cannot happen: a creation after a delete (or an
    expiry) not yet fsynced fsyncs ``names`` first; a creation with none pending does
    not. ``put_waits`` says when a put would pay that fsync (or wait for the lock)."""
    store, lite = open_lite(tmp_path / "s")
    try:
        names = lite.root / "names"
        inode = names.stat().st_ino
        synced: list[int] = []  # the size of ``names`` at each of its fsyncs
        fsync = os.fsync

        def spy(fd: int) -> None:
            st = os.fstat(fd)
            if st.st_ino == inode:
                synced.append(st.st_size)
            fsync(fd)

        monkeypatch.setattr(os, "fsync", spy)
        lite.put("Chat", "x", Message("Chat", b"old"))
        lite.put("Chat", "y", Message("Chat", b"y"))
        assert synced == []  # creations with no delete pending: no fsync of names
        assert not lite.put_waits()  # a writer on an event loop may put there
        if how == "delete":
            assert lite.delete("Chat", "x")
        else:
            lite.put("Chat", "y", Message("Chat", b"y2"))
            assert lite.expire(now_ms=store.now_ms() + 3_600_001) == 2
        size_after_delete = names.stat().st_size
        assert lite.put_waits()  # the next creation fsyncs: not on an event loop
        assert lite.put("Chat", "x", Message("Chat", b"new")).lite_offsets.tolist() == [0]
        assert synced and synced[-1] >= size_after_delete
        assert not lite.put_waits()
        synced.clear()
        lite.put("Chat", "z", Message("Chat", b"z"))
        assert synced == []  # the delete is on disk: the next creation pays nothing
    finally:
        lite.close()
        store.close()
