"""The idempotent producer's numbering, without a cluster: ids once, sequences per
queue, sequences given back when never sent, a new epoch when a gap would stay."""

from __future__ import annotations

from actors.client.idempotence import Sequencer
from actors.protocol.route import TopicRouteData
from rebalance import MessageQueue
from storage import Message, codec

ROUTE = TopicRouteData("T", (), ())


def chunk(n: int) -> codec.EncodedBatch:
    return codec.encode_batch([Message("T", b"x%d" % i) for i in range(n)])


def runs(batch: codec.EncodedBatch) -> tuple[int, int, int]:
    assert batch.seq_runs is not None
    return batch.producer_epoch, int(batch.seq_runs[0, 1]), len(batch)


def test_each_queue_counts_on_its_own_and_the_id_is_asked_for_once() -> None:
    asked: list[str] = []
    seq = Sequencer(lambda route, broker: asked.append(broker) or "b-0:7")
    q0, q1 = MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)
    assert runs(seq.bind(chunk(3), q0, ROUTE)) == (0, 0, 3)
    assert runs(seq.bind(chunk(2), q0, ROUTE)) == (0, 3, 2)
    assert runs(seq.bind(chunk(4), q1, ROUTE)) == (0, 0, 4)
    assert asked == ["b"] and seq.producer_id == "b-0:7"
    bound = seq.bind(chunk(1), q1, ROUTE)
    assert bound.producer_id == "b-0:7" and bound.queue_ids.tolist() == [1]
    # the first record carries the run for recovery; the records are the chunk's
    first = codec.decode_records(bytes(bound.data), check_crc=True)[0]
    assert first.properties[codec.PROP_PRODUCER_SEQ] == "b-0:7,0,4,1"


def test_a_run_never_sent_gives_its_numbers_back_or_starts_an_epoch() -> None:
    seq = Sequencer(lambda route, broker: "p:1")
    q = MessageQueue("T", "b", 0)
    last = seq.bind(chunk(2), q, ROUTE)
    seq.release(last, q)  # nothing after it: the numbers are free again
    assert runs(seq.bind(chunk(2), q, ROUTE)) == (0, 0, 2)
    middle = seq.bind(chunk(2), q, ROUTE)
    seq.bind(chunk(2), q, ROUTE)
    seq.release(middle, q)  # later numbers were handed out: they would wait forever
    assert seq.epoch == 1 and runs(seq.bind(chunk(1), q, ROUTE)) == (1, 0, 1)
    seq.abandon(middle, q)  # of an epoch that is over already: nothing more happens
    assert seq.epoch == 1
    seq.abandon(seq.bind(chunk(1), q, ROUTE), q)
    assert seq.epoch == 2 and runs(seq.bind(chunk(1), q, ROUTE)) == (2, 0, 1)
