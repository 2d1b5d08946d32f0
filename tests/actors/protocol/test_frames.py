"""The data path's frames and handshake, on their own (no broker, no Ray)."""

from __future__ import annotations

import asyncio
import struct

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
