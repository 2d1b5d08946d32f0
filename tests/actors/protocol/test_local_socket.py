"""A frame server's Unix socket: clients on its node take it instead of the TCP port.
Real servers on real sockets (TCP and Unix), the client's real connection; no Ray.

The socket is made only in a directory of the user's own that no one else may enter,
is the user's alone, goes when the server stops (or, its process gone, when the next
server starts), and a client that cannot reach it takes the port."""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.protocol.connection import BrokerConnection
from actors.protocol.frame_server import FrameServer
from actors.protocol.requests import Dispatch


class Served:
    """A frame server (no requests of its own: the handshake is what is served) on a
    loop of its own thread."""

    def __init__(self, local_socket: bool = True) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = FrameServer("test", Dispatch(object(), []), "127.0.0.1", 0, 1 << 20, 16)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.server.start("127.0.0.1", local_socket=local_socket))

    def call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)  # type: ignore[arg-type]

    def stats(self) -> dict[str, int]:
        """The server's counts, read on its loop: after the step that served a handshake
        (the client hears the server's proof from inside that step)."""

        async def read() -> dict[str, int]:
            return dict(self.server.stats)

        return self.call(read())  # type: ignore[return-value]

    def connect(self, unix: str | None) -> BrokerConnection:
        conn = BrokerConnection(self.server.addr, self.server.secret, name="test", unix=unix)
        conn.open()
        return conn

    def stop(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The temporary directory servers make their sockets' directory in."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield tmp_path / f"raymq-{os.getuid()}"


def test_a_client_on_the_node_takes_the_private_socket_which_goes_when_stopped(
    tmp_dir: Path,
) -> None:
    served = Served()
    path = served.server.unix_path
    try:
        assert path is not None and Path(path).parent == tmp_dir
        assert stat.S_ISSOCK(os.stat(path).st_mode) and os.stat(path).st_mode & 0o777 == 0o600
        assert os.stat(tmp_dir).st_mode & 0o777 == 0o700
        conn = served.connect(path)
        assert served.stats()["local_connections"] == 1
        assert served.stats()["connections"] == 1
        conn.close()
    finally:
        served.stop()
    assert not os.path.exists(path)


def test_a_socket_left_by_a_process_that_is_gone_is_removed_and_a_live_ones_kept(
    tmp_dir: Path,
) -> None:
    tmp_dir.mkdir(mode=0o700)
    gone = tmp_dir / "999999999-0123456789ab.sock"  # no such process
    live = tmp_dir / f"{os.getpid()}-0123456789ab.sock"
    other = tmp_dir / "notes.txt"  # not a server's: left alone
    for p in (gone, live, other):
        p.write_bytes(b"")
    served = Served()
    try:
        assert not gone.exists() and live.exists() and other.exists()
    finally:
        served.stop()


def test_no_socket_in_a_directory_others_may_enter_and_the_port_still_serves(
    tmp_dir: Path,
) -> None:
    tmp_dir.mkdir(mode=0o755)
    os.chmod(tmp_dir, 0o755)  # whatever the umask made of it
    served = Served()
    try:
        assert served.server.unix_path is None
        assert list(tmp_dir.iterdir()) == []
        served.connect(None).close()
        assert served.stats()["connections"] == 1
    finally:
        served.stop()


def test_a_client_whose_socket_is_gone_takes_the_port(tmp_dir: Path) -> None:
    served = Served(local_socket=False)
    try:
        assert served.server.unix_path is None
        conn = served.connect(str(tmp_dir / "1-gone.sock"))
        assert served.stats()["connections"] == 1
        assert served.stats()["local_connections"] == 0
        conn.close()
    finally:
        served.stop()
