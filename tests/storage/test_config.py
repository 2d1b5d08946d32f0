"""A RocketMQ broker.conf: every key RayMQ reads is read, every other one is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import StoreConfig
from storage.config import _CONF_KEYS, parse_broker_conf


def write(tmp_path: Path, text: str) -> Path:
    conf = tmp_path / "broker.conf"
    conf.write_text(text)
    return conf


def test_keys_raymq_does_not_read_are_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conf = write(
        tmp_path,
        "brokerName=broker-a\n"  # the broker's, not the store's: named too
        "namesrvAddr=10.0.0.1:9876\n"
        f"storePathCommitLog={tmp_path}/elsewhere\n"
        "flushDiskTyp=SYNC_FLUSH\n"  # a typo
        f"storePathRootDir={tmp_path / 'st'}\n",
    )
    with caplog.at_level("WARNING", logger="raymq.storage.config"):
        cfg = StoreConfig.from_broker_conf(conf)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 4, warned
    assert f"{conf}:1: brokerName is not a store setting: ignored" in warned[0]
    assert (
        "namesrvAddr is not read by RayMQ (brokers find their NameServers through Ray)"
        in (warned[1])
    )
    assert f"{conf}:3: storePathCommitLog is not read by RayMQ" in warned[2]
    assert (
        "flushDiskTyp is not a store setting: ignored (did you mean flushDiskType?)" in (warned[3])
    )
    assert cfg.flush_disk_type == "ASYNC_FLUSH"  # the typo set nothing


def test_the_old_spelling_maped_is_read_as_mapped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conf = write(
        tmp_path,
        f"storePathRootDir={tmp_path}\nmapedFileSizeCommitLog=1048576\n"
        "mapedFileSizeConsumeQueue=6000\nmaxMessageSize=65536\n",
    )
    with caplog.at_level("WARNING", logger="raymq.storage.config"):
        cfg = StoreConfig.from_broker_conf(conf)
    assert cfg.commitlog_file_size == 1 << 20 and cfg.consume_queue_file_entries == 300
    assert "mapedFileSizeCommitLog is the old spelling of mappedFileSizeCommitLog" in caplog.text
    # the broker's loader reads the file through parse_broker_conf and _CONF_KEYS too
    parsed = parse_broker_conf(conf)
    assert parsed["mappedFileSizeCommitLog"] == "1048576"
    assert set(parsed) <= _CONF_KEYS.keys()
