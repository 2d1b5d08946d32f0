"""The data path's frames and handshake, on their own (no broker, no Ray)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgpack
import pytest

from actors.protocol import frames
from actors.protocol.fencing import OffsetFencedError
from storage.errors import BrokerUnavailableError, InvalidMessageError, TopicNotFoundError


def read(data: bytes, max_bytes: int = frames.DEFAULT_MAX_FRAME_BYTES) -> tuple[dict, bytes]:
    async def go() -> tuple[dict, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await frames.read_frame(reader, max_bytes)

    return asyncio.run(go())


def test_a_frame_round_trips_with_its_body_in_parts() -> None:
    parts = frames.encode({"c": 10, "o": 7, "n": 2}, [b"abc", memoryview(b"def"), bytearray(b"g")])
    header, body = read(b"".join(parts))
    assert header == {"c": 10, "o": 7, "n": 2} and body == b"abcdefg"


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (struct.pack(">II", 2000, 4) + b"x" * 2000, "over max_frame_bytes"),
        (struct.pack(">II", 8, 9) + b"x" * 8, "with a header of 9"),
        (struct.pack(">II", 6, 2) + msgpack.packb([1]), "not a map"),
        (struct.pack(">II", 5, 1) + b"\xc1", "not msgpack"),
        (struct.pack(">II", 4 + 5, 5) + msgpack.packb({"c": "x"}), "without an int code"),
    ],
)
def test_a_bad_frame_is_refused_before_its_body_is_used(raw: bytes, match: str) -> None:
    with pytest.raises(frames.FrameError, match=match):
        read(raw, max_bytes=1000)


def test_a_proof_binds_the_secret_both_nonces_and_the_side() -> None:
    secret, a, b = b"s" * 32, frames.nonce(), frames.nonce()
    p = frames.proof(secret, b"client", a, b)
    assert frames.check_proof(secret, b"client", a, b, p)
    assert not frames.check_proof(b"t" * 32, b"client", a, b, p)
    assert not frames.check_proof(secret, b"broker", a, b, p)  # not reusable the other way
    assert not frames.check_proof(secret, b"client", b, a, p)
    assert not frames.check_proof(secret, b"client", a, b, "not bytes")


def test_errors_cross_as_their_own_types() -> None:
    for exc in (TopicNotFoundError("t"), OffsetFencedError("f"), InvalidMessageError("m")):
        back = frames.error_from(frames.error_fields(exc))
        assert type(back) is type(exc) and str(back) == str(exc)
    # an error that is not RayMQ's arrives as a broker failure, never as a stranger's type
    back = frames.error_from(frames.error_fields(KeyError("k")))
    assert type(back) is BrokerUnavailableError
    assert type(frames.error_from({"e": "SystemExit", "m": "x"})) is BrokerUnavailableError


class _Transport:
    """What FrameReader needs of a transport: to be closed."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _reader(max_bytes: int = frames.DEFAULT_MAX_FRAME_BYTES) -> tuple[Any, list[Any], list[Any]]:
    got: list[Any] = []
    errors: list[Any] = []
    reader = frames.FrameReader(
        _Transport(), max_bytes, lambda h, b: got.append((h, bytes(b))), errors.append, print
    )
    return reader, got, errors


def _receive(reader: Any, data: bytes, chunk: int) -> None:
    """Bytes as asyncio hands them over: into the reader's buffer, ``chunk`` at most."""
    pos = 0
    while pos < len(data):
        buf = reader.get_buffer(-1)
        n = min(len(buf), chunk, len(data) - pos)
        buf[:n] = data[pos : pos + n]
        reader.buffer_updated(n)
        pos += n


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_the_frame_reader_cuts_frames_however_the_bytes_arrive(chunk: int) -> None:
    big = bytes(range(256)) * 4096  # 1 MiB: received into a buffer of its own
    sent = [({"c": 10, "o": i}, b"x" * i) for i in range(40)]
    sent.insert(17, ({"c": 11, "o": 99}, big))
    stream = b"".join(b"".join(frames.encode(h, [b])) for h, b in sent)
    reader, got, errors = _reader()
    _receive(reader, stream, chunk)
    assert not errors
    assert got == sent


@pytest.mark.parametrize(
    "bad",
    [
        struct.pack(">II", 1 << 20, 4) + b"{}{}",  # over max_frame_bytes
        struct.pack(">II", 6, 2) + b"\x92\x01",  # a header that is not a map
        struct.pack(">II", 8, 10) + b"\x80" * 4,  # a header longer than the frame
    ],
    ids=["oversized", "not-a-map", "header-too-long"],
)
def test_the_frame_reader_refuses_a_bad_frame_and_delivers_nothing_after(bad: bytes) -> None:
    reader, got, errors = _reader(max_bytes=1 << 16)
    good = b"".join(frames.encode({"c": 10, "o": 1}, [b"ok"]))
    _receive(reader, good + bad + good, 1 << 16)
    assert [h["o"] for h, _ in got] == [1]  # the frame before, not the one after
    assert len(errors) == 1 and isinstance(errors[0], frames.FrameError)
    assert reader.transport.closed


class _Written:
    """What write_frame needs of a transport: to take bytes (kept, in order)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: Any) -> None:
        self.chunks.append(bytes(data))


def test_written_frames_read_back_whatever_their_body_and_writing_thread() -> None:
    import threading

    import numpy as np

    big = np.arange(1 << 17, dtype=np.int64)  # 1 MiB: its parts written one by one
    bodies: list[list[Any]] = [
        [],
        [b"abc"],
        [memoryview(b"de"), bytearray(b"f"), np.arange(3, dtype=np.int32)],
        [b"head", big],
    ]
    joined = [b"".join(bytes(memoryview(p).cast("B")) for p in body) for body in bodies]

    def write_all(out: _Written, tag: int) -> None:
        for i, body in enumerate(bodies * 50):
            frames.write_frame(out, {"c": 10, "o": i, "t": tag, "k": ["T", tag]}, body)

    outs = [_Written() for _ in range(4)]
    threads = [threading.Thread(target=write_all, args=(out, t)) for t, out in enumerate(outs)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for tag, out in enumerate(outs):
        reader, got, errors = _reader()
        _receive(reader, b"".join(out.chunks), 1 << 20)
        assert not errors
        assert len(got) == 200
        for i, (header, body) in enumerate(got):
            assert header == {"c": 10, "o": i, "t": tag, "k": ["T", tag]}
            assert body == joined[i % 4]
    assert any(len(c) == big.nbytes for c in outs[0].chunks)  # not copied into one write
