"""A stream on the client's connection: a request with many answers. A real socket and
a real server speaking the data path's handshake (no Ray, no broker: what is tested is
the client's connection and the wire's STREAM flag)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from actors.protocol import frames
from actors.protocol.connection import BrokerConnection
from actors.protocol.frames import Code, Flag
from storage.errors import BrokerUnavailableError, InvalidMessageError

SECRET = b"s" * 32


class StreamServer:
    """Answers a request with ``n`` STREAM answers (``i`` = 0..n-1) then a last answer;
    ``fail`` in the request: an ERROR after the STREAM answers; ``hang``: the connection
    closes after them, with no last answer."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.addr = ""
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.addr = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mine = frames.nonce()
        writer.writelines(frames.encode({"c": int(Code.HELLO), "o": 0, "n": mine}))
        auth, _ = await frames.read_frame(reader, frames.HANDSHAKE_MAX_BYTES)
        theirs = auth["n"]
        proof = frames.proof(SECRET, b"broker", theirs, mine)
        writer.writelines(frames.encode({"c": int(Code.OK), "o": 0, "p": proof}))
        try:
            while True:
                header, _ = await frames.read_frame(reader)
                o, streamed = header["o"], int(Flag.RESPONSE | Flag.STREAM)
                for i in range(header["n"]):
                    head = {"c": int(Code.OK), "o": o, "f": streamed, "i": i}
                    writer.writelines(frames.encode(head, [bytes([i % 256])]))
                if header.get("hang"):
                    await writer.drain()
                    writer.close()
                    return
                if header.get("fail"):
                    err = InvalidMessageError("credit must not be negative")
                    last = {**frames.error_fields(err), "o": o, "f": int(Flag.RESPONSE)}
                else:
                    last = {"c": int(Code.OK), "o": o, "f": int(Flag.RESPONSE), "end": 1}
                writer.writelines(frames.encode(last))
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def conn() -> Iterator[BrokerConnection]:
    server = StreamServer()
    c = BrokerConnection(server.addr, SECRET)
    yield c
    c.close()
    server.close()


def _collect() -> tuple[list[tuple[int, bytes]], Any]:
    got: list[tuple[int, bytes]] = []

    def on_answer(header: dict[str, Any], body: Any) -> None:
        got.append((header["i"], bytes(body)))

    return got, on_answer


def test_every_stream_answer_reaches_the_handler_in_order_before_the_last(
    conn: BrokerConnection,
) -> None:
    got, on_answer = _collect()
    other = conn.request({"c": 99, "n": 0})  # a plain request beside it, answered once
    header, _ = conn.stream({"c": 99, "n": 500}, on_answer).result(10)
    assert header["end"] == 1 and not header["f"] & Flag.STREAM
    assert got == [(i, bytes([i % 256])) for i in range(500)]
    assert other.result(10)[0]["end"] == 1


def test_a_stream_ended_by_an_error_raises_its_type_after_its_answers(
    conn: BrokerConnection,
) -> None:
    got, on_answer = _collect()
    with pytest.raises(InvalidMessageError, match="negative"):
        conn.stream({"c": 99, "n": 3, "fail": 1}, on_answer).result(10)
    assert [i for i, _ in got] == [0, 1, 2]


def test_a_stream_whose_connection_closes_fails_and_hears_nothing_after(
    conn: BrokerConnection,
) -> None:
    got, on_answer = _collect()
    with pytest.raises(BrokerUnavailableError):
        conn.stream({"c": 99, "n": 2, "hang": 1}, on_answer).result(10)
    assert [i for i, _ in got] == [0, 1]
    assert not conn._streams  # the ended stream's handler is let go
