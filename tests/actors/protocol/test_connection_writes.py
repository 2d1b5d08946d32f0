"""The client connection's writes: callers write their frames to the socket themselves
when it can take them, and through the I/O loop otherwise, and frames leave in the
order they were requested either way. A real socket and a real server speaking the
data path's handshake (no Ray, no broker: what is tested is the client's connection)."""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from actors.protocol import frames
from actors.protocol.connection import BrokerConnection
from actors.protocol.frames import Code

SECRET = b"s" * 32


class SlowServer:
    """Answers every frame with its ``seq``, after holding the first large frame's
    bytes unread until ``release`` (so the client's socket fills and its writes queue)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.release = threading.Event()
        self.seqs: list[int] = []
        self.bodies: dict[int, int] = {}  # seq -> crc32 of the body received
        self.addr = ""
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0, limit=1 << 16)
        )
        self.addr = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mine = frames.nonce()
        writer.writelines(frames.encode({"c": int(Code.HELLO), "o": 0, "n": mine}))
        auth, _ = await frames.read_frame(reader, frames.HANDSHAKE_MAX_BYTES)
        theirs = auth["n"]
        assert frames.check_proof(SECRET, b"client", mine, theirs, auth["p"])
        writer.writelines(
            frames.encode(
                {"c": int(Code.OK), "o": 0, "p": frames.proof(SECRET, b"broker", theirs, mine)}
            )
        )
        try:
            while True:
                header, body = await frames.read_frame(reader, 64 << 20)
                if len(body) > 1 << 20:  # the large frame: hold the rest until released
                    await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 30)
                self.seqs.append(header["seq"])
                self.bodies[header["seq"]] = zlib.crc32(body)
                writer.writelines(
                    frames.encode({"c": int(Code.OK), "o": header["o"], "r": header["seq"]})
                )
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def server() -> Iterator[SlowServer]:
    s = SlowServer()
    yield s
    s.release.set()
    s.close()


def test_frames_leave_in_request_order_whether_written_by_the_caller_or_the_loop(
    server: SlowServer,
) -> None:
    conn = BrokerConnection(server.addr, SECRET, name="slow")
    conn.open()
    try:
        assert conn.request({"c": int(Code.HEARTBEAT), "seq": 0}).result(10)[0]["r"] == 0
        # a frame larger than both sockets' buffers: the caller writes what fits, the
        # loop the rest, and every frame after it waits its turn behind it
        big: list[Any] = [b"x" * (16 << 20)]
        futures = [conn.request({"c": int(Code.SEND), "seq": 1}, big)]
        futures += [conn.request({"c": int(Code.HEARTBEAT), "seq": i}) for i in range(2, 200)]
        server.release.set()
        answers = [f.result(30)[0]["r"] for f in futures]
        assert answers == list(range(1, 200))
        # once it is all out, callers write directly again, still in order
        futures = [conn.request({"c": int(Code.HEARTBEAT), "seq": i}) for i in range(200, 400)]
        assert [f.result(10)[0]["r"] for f in futures] == list(range(200, 400))
        assert server.seqs == list(range(400))
    finally:
        conn.close()


def test_requests_from_many_threads_each_get_their_own_answer(server: SlowServer) -> None:
    server.release.set()
    conn = BrokerConnection(server.addr, SECRET, name="slow")
    conn.open()
    got: dict[int, int] = {}
    lock = threading.Lock()

    def work(base: int) -> None:
        for i in range(base, base + 300):
            answer = conn.request({"c": int(Code.HEARTBEAT), "seq": i}).result(10)[0]["r"]
            with lock:
                got[i] = answer

    threads = [threading.Thread(target=work, args=(k * 1000,)) for k in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert got == {i: i for k in range(4) for i in range(k * 1000, k * 1000 + 300)}
        assert sorted(server.seqs) == sorted(got)
    finally:
        conn.close()


def test_an_answer_is_decoded_into_the_request_s_own_future(server: SlowServer) -> None:
    """``decode`` runs on the answer (on the I/O thread) and its value, or its error,
    settles the request's future; the connection serves on either way, and nothing is
    left waiting for an answer."""
    server.release.set()
    conn = BrokerConnection(server.addr, SECRET, name="slow")
    conn.open()

    def doubled(header: dict[str, Any], body: Any) -> int:
        return 2 * int(header["r"])

    def refuses(header: dict[str, Any], body: Any) -> int:
        raise ValueError(f"cannot read answer {header['r']}")

    try:
        assert conn.request({"c": int(Code.HEARTBEAT), "seq": 21}, decode=doubled).result(10) == 42
        with pytest.raises(ValueError, match="cannot read answer 5"):
            conn.request({"c": int(Code.HEARTBEAT), "seq": 5}, decode=refuses).result(10)
        futures = [
            conn.request({"c": int(Code.HEARTBEAT), "seq": i}, decode=doubled) for i in range(50)
        ]
        assert [f.result(10) for f in futures] == [2 * i for i in range(50)]
        assert conn.request({"c": int(Code.HEARTBEAT), "seq": 7}).result(10)[0]["r"] == 7
        assert not conn._pending
    finally:
        conn.close()


def test_small_frames_the_socket_takes_in_part_arrive_whole_and_in_order(
    server: SlowServer,
) -> None:
    """A frame under ``SCRATCH_BYTES`` leaves as one buffer: written from the caller's
    thread while the socket has room, its rest by the loop when it takes only part of
    it, and the frames after it behind that rest."""
    server.release.set()
    conn = BrokerConnection(server.addr, SECRET, name="slow")
    conn.open()
    try:
        # 200 KiB frames faster than the server reads them: the socket's buffer fills
        bodies = [bytes([i]) * (200 << 10) for i in range(60)]
        futures = [
            conn.request({"c": int(Code.SEND), "seq": i}, [memoryview(b)])
            for i, b in enumerate(bodies)
        ]
        assert [f.result(30)[0]["r"] for f in futures] == list(range(60))
        assert server.seqs == list(range(60))
        assert server.bodies == {i: zlib.crc32(b) for i, b in enumerate(bodies)}
        assert len(bodies[0]) < frames.SCRATCH_BYTES  # what this test is about
    finally:
        conn.close()
