"""Consumer offsets between two saves: the journal beside ``consumerOffset.json`` keeps
every commit through a SIGKILL of the process that made it, a save compacts it, and a
torn last line (a crash mid-write) is dropped, not the table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from actors.broker.offset import consumer_offset_manager
from actors.broker.offset.consumer_offset_manager import ConsumerOffsetManager
from storage.config_files import JsonConfigFile

MODULE = consumer_offset_manager.__file__


def test_commits_since_the_last_save_outlive_a_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    child = textwrap.dedent(
        f"""
        import importlib.util, os, signal
        from pathlib import Path
        from storage.config_files import JsonConfigFile
        # the module alone, not the actors package (Ray): a fast child
        spec = importlib.util.spec_from_file_location("com", {MODULE!r})
        com = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(com)
        offsets = com.ConsumerOffsetManager(JsonConfigFile(Path({str(path)!r})))
        offsets.commit("g", "T", 0, 10)
        offsets.persist()  # saved: 10
        offsets.commit("g", "T", 0, 20)  # after the save: in the journal only
        offsets.commit("g", "T", 1, 5)
        offsets.remove_topic("Gone")
        offsets.mark_markers(3)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", child], check=False)
    assert proc.returncode == -signal.SIGKILL
    assert json.loads(path.read_text())["offsetTable"] == {"T@g": {"0": 10}}
    again = ConsumerOffsetManager(JsonConfigFile(path))
    assert again.query_topic("g", "T") == {0: 20, 1: 5}
    assert again.txn_markers == 3
    # the replayed changes are saved, and the journal starts again empty
    assert again.persist()
    assert json.loads(path.read_text())["offsetTable"] == {"T@g": {"0": 20, "1": 5}}
    assert path.with_suffix(".journal").stat().st_size == 0
    assert not path.with_suffix(".journal.old").exists()


def test_a_save_compacts_the_journal_and_sync_needs_no_save(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    offsets = ConsumerOffsetManager(JsonConfigFile(path))
    for i in range(100):
        offsets.commit("g", "T", i % 4, i)
    offsets.sync()
    offsets.sync()  # nothing new: no fsync
    journal = path.with_suffix(".journal")
    assert len(journal.read_bytes().splitlines()) == 100
    assert offsets.persist()
    assert journal.stat().st_size == 0
    offsets.commit("g", "T", 0, 1000)
    offsets.remove_topic("T")
    offsets.commit("g", "U", 0, 1)
    again = ConsumerOffsetManager(JsonConfigFile(path))
    assert again.query_topic("g", "T") == {}
    assert again.query("g", "U", 0) == 1


def test_a_torn_last_line_is_dropped_and_the_rest_kept(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    offsets = ConsumerOffsetManager(JsonConfigFile(path))
    offsets.commit("g", "T", 0, 7)
    offsets.commit("g", "T", 1, 8)
    with open(path.with_suffix(".journal"), "ab") as fh:
        fh.write(b'["c","T","g",2,')  # a crash mid-write
        os.fsync(fh.fileno())
    again = ConsumerOffsetManager(JsonConfigFile(path))
    assert again.query_topic("g", "T") == {0: 7, 1: 8}
