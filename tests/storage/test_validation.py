"""Bad input raises a clear error and leaves the files exactly as they were."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from storage import InvalidConfigError, InvalidMessageError, Message, MessageStore, StoreConfig


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "checkpoint"
    }


BAD = [
    (Message("../x", b"a"), "topic"),
    (Message("a/b", b"a"), "topic"),
    (Message("", b"a"), "topic"),
    (Message("x" * 128, b"a"), "topic"),
    (Message("T", b""), "empty"),
    (Message("T", b"a" * (16 * 1024 + 1)), "max_message_size"),
    (Message("T", b"a", properties={"bad\x01name": "v"}), "separator"),
    (Message("T", b"a", properties={"name": "bad\x02value"}), "separator"),
    (Message("T", b"a", tags="A\x01"), "separator"),
    (Message("T", b"a", keys=["has space"]), "key"),
    (Message("T", b"a", queue_id=-1), "queue_id"),
    (Message("T", "not bytes"), "bytes"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("bad,match", BAD, ids=[m for _, m in BAD])
def test_bad_message_changes_nothing(tmp_path: Path, make_config, bad: Message, match: str) -> None:
    cfg = make_config(tmp_path / "s")
    with MessageStore(cfg, start_services=False) as store:
        store.put_batch([Message("T", b"ok", keys=["k"])])
        before = snapshot(store.root)
        with pytest.raises(InvalidMessageError, match=match):
            store.put_batch([Message("T", b"fine"), bad])
        assert snapshot(store.root) == before
        assert store.max_offset("T", 0) == 1


def test_bad_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match="flush_disk_type"):
        StoreConfig(str(tmp_path), flush_disk_type="SOMETIMES")
    with pytest.raises(InvalidConfigError, match="max_message_size"):
        StoreConfig(str(tmp_path), commitlog_file_size=8192, max_message_size=8192)
    with pytest.raises(InvalidConfigError, match="store_host"):
        StoreConfig(str(tmp_path), store_host="localhost")


@pytest.mark.parametrize("topic", ["SCHEDULE_TOPIC_XXXX", "RMQ_SYS_QUARANTINE"])
def test_reserved_topic_is_refused(tmp_path: Path, make_config, topic: str) -> None:
    with (
        MessageStore(make_config(tmp_path / "s"), start_services=False) as store,
        pytest.raises(InvalidMessageError, match="reserved"),
    ):
        store.put(Message(topic, b"x"))


def test_corrupt_file_names_give_a_clear_error(tmp_path: Path, make_config) -> None:
    cfg = make_config(tmp_path / "s")
    with MessageStore(cfg) as store:
        store.put(Message("T", b"x"))
    (tmp_path / "s" / "commitlog" / "not-a-number").write_bytes(b"")
    from storage import StoreCorruptedError

    with pytest.raises(StoreCorruptedError, match="20-digit"):
        MessageStore(cfg)
    (tmp_path / "s" / "commitlog" / "not-a-number").unlink()
    with MessageStore(cfg) as store:
        assert store.max_offset("T", 0) == 1
