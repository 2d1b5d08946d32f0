"""The transaction coordinator's log (``storage.txn_log``) on a real directory: what was
appended is what a reopened log knows; a torn last line is dropped, a damaged middle
one refused; compaction keeps epochs, undecided and undone transactions; and the
store's transactional fences refuse an older epoch's half messages before writing."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import Message, MessageStore, transaction
from storage.errors import ProducerFencedError, StoreCorruptedError
from storage.txn_log import ABORT, COMMIT, OPEN, TransactionLog


def test_a_reopened_log_knows_epochs_participants_and_decisions(tmp_path: Path) -> None:
    log = TransactionLog(tmp_path)
    log.set_epoch("tid", "pid-1", 0)
    log.set_epoch("tid", "pid-1", 1)
    t1 = log.begin(("t1", "tid", 1), {"broker-a"})
    log.begin(("t1", "tid", 1), {"broker-b"})
    log.decide(
        t1, True, {"broker-a": [10, 20], "broker-b": None}, {"broker-b": {"g": [("In", 0, 7)]}}
    )
    t2 = log.begin(("t2", "tid", 1), {"broker-a"})
    log.decide(t2, False)
    log.done(t2)
    log.begin(("t3", "tid", 1), {"broker-a"})
    log.close()

    again = TransactionLog(tmp_path)
    assert again.producers["tid"].epoch == 1 and again.producers["tid"].producer_id == "pid-1"
    r1, r2, r3 = again.txns["t1"], again.txns["t2"], again.txns["t3"]
    assert (r1.state, r1.done, r1.participants()) == (COMMIT, False, {"broker-a", "broker-b"})
    assert r1.halves == {"broker-a": [10, 20], "broker-b": None}
    assert r1.offsets == {"broker-b": {"g": [("In", 0, 7)]}}
    assert (r2.state, r2.done) == (ABORT, True)
    assert r3.state == OPEN


def test_a_torn_last_line_is_dropped_and_a_damaged_one_refused(tmp_path: Path) -> None:
    log = TransactionLog(tmp_path)
    log.set_epoch("tid", "p", 0)
    t = log.begin(("t1", "tid", 0), {"b"})
    log.decide(t, True)
    log.close()
    path = tmp_path / TransactionLog.FILE
    good = path.read_bytes()
    path.write_bytes(good + b'{"op":"done","tx')  # a crash in the middle of a write
    again = TransactionLog(tmp_path)
    assert again.txns["t1"].state == COMMIT and not again.txns["t1"].done
    again.close()
    assert path.read_bytes() == good  # truncated to the last whole record
    path.write_bytes(good.replace(b'"op":"begin"', b'"op":"bgn"'))
    with pytest.raises(StoreCorruptedError, match="record 2"):
        TransactionLog(tmp_path)


def test_compaction_keeps_what_is_still_needed(tmp_path: Path) -> None:
    now = [1000.0]
    log = TransactionLog(tmp_path, clock=lambda: now[0])
    log.set_epoch("tid", "p", 3)
    old = log.begin(("old", "tid", 3), {"b"})
    log.decide(old, True, {"b": [1]})
    log.done(old)
    undone = log.begin(("undone", "tid", 3), {"b"})
    log.decide(undone, True, {"b": [2]}, {"b": {"g": [("T", 1, 5)]}})
    log.begin(("open", "tid", 3), {"b"})
    now[0] += 100
    assert log.compact(keep_done_ms=50_000) == 1
    assert log.records == 4  # the epoch, undone begin + decide, open begin: nothing of old
    log.close()
    again = TransactionLog(tmp_path)
    assert set(again.txns) == {"undone", "open"}
    assert again.txns["undone"].offsets == {"b": {"g": [("T", 1, 5)]}}
    assert again.producers["tid"].epoch == 3


def test_a_compaction_that_keeps_much_is_due_again_only_once_the_log_grew_as_much(
    tmp_path: Path,
) -> None:
    """Done transactions younger than ``keep_done_ms`` stay, three lines each. With more
    kept than ``every`` lines, the log was due again right after its compaction (the
    coordinator then rewrote and fsynced it all, under its lock, every round); now the
    next one is due only once as many records were appended as it kept."""
    log = TransactionLog(tmp_path)
    log.set_epoch("tid", "p", 0)

    def done_txn(i: int) -> None:
        t = log.begin((f"t{i}", "tid", 0), {"b"})
        log.decide(t, True, {"b": [i]})
        log.done(t)

    for i in range(40):
        done_txn(i)
    assert log.records == 121 and log.compaction_due(every=100)
    assert log.compact(keep_done_ms=3_600_000) == 0  # all kept: done just now
    assert log.records == log.compacted == 121
    assert not log.compaction_due(every=100)
    for i in range(40, 80):  # 120 records more: fewer than the 121 kept
        done_txn(i)
    assert not log.compaction_due(every=100)
    log.set_epoch("tid", "p", 1)
    assert log.compaction_due(every=100)
    log.close()


def test_the_decided_transactions_not_done_are_known_in_order_across_a_restart(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    log = TransactionLog(tmp_path, clock=lambda: now[0])
    log.set_epoch("tid", "p", 0)
    a, b, c = (log.begin((x, "tid", 0), {"b"}) for x in "abc")
    log.decide(c, True, {"b": [3]})
    log.decide(a, False)
    assert list(log.undone) == ["c", "a"]  # b is open: nothing to apply yet
    log.done(c)
    log.decide(b, True, {"b": [2]})
    assert list(log.undone) == ["a", "b"]
    log.close()
    now[0] += 10
    again = TransactionLog(tmp_path, clock=lambda: now[0])
    assert list(again.undone) == ["a", "b"]
    again.compact(keep_done_ms=5_000)  # c, done 10 s ago, is forgotten; a and b stay
    assert list(again.undone) == ["a", "b"] and "c" not in again.txns
    again.close()
    assert list(TransactionLog(tmp_path).undone) == ["a", "b"]


def test_the_store_refuses_a_fenced_epochs_half_messages(store: MessageStore) -> None:
    def half(epoch: int) -> Message:
        props = {
            "TRAN_MSG": "true",
            "PGROUP": "g",
            transaction.PROP_GLOBAL_TXN: f"tid.{epoch}.0",
            transaction.PROP_TXN_PRODUCER: "tid",
            transaction.PROP_TXN_EPOCH: str(epoch),
        }
        return Message("T", b"x", properties=props)

    store.put_batch([half(0)])
    assert store.txn_fences.raise_fence("tid", 1)
    before = store.commitlog.max_offset
    with pytest.raises(ProducerFencedError, match="epoch 0 is fenced by epoch 1"):
        store.put_batch([half(0)])
    assert store.commitlog.max_offset == before  # nothing written
    store.put_batch([half(1)])
    assert store.commitlog.max_offset > before
