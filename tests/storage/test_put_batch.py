"""MessageStore.put_batch: its results read as a list of PutResult built when read,
and a batch with a key each takes the C encoder as the producer does, storing what
the general loop stores and refusing what it refuses, with the same error."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from storage import (
    InvalidMessageError,
    Message,
    MessageStore,
    PutResult,
    PutResults,
    _fast_encode,
    codec,
)

needs_native = pytest.mark.skipif(codec._native is None, reason="storage._native is not built")


@contextmanager
def general_loop() -> Iterator[None]:
    """Within it, encode_batch takes its general loop for every batch."""
    codec.use_plain_encoder(None)
    try:
        yield
    finally:
        codec.use_plain_encoder(_fast_encode.encode_plain)


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "checkpoint"
    }


def keyed(n: int, start: int = 0) -> list[Message]:
    return [
        Message("Orders", b"order %d" % i, tags="Paid", keys=[f"order-{i}"], queue_id=i % 4)
        for i in range(start, start + n)
    ]


def test_results_read_as_the_list_of_put_results(store: MessageStore) -> None:
    msgs = [Message("A" if i % 3 else "B", b"m%d" % i, queue_id=i % 2) for i in range(40)]
    got = store.put_batch(msgs)
    assert isinstance(got, PutResults)
    want = got.batch.results()
    assert len(want) == 40 and all(isinstance(r, PutResult) for r in want)
    # one index, before anything built the whole list, then the rest
    fresh = PutResults(got.batch)
    assert [fresh[i] for i in range(40)] == want
    assert fresh[-1] == want[-1] and fresh[-40] == want[0]
    with pytest.raises(IndexError):
        fresh[40]
    with pytest.raises(IndexError):
        fresh[-41]
    assert got == want and want == got
    assert got != want[:-1] and got != [*want[:-1], want[0]]
    assert got == PutResults(got.batch)
    assert got[3:9] == want[3:9] and isinstance(got[3:9], list)
    assert got[::-1] == want[::-1] and list(reversed(got)) == want[::-1]
    assert list(got) == want and list(got) == want  # iterated twice
    assert want[7] in got and got.index(want[7]) == 7 and got.count(want[7]) == 1
    assert got + [] == want
    assert pickle.loads(pickle.dumps(got)) == want  # a Ray answer carries the list
    acc: list[PutResult] = [want[0]]
    alias = acc
    acc += got  # a list extends in place with it
    assert alias is acc and acc == [want[0], *want]
    assert repr(got) == repr(want)
    [first, *_] = got
    assert first == want[0]
    assert {r.topic for r in got} == {"A", "B"}
    assert [r.queue_offset for r in got if r.topic == "A" and r.queue_id == 0] == list(range(13))


def test_put_returns_one_put_result(store: MessageStore) -> None:
    got = store.put(Message("One", b"x", keys=["k"]))
    assert isinstance(got, PutResult) and got.topic == "One" and got.queue_offset == 0


@pytest.mark.parametrize("n", [1, 7, 1000])
@pytest.mark.parametrize("key", [lambda i: [f"o{i}"], lambda i: (f"o{i}",), lambda i: f"o{i}"])
@needs_native
def test_a_key_each_takes_the_c_encoder_as_the_producer_does(n: int, key) -> None:
    msgs = [Message("Orders", b"b", keys=key(i), queue_id=i % 3) for i in range(n)]
    # the C encoder answers its unique keys packed; the general loop as a tuple
    assert isinstance(codec.encode_batch(msgs).uniq_keys, codec.PackedKeys)
    assert isinstance(codec.encode_batch([Message("T", b"b")] * n).uniq_keys, codec.PackedKeys)


def _stored(store: MessageStore, results: list[PutResult]) -> list[tuple]:
    """What a reader gets back for each put: the record's fields but its born and store
    times and unique key (which differ from one run to the next), and what a key finds."""
    out = []
    for r in results:
        [m] = store.get("g", r.topic, r.queue_id, r.queue_offset, 1).messages
        props = {k: v for k, v in m.properties.items() if k != "UNIQ_KEY"}
        assert m.commitlog_offset == r.commitlog_offset
        out.append((m.topic, m.body, m.tags, m.keys, props, m.queue_id, m.store_size))
    for key in ("order-0", "order-777", "order-999"):
        found = store.query_by_key("Orders", key, 10)
        out.append(tuple(sorted((m.commitlog_offset, m.keys) for m in found)))
    return out


def _put_results(results: list[PutResult]) -> list[tuple]:
    return [(r.status, r.topic, r.queue_id, r.queue_offset, r.commitlog_offset) for r in results]


@needs_native
def test_a_key_each_stores_what_the_general_loop_stores(tmp_path: Path, make_config) -> None:
    batches = [keyed(1000, 0), keyed(7, 1000), keyed(1, 1007)]
    with MessageStore(make_config(tmp_path / "c", max_message_size=4096)) as fast_store:
        fast = [r for b in batches for r in fast_store.put_batch(b)]
        fast_seen = _stored(fast_store, fast)
    with general_loop(), MessageStore(make_config(tmp_path / "py", max_message_size=4096)) as s:
        slow = [r for b in batches for r in s.put_batch(b)]
        slow_seen = _stored(s, slow)
    assert _put_results(fast) == _put_results(slow)
    assert fast_seen == slow_seen
    assert len({r.msg_id for r in fast}) == len(fast)


BAD = [  # (what is wrong, the message made so, what the error names)
    ("a key with a space", lambda m: Message(m.topic, m.body, keys=["a b"]), "key='a b'"),
    ("an empty key", lambda m: Message(m.topic, m.body, keys=[""]), "key=''"),
    ("a key with a separator", lambda m: Message(m.topic, m.body, keys=["k\x01"]), "key"),
    ("a str key with a space", lambda m: Message(m.topic, m.body, keys="a b"), "key='a b'"),
    ("a key not str", lambda m: Message(m.topic, m.body, keys=[7]), "key"),
    ("an empty body", lambda m: Message(m.topic, b"", keys=m.keys), "message 500"),
    ("a body too long", lambda m: Message(m.topic, b"x" * 4097, keys=m.keys), "message 500"),
    ("a body not bytes", lambda m: Message(m.topic, "text", keys=m.keys), "body"),
    ("a bad queue id", lambda m: Message(m.topic, m.body, keys=m.keys, queue_id=-2), "queue_id"),
]


def _refusal(tmp_path: Path, make_config, msgs: list[Message]) -> str:
    """The error a store gives for ``msgs``, having written nothing."""
    with MessageStore(make_config(tmp_path, max_message_size=4096), start_services=False) as s:
        s.put_batch(keyed(3, 5000))
        before = snapshot(s.root)
        with pytest.raises(InvalidMessageError) as err:
            s.put_batch(msgs)
        assert snapshot(s.root) == before
        assert s.max_offset("Orders", 0) == 1
    return str(err.value)


@pytest.mark.parametrize("odd,names", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_message_in_a_keyed_batch_is_refused_as_the_general_loop_refuses_it(
    tmp_path: Path, make_config, odd, names: str
) -> None:
    msgs = keyed(1000)
    msgs[500] = odd(msgs[500])
    fast = _refusal(tmp_path / "c", make_config, msgs)
    with general_loop():
        slow = _refusal(tmp_path / "py", make_config, msgs)
    assert fast == slow
    assert names in fast
