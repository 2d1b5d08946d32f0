"""storage._native (the C loops) against the numpy code it stands in for.

Every C loop has a numpy twin used where the module is not built; here both run
on the same input and must leave the same bytes: records checked, patched and
indexed in a real store on a temp dir, file by file.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from storage import InvalidMessageError, Message, MessageStore, StoreCorruptedError, codec, record
from storage._fast_encode import encode_plain
from storage.index_file import IndexFile
from storage.seq_slots import seq_slot


def _batches(seed: int) -> list[codec.EncodedBatch]:
    """Batches past SMALL_BATCH (the C paths), of mixed topics, queues, keys and tags,
    enough to roll the tiny CommitLog and index files of ``small_config``."""
    rng = random.Random(seed)
    out = []
    for b in range(14):
        msgs = [
            Message(
                rng.choice(["TopicA", "TopicB"]),
                rng.randbytes(rng.randint(1, 900)),
                tags=rng.choice([None, "x", "y"]),
                keys=rng.choice([(), f"k{rng.randint(0, 30)}", ["a", f"b{i}"]]),
                queue_id=rng.randint(0, 3),
            )
            for i in range(rng.randint(17, 60))
        ]
        out.append(codec.encode_batch(msgs))
        if b % 3 == 0:  # a uniform one as well: one topic and queue, the plain encoder
            plain = [Message("TopicA", rng.randbytes(120), queue_id=2) for _ in range(40)]
            out.append(codec.encode_batch(plain))
    return out


def _store_bytes(root: Path) -> dict[str, bytes]:
    """Every data file of a store by its place (index files by their order: their
    names are creation times)."""
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and rel.parts[0] in ("commitlog", "consumequeue"):
            files[str(rel)] = path.read_bytes()
    for i, path in enumerate(sorted((root / "index").iterdir())):
        files[f"index#{i}"] = path.read_bytes()
    return files


def _fill(root: Path, make_config, batches: list[codec.EncodedBatch]) -> tuple[dict, list]:
    store = MessageStore(make_config(root), clock=lambda: 1_700_000_000.5)
    try:
        results = [store.put_encoded(b) for b in batches]
        found = sorted(m.commitlog_offset for m in store.query_by_key("TopicA", "k3", 100))
        offsets = [r.commitlog_offsets.tolist() for r in results]
    finally:
        store.close()
    return _store_bytes(root), [offsets, found]


def test_a_store_filled_through_c_and_through_numpy_is_the_same_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_config
) -> None:
    assert codec._native is not None
    batches = _batches(1)
    with_c, answers_c = _fill(tmp_path / "c", make_config, batches)
    monkeypatch.setattr(record, "_native", None)
    with_numpy, answers_numpy = _fill(tmp_path / "numpy", make_config, batches)
    assert len([k for k in with_c if k.startswith("commitlog")]) >= 3  # files rolled
    assert len([k for k in with_c if k.startswith("index")]) >= 2
    assert with_c.keys() == with_numpy.keys()
    for name in with_c:
        assert with_c[name] == with_numpy[name], name
    assert answers_c == answers_numpy


def _single_sends(seed: int) -> list[codec.EncodedBatch]:
    """One-record sends (the single-send put's shape) of mixed topics, queues, tags and
    keys (none, the unique key alone, several), some of an idempotent producer: enough
    to roll the tiny CommitLog, queue and index files of ``small_config``."""
    rng = random.Random(seed)
    uniq = codec.UniqueKeyGenerator()
    born = codec.host_to_bytes("127.0.0.1:1")
    slot = seq_slot("native-producer")
    out = []
    seqs: dict[tuple[str, int], int] = {}
    for i in range(1500):
        msg = Message(
            rng.choice(["TopicA", "TopicB"]),
            rng.randbytes(rng.randint(1, 700)),
            tags=rng.choice([None, "x", "y"]),
            keys=rng.choice([(), (), f"k{rng.randint(0, 30)}", ["a", f"b{i}"]]),
            queue_id=rng.randint(0, 3),
        )
        if rng.random() < 0.3:  # an idempotent producer's numbered send
            plain = encode_plain([msg], 1 << 20, 1_700_000_000_000, born, uniq, slot)
            if plain is not None:
                seq = seqs.get((msg.topic, msg.queue_id), 0)
                seqs[(msg.topic, msg.queue_id)] = seq + 1
                out.append(plain.with_sequence("native-producer", 0, seq))
                continue
        out.append(codec.encode_batch([msg]))
    return out


def test_single_sends_put_through_c_and_through_python_are_the_same_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_config
) -> None:
    # write_one puts a single send's record, queue entry and index link in one call
    # while the last files have room; the Python path, for what does not fit (a
    # file to roll or allocate) and where the module is not built, must agree
    native = codec._native
    assert native is not None
    sends = _single_sends(3)
    calls = []
    write_one = native.write_one

    def counted(*args: object) -> int:
        calls.append(args[5])
        return write_one(*args)

    monkeypatch.setattr(native, "write_one", counted)
    with_c, answers_c = _fill(tmp_path / "c", make_config, sends)
    assert len(calls) > len(sends) * 0.8  # the usual put went through C
    monkeypatch.setattr(record, "_native", None)
    with_python, answers_python = _fill(tmp_path / "python", make_config, sends)
    assert len([k for k in with_c if k.startswith("commitlog")]) >= 3  # files rolled
    assert len([k for k in with_c if k.startswith("index")]) >= 2
    assert len([k for k in with_c if k.startswith("consumequeue")]) >= 8
    assert with_c.keys() == with_python.keys()
    for name in with_c:
        assert with_c[name] == with_python[name], name
    assert answers_c == answers_python
    assert answers_c[1]  # the key looked up was found


def test_write_one_refuses_places_past_its_buffers_and_writes_nothing() -> None:
    native = codec._native
    assert native is not None
    rec = bytes(codec.encode_batch([Message("T", b"body")]).data)
    host = bytes(8)
    log, cq, index = bytearray(4096), bytearray(40), bytearray(40 + 4 * 7 + 20 * 5)

    def write(**changed: object) -> object:
        args: dict[str, object] = dict(
            log=log, log_at=0, record=rec, queue_id=1, queue_offset=2, phys=3, store_ts=4,
            host=host, cq=cq, cq_at=0, tag=5, index=index, slots=7, count=1, hashes=[9],
            diff=0, begin_ts=4, begin_offset=3, end_offset=3, slot_count=0,
        )  # fmt: skip
        args.update(changed)
        return native.write_one(*args.values())

    for changed, message in [
        ({"log_at": 4096 - len(rec) + 1}, "past the end of the log"),
        ({"log_at": -1}, "past the end of the log"),
        ({"cq_at": 21}, "past the end of the queue file"),
        ({"count": 5}, "past the end of the index file"),
        ({"count": 3, "hashes": [1, 2, 3]}, "past the end of the index file"),
        ({"count": 0}, "past the end of the index file"),
        ({"hashes": [-1]}, "past the end of the index file"),
        ({"hashes": list(range(17))}, "more than 16 hashes"),
        ({"record": rec[:-1]}, "TOTALSIZE"),
        ({"host": bytes(7)}, "host must be 8 bytes"),
    ]:
        with pytest.raises(ValueError, match=message):
            write(**changed)
    assert log == bytearray(4096) and cq == bytearray(40) and not any(index)
    with pytest.raises(BufferError):  # a read-only mapping
        write(log=bytes(4096))
    with pytest.raises(TypeError, match="20 arguments"):
        native.write_one(log, 0)
    with pytest.raises(TypeError, match="a list"):
        write(hashes=(9,))
    assert write(hashes=[9, 16]) == 1  # one slot (9 % 7 == 16 % 7), empty before
    assert write(log_at=len(rec), count=3, hashes=[5], slot_count=1) == 1  # another

    def entry(number: int) -> tuple[int, int]:  # its hash and the entry before it
        at = 40 + 4 * 7 + 20 * number
        return int.from_bytes(index[at : at + 4], "big"), int.from_bytes(index[at + 16 : at + 20])

    assert [entry(n) for n in (1, 2, 3)] == [(9, 0), (16, 1), (5, 0)]  # 16 linked to 9
    assert index[40 + 4 * 2 : 40 + 4 * 3] == (2).to_bytes(4, "big")  # 9 % 7's head: entry 2
    assert index[40 + 4 * 5 : 40 + 4 * 6] == (3).to_bytes(4, "big")
    assert index[36:40] == (4).to_bytes(4, "big")  # the count, one past the last entry
    assert index[32:36] == (2).to_bytes(4, "big")  # two slots used
    assert log[: len(rec)] != rec and log[12:16] == (1).to_bytes(4, "big")  # patched
    assert write(index=None, cq_at=20) == 0  # no index: the record and entry alone


def test_record_scans_agree_on_good_and_broken_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = codec.encode_batch([Message("T", b"b" * (i % 50 + 1), tags="t") for i in range(100)])
    sizes = batch.sizes
    starts = np.cumsum(sizes) - sizes
    cases = [bytes(batch.data)]
    for offset in (0, 4, 5):  # a record's size, its MAGIC, then a byte of MAGIC
        broken = bytearray(batch.data)
        broken[int(starts[37]) + offset] ^= 0x40
        cases.append(bytes(broken))

    def answers() -> list:
        out = []
        for data in cases:
            good = codec._headers_match(data, sizes)
            out.append((good, codec.body_length_range(data, sizes) if good else None))
        return out

    assert codec._native is not None
    with_c = answers()
    monkeypatch.setattr(record, "_native", None)
    assert with_c == answers()
    assert with_c[0] == (True, (1, 50)) and not any(good for good, _ in with_c[1:])


def test_patch_refuses_records_past_the_buffer_and_writes_nothing() -> None:
    native = codec._native
    assert native is not None
    buf = bytearray(300)
    sizes = np.array([100, 100, 101], dtype=np.int32)
    ones32, ones64 = np.ones(3, np.int32), np.ones(3, np.int64)
    with pytest.raises(ValueError, match="past the end"):
        native.patch_records(buf, 0, sizes, ones32, ones64, ones64, bytes(16))
    with pytest.raises(ValueError, match="shorter than its header"):
        native.patch_records(
            buf, 0, np.array([10], np.int32), ones32[:1], ones64[:1], ones64[:1], bytes(16)
        )
    with pytest.raises(ValueError, match="differ in length"):
        native.patch_records(buf, 0, sizes, ones32[:2], ones64, ones64, bytes(16))
    assert buf == bytearray(300)
    with pytest.raises(BufferError):  # a read-only buffer
        native.patch_records(
            bytes(300), 0, sizes[:2], ones32[:2], ones64[:2], ones64[:2], bytes(16)
        )


def test_index_links_agree_with_collisions_and_stale_heads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(5)
    hashes = [rng.integers(0, 1 << 31, size=n) for n in (40, 25, 300)]
    offsets = [np.arange(len(h), dtype=np.int64) * 7 + 1000 * i for i, h in enumerate(hashes)]

    def fill(path: Path) -> tuple[bytes, int]:
        f = IndexFile(path, slots=13, max_entries=500, create=True)
        f._slot_table[3] = 999  # a head written after the last good header: stale
        for h, o in zip(hashes, offsets):
            f.put(h, o, 1_700_000_000_000)
        found = f.query(int(hashes[2][0]), 50, 0, 1 << 62)
        state = (f.slot_count, f.index_count, found)
        f.flush()
        f.close()
        return path.read_bytes(), state

    assert codec._native is not None
    with_c = fill(tmp_path / "1")
    monkeypatch.setattr(record, "_native", None)
    assert with_c == fill(tmp_path / "2")


def test_malformed_batch_is_refused_by_the_c_scan_too(tmp_path: Path, make_config) -> None:
    batch = codec.encode_batch([Message("T", b"x%d" % i) for i in range(40)])
    data = bytearray(batch.data)
    data[4] ^= 1  # the first record's MAGIC
    broken = codec.EncodedBatch(
        bytes(data),
        batch.sizes,
        batch.topics,
        batch.topic_idx,
        batch.queue_ids,
        batch.tag_codes,
        batch.key_hashes,
        batch.key_owner,
        batch.uniq_keys,
    )
    store = MessageStore(make_config(tmp_path / "s"))
    try:
        with pytest.raises(InvalidMessageError):
            store.put_encoded(broken)
        assert store.commitlog.max_offset == 0
    finally:
        store.close()


@pytest.mark.parametrize("damage", [None, "magic", "body_len", "negative_body"])
def test_body_slices_agree_and_refuse_the_same_garbage(
    monkeypatch: pytest.MonkeyPatch, damage: str | None
) -> None:
    rng = random.Random(9)
    batch = codec.encode_batch(
        [Message("T", rng.randbytes(rng.randint(1, 400))) for _ in range(60)]
    )
    sizes = batch.sizes.astype(np.int64)
    starts = np.cumsum(sizes) - sizes
    data = bytearray(batch.data)
    at = int(starts[21])
    if damage == "magic":
        data[at + 4] ^= 0xFF
    elif damage == "body_len":  # longer than its record
        data[at + codec.OFF_BODYLEN : at + codec.HEADER.size] = (10_000).to_bytes(4, "big")
    elif damage == "negative_body":
        data[at + codec.OFF_BODYLEN : at + codec.HEADER.size] = b"\xff\xff\xff\xf0"

    def answer() -> object:
        try:
            return codec.body_slices(bytes(data), starts)
        except StoreCorruptedError as exc:
            return type(exc)

    assert codec._native is not None
    with_c = answer()
    monkeypatch.setattr(record, "_native", None)
    assert with_c == answer()
    if damage is None:
        assert with_c == [m.body for m in codec.decode_records(batch.data)]
    else:
        assert with_c is StoreCorruptedError


def test_records_become_visible_only_once_their_store_fields_are_written(
    tmp_path: Path, make_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    # replication reads the CommitLog up to its write position on the broker's loop
    # while a service thread may put delayed messages: the C patch runs without the
    # GIL, so the write position must move only after it
    native = codec._native
    assert native is not None
    store = MessageStore(make_config(tmp_path / "s"))
    try:
        store.put(Message("T", b"first"))
        before = store.commitlog.max_offset
        seen = []
        patch = native.patch_records

        def observed(*args: object) -> None:
            seen.append(store.commitlog.max_offset)
            patch(*args)

        monkeypatch.setattr(native, "patch_records", observed)
        store.put_encoded(codec.encode_batch([Message("T", b"m%d" % i) for i in range(40)]))
        assert seen == [before]
        assert store.commitlog.max_offset > before
        assert [m.queue_offset for m in store.get("g", "T", 0, 1, 100).messages] == list(
            range(1, 41)
        )
    finally:
        store.close()


@pytest.mark.parametrize("tags", [None, "x", "t" * 32_700])
def test_the_encoders_reserve_the_same_producer_seq_slot(tags: str | None) -> None:
    """C and numpy write the same bytes with a PRODUCER_SEQ slot in the first record, and
    both give the batch up (None: the general path) when the slot would not fit PROPLEN."""
    from storage import _fast_encode

    class Keys(codec.UniqueKeyGenerator):
        def take(self, n: int) -> int:
            return 1234

    gen, born = Keys(), codec.host_to_bytes("10.0.0.1:9")
    msgs = [Message("T", bytes([i]) * (i + 1), tags=tags, queue_id=i % 3) for i in range(20)]
    slot = codec.seq_slot("a-producer@1")
    c = _fast_encode.encode_plain_c(msgs, 1 << 20, 7, born, gen, slot)
    py = _fast_encode.encode_plain_numpy(msgs, 1 << 20, 7, born, gen, slot)
    if tags is not None and len(tags) > 32_000:
        assert c is None and py is None
        return
    assert c is not None and py is not None
    assert bytes(c.data) == bytes(py.data) and c.sizes.tolist() == py.sizes.tolist()
    assert c.seq_slot_at == py.seq_slot_at
    plain = _fast_encode.encode_plain_c(msgs, 1 << 20, 7, born, gen)
    assert plain is not None and plain.seq_slot_at is None
    # only the first record grew, by the slot
    assert (c.sizes - plain.sizes).tolist() == [len(slot)] + [0] * 19
    c.check_structure()  # as a broker checks it: lengths, properties, CRCs
    first = codec.decode_records(bytes(c.data))[0]
    assert first.properties[codec.PROP_PRODUCER_SEQ].endswith(",0000000000")  # count 0
    # keyed batches (one key each) have no numpy twin: the C slot is checked as a broker would
    keyed = [Message("T", b"k%d" % i, keys=f"order-{i}") for i in range(20)]
    kc = _fast_encode.encode_plain_c(keyed, 1 << 20, 7, born, gen, slot)
    assert kc is not None and kc.seq_slot_at is not None
    kc.check_structure()
    bound = kc.with_sequence("a-producer@1", 2, 40, 1)
    got = codec.decode_records(bytes(codec.EncodedBatch.from_bytes(bound.to_bytes()).data))
    assert [list(m.keys) for m in got] == [[f"order-{i}"] for i in range(20)]
    pseq = got[0].properties[codec.PROP_PRODUCER_SEQ]
    assert pseq == f"a-producer@1,{2:010d},{40:019d},{20:010d}"


def _stored_records(tmp_path: Path, make_config, count: int) -> bytes:
    """``count`` records as a pull reads them from a real store: store fields written,
    tags, keys, properties of their own, a reconsumed one."""
    rng = random.Random(count)
    store = MessageStore(make_config(tmp_path / f"store{count}"), clock=lambda: 1_700_000_000.5)
    try:
        msgs = [
            Message(
                "TopicA",
                rng.randbytes(rng.randint(1, 300)),
                tags=rng.choice([None, "x", "tag-y"]),
                keys=rng.choice([(), f"k{i}", ["a", f"b{i}"]]),
                properties=rng.choice([None, {"color": "blue", "n": str(i)}]),
                queue_id=1,
                flag=i,
            )
            for i in range(count)
        ]
        store.put_encoded(codec.encode_batch(msgs, reconsume_times=count % 3))
        raw = store.get_raw("g", "TopicA", 1, 0, count)
        assert raw.count == count
        return bytes(raw.data)
    finally:
        store.close()


@pytest.mark.parametrize("count", [1, 5, 40])  # the Python twin: one at a time, then numpy
def test_decode_records_in_c_gives_what_python_gives(
    tmp_path: Path, make_config, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    data = _stored_records(tmp_path, make_config, count)
    assert record._native is not None
    with_c = codec.decode_records(data)
    monkeypatch.setattr(record, "_native", None)
    in_python = codec.decode_records(data)
    assert len(with_c) == count
    assert [tuple(m) for m in with_c] == [tuple(m) for m in in_python]
    assert all(type(m) is codec.MessageExt for m in with_c)
    assert [m.properties for m in with_c] == [m.properties for m in in_python]
    assert [m.msg_id for m in with_c] == [m.msg_id for m in in_python]
    assert with_c[0].store_host == in_python[0].store_host and ":" in with_c[0].store_host


@pytest.mark.parametrize(
    "damage", ["magic", "size", "body_crc", "topic_len", "props_len", "ipv6", "truncated"]
)
def test_decode_records_in_c_refuses_what_python_refuses(
    tmp_path: Path, make_config, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    data = bytearray(_stored_records(tmp_path, make_config, 5))
    sizes = []
    pos = 0
    while pos < len(data):
        sizes.append(int.from_bytes(data[pos : pos + 4], "big"))
        pos += sizes[-1]
    at = sum(sizes[:3])  # the fourth record
    body_len = int.from_bytes(data[at + codec.OFF_BODYLEN : at + codec.HEADER.size], "big")
    topic_at = at + codec.HEADER.size + body_len
    if damage == "magic":
        data[at + 4] ^= 0xFF
    elif damage == "size":
        data[at : at + 4] = (sizes[3] + 7).to_bytes(4, "big")
    elif damage == "body_crc":
        data[at + 8 : at + 12] = (
            (int.from_bytes(data[at + 8 : at + 12], "big") + 1) & 0x7FFFFFFF
        ).to_bytes(4, "big")
    elif damage == "topic_len":
        data[topic_at] = 200
    elif damage == "props_len":
        p = topic_at + 1 + data[topic_at]
        data[p : p + 2] = (int.from_bytes(data[p : p + 2], "big") + 1).to_bytes(2, "big")
    elif damage == "ipv6":
        data[at + 36 : at + 40] = (0x10).to_bytes(4, "big")
    elif damage == "truncated":
        del data[-5:]

    def answer() -> str:
        with pytest.raises(StoreCorruptedError) as info:
            codec.decode_records(bytes(data))
        return str(info.value)

    with_c = answer()  # the C pass refuses it and the Python path names it
    monkeypatch.setattr(record, "_native", None)
    assert with_c == answer()
    # a record's CRC is checked only when asked: the rest decode as before
    if damage == "body_crc":
        assert len(codec.decode_records(bytes(data), check_crc=False)) == 5


def test_decode_records_takes_any_buffer_the_python_path_takes(tmp_path: Path, make_config) -> None:
    """A buffer the C pass cannot read in place (not contiguous) goes the Python way."""
    data = _stored_records(tmp_path, make_config, 3)
    spread = np.frombuffer(b"".join(bytes([b, 0]) for b in data), dtype=np.uint8)[::2]
    assert not spread.flags.c_contiguous
    expected = [tuple(m) for m in codec.decode_records(data)]
    assert [tuple(m) for m in codec.decode_records(memoryview(spread))] == expected


def test_decode_records_goes_without_a_c_module_built_before_it(
    tmp_path: Path, make_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An editable install keeps the module it built until it is built again: one
    without ``decode_records`` decodes the Python way rather than failing."""
    data = _stored_records(tmp_path, make_config, 5)
    expected = [tuple(m) for m in codec.decode_records(data)]
    monkeypatch.setattr(record, "_native", object())  # has none of the new functions
    assert [tuple(m) for m in codec.decode_records(data)] == expected


@pytest.mark.parametrize("native", [True, False])
def test_decode_records_checks_the_sizes_a_pull_carries(
    tmp_path: Path, make_config, monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """A pull's answer carries its records' sizes: they start the Python paths, and a
    count of sizes the records do not match is refused by both, not trusted."""
    raw_store = _stored_records(tmp_path, make_config, 40)
    sizes = []
    pos = 0
    while pos < len(raw_store):
        sizes.append(int.from_bytes(raw_store[pos : pos + 4], "big"))
        pos += sizes[-1]
    expected = [tuple(m) for m in codec.decode_records(raw_store)]
    if not native:
        monkeypatch.setattr(record, "_native", None)
    got = codec.decode_records(raw_store, sizes=np.asarray(sizes, dtype=np.int32))
    assert [tuple(m) for m in got] == expected
    with pytest.raises(StoreCorruptedError):  # one size short: the last record is orphaned
        codec.decode_records(raw_store, sizes=np.asarray(sizes[:-1], dtype=np.int32))


class _Spinner:
    """A thread that runs Python as long as it holds the GIL, counting as it goes: its
    count moves only while the thread under test lets the GIL go (or is switched out
    after the interpreter's switch interval, longer than any timed section here)."""

    def __init__(self) -> None:
        self.count = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop:
            self.count += 1

    def __enter__(self) -> _Spinner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join()


@pytest.fixture
def switch_interval() -> Iterator[float]:
    """A switch interval of 20 ms: a waiting thread asks for the GIL after 20 ms."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.02)
    try:
        yield 0.02
    finally:
        sys.setswitchinterval(before)


def test_a_single_records_c_loops_keep_the_gil_and_a_large_batchs_let_it_go(
    switch_interval: float,
) -> None:
    """Letting the GIL go hands it to a thread that waits for it, and taking it back
    then waits for that thread's switch interval: milliseconds on a broker's event
    loop or a producer's caller for a microsecond of work. So the C loops keep the
    GIL for a single record (the producer's encode; the broker's check, CommitLog
    patch, index links, record scan), and let it go for a large batch. Each round
    starts on a fresh switch interval (the GIL just taken back from the spinner) and
    lasts a few milliseconds: the spinner runs only if a loop lets the GIL go."""
    native = record._native
    assert native is not None
    one = codec.encode_batch([Message("Single", b"x" * 100, keys="k")])
    raw_topics = (b"Single",)
    buffer = bytearray(one.data)
    hashes, offsets = np.array([12345], np.int64), np.array([0], np.int64)
    index = bytearray(4 * 97 + 20 * 4)
    born = codec.host_to_bytes("127.0.0.1:1")
    uniq = codec.UniqueKeyGenerator()
    loops = {
        "verify_records": lambda: native.verify_records(
            one.data, one.sizes, one.topic_idx, raw_topics, 0xFFFF, 0
        ),
        "scan_records": lambda: native.scan_records(one.data, one.sizes),
        "patch_records": lambda: native.patch_records(
            buffer, 0, one.sizes, one.queue_ids, offsets, offsets, bytes(16)
        ),
        "link_index": lambda: native.link_index(index, 0, 97, 4 * 97, 0, hashes, offsets, 0),
        "encode_plain": lambda: encode_plain(
            [Message("Single", b"x" * 100)], 4 << 20, 1, born, uniq, None
        ),
    }
    for call in loops.values():
        call()  # each works on these arguments (and is warm)
    with _Spinner() as spinner:
        for name, call in loops.items():
            turns = 0  # rounds in which the spinner ran
            for _ in range(30):
                time.sleep(0.001)  # the spinner holds the GIL until we take it back
                before = spinner.count
                for _ in range(200):
                    call()
                turns += spinner.count != before
            # a loop that lets the GIL go lost it in 5 to 24 of 30 rounds here; one that
            # keeps it, only when the OS holds this thread off past the interval
            assert turns <= 3, f"{name} let the GIL go for one record ({turns} of 30 rounds)"
        big = codec.encode_batch([Message("Single", b"y" * 4096) for _ in range(2048)])
        before = spinner.count
        native.verify_records(big.data, big.sizes, big.topic_idx, raw_topics, 0xFFFF, 0)
        assert spinner.count > before, "a check of 8 MiB of records kept the GIL throughout"
