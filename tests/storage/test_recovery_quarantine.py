"""A damaged record costs recovery that record only, never the good ones after it.

RocketMQ's recovery ends the CommitLog at the first record that fails its
checks. Here, where a valid record follows the damage, the damaged bytes are
copied to ``quarantine/`` (and logged), replaced in place by a filler record no
queue ever serves, and their queue entries become holes; only a damaged tail
with nothing valid after it (a crash's torn last write) is cut.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from storage import GetStatus, MessageStore, StoreConfig, codec
from storage.quarantine import QUARANTINE_TOPIC

# a producer stores 20 good messages, one whose body no longer matches its CRC (a bit
# flipped in memory, or a batch an older broker took unchecked: it goes in as trusted),
# then 50 good ones, and dies without a clean stop
CHILD = textwrap.dedent(
    """
    import dataclasses, json, os, signal, sys
    from storage import Message, MessageStore, StoreConfig, codec
    store = MessageStore(StoreConfig(**json.loads(sys.argv[1])), start_services=False)
    rows = []
    def put(batch, label):
        for r in store.put_encoded(batch).results():
            rows.append([label, r.msg_id, r.commitlog_offset, r.queue_id, r.queue_offset])
    for i in range(20):
        put(codec.encode_batch([Message("Q", b"a%d" % i, keys=["a%d" % i], queue_id=i % 2)]), "good")
    bad = codec.encode_batch([Message("Q", b"bad", keys=["bad"], queue_id=0)])
    flipped = bytearray(bad.data)
    flipped[codec.HEADER.size] ^= 0x01
    put(dataclasses.replace(bad, data=bytes(flipped)), "bad")
    put(codec.encode_batch(
        [Message("Q", b"b%d" % i, keys=["b%d" % i], queue_id=i % 2) for i in range(50)]), "good")
    print(json.dumps(rows), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def crash_after_a_bad_record(cfg: StoreConfig) -> list[list]:
    args = json.dumps(dataclasses.asdict(cfg))
    out = subprocess.run([sys.executable, "-c", CHILD, args], capture_output=True, text=True)
    assert out.returncode == -signal.SIGKILL, out.stderr
    return json.loads(out.stdout)


def queue_bodies(store: MessageStore, topic: str, qid: int) -> dict[int, bytes]:
    out, offset = {}, 0
    while offset < store.max_offset(topic, qid):
        got = store.get("g", topic, qid, offset, 7)
        out.update({m.queue_offset: m.body for m in got.messages})
        offset = got.next_offset
    return out


@pytest.mark.parametrize("lost", ["nothing", "consume queues", "consume queues and index"])
def test_the_good_records_after_a_bad_one_survive_a_crash(
    tmp_path: Path, make_config, caplog: pytest.LogCaptureFixture, lost: str
) -> None:
    cfg = make_config(tmp_path / "s")
    rows = crash_after_a_bad_record(cfg)
    assert (tmp_path / "s" / "abort").exists()
    if lost != "nothing":  # the crash took the queues too: they are rebuilt, with a hole
        shutil.rmtree(tmp_path / "s" / "consumequeue")
    if lost.endswith("index"):
        shutil.rmtree(tmp_path / "s" / "index")
    [bad] = [row for row in rows if row[0] == "bad"]
    good = [row for row in rows if row[0] == "good"]
    with caplog.at_level("ERROR", logger="raymq.storage"), MessageStore(cfg) as store:
        for _label, msg_id, phys, qid, qoff in good:
            assert store.message_at(phys).msg_id == msg_id
            [m] = store.get("g", "Q", qid, qoff, 1).messages
            assert (m.msg_id, m.queue_offset) == (msg_id, qoff)
            assert [x.msg_id for x in store.query_by_key("Q", m.keys[0])] == [msg_id]
        bodies = queue_bodies(store, "Q", 0)
        assert len(bodies) == 35 and bad[4] not in bodies and b"bad" not in bodies.values()
        assert len(queue_bodies(store, "Q", 1)) == 35
        assert store.max_offset("Q", 0) == 36  # the bad record's offset stays taken
        hole = store.get("g", "Q", 0, bad[4], 1)
        assert hole.status is GetStatus.NO_MATCHED_MESSAGE and hole.next_offset == bad[4] + 1
        assert store.query_by_key("Q", "bad") == []
        assert QUARANTINE_TOPIC not in store.topics()
        end = store.commitlog.max_offset
    assert "are damaged (BODYCRC=" in caplog.text
    saved = tmp_path / "s" / "quarantine" / f"{bad[2]:020d}.damaged"
    assert b"bad" in saved.read_bytes()
    with MessageStore(cfg) as store:  # set aside once: the next start finds nothing to do
        assert store.commitlog.max_offset == end and store.max_offset("Q", 0) == 36
        assert len(queue_bodies(store, "Q", 0)) == 35


def test_damage_at_the_end_of_a_file_keeps_the_next_file(tmp_path: Path, make_config) -> None:
    cfg = make_config(tmp_path / "s")
    with MessageStore(cfg, start_services=False) as store:
        results = []
        while len(store.commitlog.files.files) < 3:
            results += store.put_batch([codec.Message("E", os.urandom(300), queue_id=0)])
        first_file = [r for r in results if r.commitlog_offset < cfg.commitlog_file_size]
        victim = first_file[-1]  # the last record of the first file
    (tmp_path / "s" / "abort").touch()  # as if it had crashed
    path = tmp_path / "s" / "commitlog" / f"{0:020d}"
    raw = bytearray(path.read_bytes())
    raw[victim.commitlog_offset + codec.OFF_MAGIC] ^= 0xFF  # its header, this time
    path.write_bytes(bytes(raw))
    (tmp_path / "s" / "checkpoint").unlink()  # scan from the start
    with MessageStore(cfg) as store:
        assert set(queue_bodies(store, "E", 0)) == set(range(len(results))) - {victim.queue_offset}
        last = store.message_at(results[-1].commitlog_offset)
        assert store.commitlog.max_offset == last.commitlog_offset + last.store_size
    assert (tmp_path / "s" / "quarantine" / f"{victim.commitlog_offset:020d}.damaged").exists()


def test_a_slave_steps_over_what_its_master_set_aside(tmp_path: Path, make_config) -> None:
    cfg = make_config(tmp_path / "m")
    crash_after_a_bad_record(cfg)
    with (
        MessageStore(cfg) as master,
        MessageStore(make_config(tmp_path / "s", store_host="10.0.0.2:10911")) as slave,
    ):
        while data := master.read_commitlog(slave.commitlog.max_offset, 1000):
            slave.append_commitlog(slave.commitlog.max_offset, data)
        for qid in (0, 1):
            assert slave.max_offset("Q", qid) == master.max_offset("Q", qid)
            assert queue_bodies(slave, "Q", qid) == queue_bodies(master, "Q", qid)
        assert QUARANTINE_TOPIC not in slave.topics()
