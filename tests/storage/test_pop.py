"""POP consumption's state on a real store (``storage.pop``): receive with an invisible
time, ack and change by receipt handle, lapses come back with one more reconsume, FIFO
queues hold one batch in flight, handles cannot be forged or borrowed, and the state
survives a crash of the process that held it. A hand-driven clock makes lapses exact."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from store_sizes import STORE_SIZES

from storage import Message, MessageStore, StoreConfig
from storage.errors import InvalidMessageError, InvalidReceiptHandleError, ReceiptHandleExpiredError
from storage.pop import PopStore, ReceiptHandle

T = "Orders"
G = "billing"


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def commits() -> dict[tuple[str, str, int], int]:
    return {}


@pytest.fixture
def open_pop(
    store: MessageStore, clock: Clock, commits: dict[tuple[str, str, int], int]
) -> Callable[..., PopStore]:
    def make(s: MessageStore | None = None, **kw: object) -> PopStore:
        return PopStore(
            s or store,
            "broker-a",
            clock=clock,
            on_commit=lambda g, t, q, off: commits.__setitem__((g, t, q), off),
            **kw,  # type: ignore[arg-type]
        )

    return make


def put(store: MessageStore, n: int, queue_id: int = 0, tags: str | None = None) -> None:
    store.put_batch(
        [Message(T, b"q%d-%d" % (queue_id, i), tags=tags, queue_id=queue_id) for i in range(n)]
    )


def bodies(popped: list) -> list[bytes]:
    return [p.message.body for p in popped]


def test_pop_ack_lapse_and_change(store: MessageStore, clock: Clock, open_pop, commits) -> None:
    put(store, 5)
    pop = open_pop()
    first = pop.pop(G, T, [0], 3, 2000)
    assert bodies(first) == [b"q0-0", b"q0-1", b"q0-2"]
    assert [p.reconsume_times for p in first] == [0, 0, 0]
    h = ReceiptHandle.parse(first[0].receipt_handle)
    assert (h.topic, h.queue_id, h.offset, h.broker, h.invisible_ms) == (T, 0, 0, "broker-a", 2000)
    # invisible: the next pop gets the rest, then nothing
    assert bodies(pop.pop(G, T, [0], 8, 2000)) == [b"q0-3", b"q0-4"]
    assert pop.pop(G, T, [0], 8, 2000) == []
    assert commits[(G, T, 0)] == 0

    assert pop.ack(G, T, first[0].receipt_handle) is True
    assert pop.ack(G, T, first[0].receipt_handle) is False  # acked before: nothing changes
    assert commits[(G, T, 0)] == 1  # past the acked prefix only
    renewed = pop.change_invisible(G, T, first[1].receipt_handle, 10_000)
    with pytest.raises(InvalidReceiptHandleError, match="superseded"):
        pop.ack(G, T, first[1].receipt_handle)

    clock.advance(2.5)  # q0-2, q0-3, q0-4 lapse; q0-1 was re-armed for 10 s
    with pytest.raises(ReceiptHandleExpiredError, match="expired"):
        pop.ack(G, T, first[2].receipt_handle)
    again = pop.pop(G, T, [0], 8, 2000)
    assert bodies(again) == [b"q0-2", b"q0-3", b"q0-4"]
    assert [p.reconsume_times for p in again] == [1, 1, 1]
    assert [p.message.reconsume_times for p in again] == [1, 1, 1]
    for p in again:
        pop.ack(G, T, p.receipt_handle)
    assert commits[(G, T, 0)] == 1  # q0-1 is still out
    pop.ack(G, T, renewed)
    assert commits[(G, T, 0)] == 5
    assert pop.in_flight(G, T) == 0
    assert pop.stats["acked"] == 5


def test_queues_round_robin_and_tags_filter(store: MessageStore, open_pop, commits) -> None:
    for qid in range(3):
        put(store, 2, qid, tags="A")
        put(store, 2, qid, tags="B")
    pop = open_pop()
    got = pop.pop(G, T, [0, 1, 2], 64, 5000, tags="B")
    assert sorted(bodies(got)) == sorted(b"q%d-%d" % (q, i) for q in range(3) for i in range(2))
    assert all(p.message.tags == "B" for p in got)
    # the filtered-out "A" messages are done: the floor sits at the first "B" in flight
    assert [commits[(G, T, q)] for q in range(3)] == [2, 2, 2]
    for p in got:
        pop.ack(G, T, p.receipt_handle)
    assert [commits[(G, T, q)] for q in range(3)] == [4, 4, 4]
    # a pop of one message at a time moves on to the next queue each time
    for qid in range(3):
        put(store, 1, qid)
    assert sorted(p.message.queue_id for p in (pop.pop(G, T, [0, 1, 2], 1, 5000) for _ in range(3)) for p in p) == [0, 1, 2]  # fmt: skip


def test_fifo_holds_one_batch_per_queue_in_flight(
    store: MessageStore, clock: Clock, open_pop
) -> None:
    put(store, 4)
    pop = open_pop()
    first = pop.pop(G, T, [0], 2, 1000, fifo=True)
    assert bodies(first) == [b"q0-0", b"q0-1"]
    assert pop.pop(G, T, [0], 2, 1000, fifo=True) == []  # in flight: nothing more
    pop.ack(G, T, first[0].receipt_handle)
    assert pop.pop(G, T, [0], 2, 1000, fifo=True) == []  # q0-1 still in flight
    clock.advance(1.5)
    again = pop.pop(G, T, [0], 3, 1000, fifo=True)  # the same message first, then on
    assert bodies(again) == [b"q0-1", b"q0-2", b"q0-3"]
    assert [p.reconsume_times for p in again] == [1, 0, 0]


def test_forged_or_borrowed_handles_change_nothing(store: MessageStore, open_pop, commits) -> None:
    put(store, 2)
    pop = open_pop()
    [p, q] = pop.pop(G, T, [0], 2, 5000)
    h = ReceiptHandle.parse(p.receipt_handle)
    forged = str(h._replace(offset=1))  # the other message, under p's signature
    bad = [
        ("other-group", T, p.receipt_handle, "not issued to group 'other-group'"),
        (G, "Other", p.receipt_handle, "of topic 'Orders', not of topic 'Other'"),
        (G, T, forged, "forged"),
        (G, T, str(h._replace(broker="broker-b")), "this is broker 'broker-a'"),
        (G, T, "p1 junk", "malformed"),
        (G, T, 42, "must be a str"),
    ]
    for group, topic, handle, match in bad:
        with pytest.raises(InvalidReceiptHandleError, match=match):
            pop.ack(group, topic, handle)
        with pytest.raises(InvalidReceiptHandleError):
            pop.change_invisible(group, topic, handle, 1000)
    assert pop.in_flight(G, T) == 2 and commits[(G, T, 0)] == 0
    with pytest.raises(InvalidMessageError, match="max_msgs"):
        pop.pop(G, T, [0], 0, 5000)
    with pytest.raises(InvalidMessageError, match="invisible_ms"):
        pop.pop(G, T, [0], 1, 10)
    with pytest.raises(InvalidMessageError, match="group"):
        pop.pop("bad group", T, [0], 1, 5000)
    with pytest.raises(InvalidMessageError, match="broker_name"):
        PopStore(store, "a b")
    pop.ack(G, T, q.receipt_handle)
    assert pop.in_flight(G, T) == 1


def test_dead_letter_after_max_reconsume_times(
    store: MessageStore, clock: Clock, open_pop, commits
) -> None:
    put(store, 2)
    pop = open_pop(max_reconsume_times=2)
    seen = []
    for _ in range(3):  # delivered with reconsume times 0, 1, 2; never acked
        got = pop.pop(G, T, [0], 1, 1000)
        seen.append((got[0].message.body, got[0].reconsume_times))
        clock.advance(1.1)
    assert seen == [(b"q0-0", 0), (b"q0-0", 1), (b"q0-0", 2)]
    nxt = pop.pop(G, T, [0], 5, 1000)  # the lapse dead-letters it: the next one comes
    assert bodies(nxt) == [b"q0-1"]
    dlq = store.get("", f"%DLQ%{G}", 0, 0, 10)
    assert [m.body for m in dlq.messages] == [b"q0-0"]
    assert dlq.messages[0].properties["RETRY_TOPIC"] == T
    assert dlq.messages[0].reconsume_times == 3
    assert commits[(G, T, 0)] == 1
    assert pop.stats["dead"] == 1
    # a consumer may give up on a message at once (ForwardMessageToDeadLetterQueue)
    pop.forward_to_dlq(G, T, nxt[0].receipt_handle)
    assert [m.body for m in store.get("", f"%DLQ%{G}", 0, 0, 10).messages] == [b"q0-0", b"q0-1"]
    assert commits[(G, T, 0)] == 2 and pop.in_flight(G, T) == 0
    with pytest.raises(InvalidReceiptHandleError, match="not in flight"):
        pop.forward_to_dlq(G, T, nxt[0].receipt_handle)


def test_a_snapshot_of_many_in_flight_is_taken_again_only_after_as_many_records(
    store: MessageStore, open_pop
) -> None:
    """A snapshot writes every message in flight under the POP lock; with many in flight
    it was taken again every ``compact_records`` operations all the same. Now the journal
    first grows by as many records as the last snapshot held messages."""
    put(store, 60)
    pop = open_pop(compact_records=2)
    got = pop.pop(G, T, [0], 60, 60_000)
    pop.ack(G, T, got[0].receipt_handle)  # the second record: a snapshot, 59 in flight
    first = pop._snapshot.load()["seq"]
    for p in got[1:31]:  # 30 records: fewer than the 59 the snapshot held
        pop.ack(G, T, p.receipt_handle)
    assert pop._snapshot.load()["seq"] == first
    for p in got[31:]:  # 29 more: 59 records since it
        pop.ack(G, T, p.receipt_handle)
    assert pop._snapshot.load()["seq"] > first
    assert pop.in_flight(G, T) == 0
    pop.close()


@pytest.mark.parametrize("compact_records", [2, 4096])  # snapshot + journal, journal only
@pytest.mark.parametrize("sizes", STORE_SIZES, indirect=True)
def test_the_state_survives_a_crash(
    config: StoreConfig, clock: Clock, commits, compact_records: int
) -> None:
    store = MessageStore(config)
    put(store, 6)

    def reopen(s: MessageStore) -> PopStore:
        return PopStore(
            s,
            "broker-a",
            clock=clock,
            compact_records=compact_records,
            on_commit=lambda g, t, q, off: commits.__setitem__((g, t, q), off),
        )

    pop = reopen(store)
    got = pop.pop(G, T, [0], 4, 3000)
    pop.ack(G, T, got[0].receipt_handle)
    pop.ack(G, T, got[2].receipt_handle)
    renewed = pop.change_invisible(G, T, got[3].receipt_handle, 60_000)
    # a crash: the PopStore is never closed (nor is its journal flushed beyond write(2))
    store.close()
    commits.clear()
    store = MessageStore(config)
    try:
        pop = reopen(store)
        assert commits[(G, T, 0)] == 1  # told to the offset manager again at start
        assert pop.in_flight(G, T) == 2
        new = pop.pop(G, T, [0], 8, 3000)
        assert bodies(new) == [b"q0-4", b"q0-5"]  # nothing acked or in flight comes as new
        with pytest.raises(InvalidReceiptHandleError, match="superseded"):
            pop.ack(G, T, got[3].receipt_handle)
        clock.advance(3.5)  # q0-1 lapses (and the two just popped); q0-3 was re-armed
        back = pop.pop(G, T, [0], 8, 3000)
        assert sorted(bodies(back)) == [b"q0-1", b"q0-4", b"q0-5"]
        assert {p.message.body: p.reconsume_times for p in back}[b"q0-1"] == 1
        assert pop.ack(G, T, renewed) is True  # a handle from before the crash still works
        for p in back:
            pop.ack(G, T, p.receipt_handle)
        assert commits[(G, T, 0)] == 6
        pop.close()
        # a clean restart: everything done stays done
        pop = reopen(store)
        assert pop.in_flight(G, T) == 0 and pop.pop(G, T, [0], 8, 3000) == []
        pop.close()
    finally:
        store.close()


def test_ack_many_is_one_journal_write_with_an_answer_per_handle(
    config: StoreConfig, clock: Clock, commits
) -> None:
    """Several acks as one operation (one journal write of their records); a bad or superseded handle is
    refused alone, a repeated one acks once; a crash right after keeps them all."""
    store = MessageStore(config)
    put(store, 5)

    def reopen(s: MessageStore) -> PopStore:
        return PopStore(
            s,
            "broker-a",
            clock=clock,
            on_commit=lambda g, t, q, o: commits.__setitem__((g, t, q), o),
        )

    pop = reopen(store)
    got = pop.pop(G, T, [0], 5, 3000)
    superseded = got[4].receipt_handle
    pop.change_invisible(G, T, superseded, 60_000)
    journal = pop._journal_path
    lines = journal.read_bytes().count(b"\n")
    handles = [got[0].receipt_handle, "forged", got[1].receipt_handle, got[0].receipt_handle]
    answers = pop.ack_many(G, T, [*handles, got[2].receipt_handle, superseded])
    assert journal.read_bytes().count(b"\n") == lines + 3  # q0-0, q0-1, q0-2 once each
    assert [a is None for a in answers] == [True, False, True, True, True, False]
    assert isinstance(answers[1], InvalidReceiptHandleError)
    assert "superseded" in str(answers[5])
    assert commits[(G, T, 0)] == 3 and pop.in_flight(G, T) == 2 and pop.stats["acked"] == 3
    assert pop.ack_many(G, T, [got[0].receipt_handle]) == [None]  # acked before: no record
    assert journal.read_bytes().count(b"\n") == lines + 3
    store.close()  # a crash: the PopStore is never closed
    store = MessageStore(config)
    try:
        pop = reopen(store)
        assert pop.in_flight(G, T) == 2  # q0-3 and q0-4 only
        clock.advance(3.5)
        assert bodies(pop.pop(G, T, [0], 8, 3000)) == [b"q0-3"]  # q0-4 was re-armed
        pop.close()
    finally:
        store.close()


def test_raw_records_are_the_records_as_stored(store: MessageStore, open_pop) -> None:
    """A receive's data-path answer: the records' bytes as the CommitLog holds them, which
    decode to the very messages the pop handed out."""
    from storage.codec import decode_records

    put(store, 3, queue_id=0, tags="A")
    put(store, 2, queue_id=1)
    pop = open_pop()
    got = pop.pop(G, T, [0, 1], 5, 2000)
    kept, raw = pop.raw_records(got)
    assert kept == got
    assert len(raw) == sum(p.message.store_size for p in got)
    decoded = decode_records(raw)
    assert [(m.msg_id, m.body, m.tags, m.queue_id, m.queue_offset) for m in decoded] == [
        (
            p.message.msg_id,
            p.message.body,
            p.message.tags,
            p.message.queue_id,
            p.message.queue_offset,
        )
        for p in got
    ]
    assert pop.raw_records([]) == ([], b"")
    pop.close()
