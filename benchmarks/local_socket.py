"""What a data-path hop costs over loopback TCP and over a Unix socket, on this machine.

    python benchmarks/local_socket.py [--calls 3000] [--gap-ms 1] [--rounds 3]

Why a client on a broker's node takes the broker's Unix socket
(``actors/protocol/frame_server.py``): one process sends a request of a few hundred
bytes, another (woken by epoll, as a broker's loop is) answers ~60 bytes, and the
sender waits for the answer, then sleeps ``--gap-ms`` (at 1,000 msg/s every hop
comes cold, a millisecond after the last). It prints, per kind of socket, the sender's
CPU per send (``time.thread_time``: the kernel's work for the segment, the receiver's
wake-up included) and the round trip's p50/p99, medians of ``--rounds`` that
alternate the two, and the ratios Unix / TCP. Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import statistics
import time

KINDS = ("tcp", "unix")


def _pair(kind: str) -> tuple[socket.socket, socket.socket]:
    if kind == "unix":
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
    for s in (client, peer):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client, peer


def _answer(peer: socket.socket) -> None:
    """The answering process: each request read when epoll says so, answered."""
    poller = select.epoll()
    poller.register(peer.fileno(), select.EPOLLIN)
    while True:
        poller.poll()
        if not peer.recv(65536):
            os._exit(0)
        peer.sendall(b"a" * 60)


def _round(kind: str, calls: int, gap_s: float) -> tuple[float, float, float]:
    """(CPU us a send, round trip p50 us, p99 us)."""
    client, peer = _pair(kind)
    pid = os.fork()
    if pid == 0:
        client.close()
        _answer(peer)
    peer.close()
    poller = select.epoll()
    poller.register(client.fileno(), select.EPOLLIN)
    request, cpu, trips = b"r" * 250, 0, []
    for _ in range(calls):
        started = time.perf_counter()
        t = time.thread_time_ns()
        client.sendall(request)
        cpu += time.thread_time_ns() - t
        poller.poll()
        client.recv(65536)
        trips.append(time.perf_counter() - started)
        time.sleep(gap_s)
    client.close()
    os.waitpid(pid, 0)
    trips.sort()
    return cpu / calls / 1e3, trips[len(trips) // 2] * 1e6, trips[int(len(trips) * 0.99)] * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--gap-ms", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in KINDS}
    for r in range(args.rounds):
        for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
            got[kind].append(_round(kind, args.calls, args.gap_ms / 1000))
    med = {k: [statistics.median(v[i] for v in got[k]) for i in range(3)] for k in KINDS}
    print(f"a {args.gap_ms:g} ms gap between hops, medians of {args.rounds} rounds:")
    print(f"  {'socket':8} {'send CPU us':>12} {'trip p50 us':>12} {'trip p99 us':>12}")
    for k in KINDS:
        cpu, p50, p99 = med[k]
        print(f"  {k:8} {cpu:12.1f} {p50:12.0f} {p99:12.0f}")
    ratios = [u / t for u, t in zip(med["unix"], med["tcp"])]
    print("  unix/tcp " + " ".join(f"{x:11.2f}x" for x in ratios))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
