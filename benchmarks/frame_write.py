"""What writing one frame costs the data path's Python (``actors.protocol.frames``).

    python benchmarks/frame_write.py [--rounds 5]

Times ``frames.write_frame`` to a transport that only counts bytes (the socket's own
cost left out) for the frames a single message makes on a broker: an answer without
a body (a send's acknowledgement), one part, two parts (a pull answer). The baseline,
timed in the same rounds, is the plain way: ``msgpack.packb`` of the header, then
the parts joined. Prints the medians of the rounds and the ratio to the baseline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import timeit
from typing import Any

import msgpack

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from actors.protocol import frames  # noqa: E402

_PREFIX = struct.Struct(">II")


class _Counting:
    def __init__(self) -> None:
        self.n = 0

    def write(self, data: Any) -> None:
        self.n += len(data)


def _plain(transport: Any, header: dict[str, Any], body: list[Any]) -> None:
    head = msgpack.packb(dict(header))
    size = sum(memoryview(p).nbytes for p in body)
    transport.write(b"".join([_PREFIX.pack(4 + len(head) + size, len(head)), head, *body]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--number", type=int, default=20_000)
    args = parser.parse_args()
    out = _Counting()
    header = {"c": 0, "q": 123456, "n": 5, "o": 77, "f": 1}
    cases = {
        "no body (an acknowledgement)": [],
        "one part": [b"x" * 180],
        "two parts (a pull answer)": [b"y" * 40, memoryview(b"z" * 300)],
    }
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):  # alternated: a drift of the machine hits both alike
        for case, body in cases.items():
            for name, fn in (("plain", _plain), ("write_frame", frames.write_frame)):
                t = timeit.timeit(
                    lambda fn=fn, body=body: fn(out, header, body), number=args.number
                )
                times.setdefault((case, name), []).append(t / args.number * 1e6)
    print(f"us per frame, medians of {args.rounds} rounds (load {os.getloadavg()[0]:.1f}):")
    for case in cases:
        plain = statistics.median(times[(case, "plain")])
        ours = statistics.median(times[(case, "write_frame")])
        print(f"  {case:30s} plain {plain:6.2f}  write_frame {ours:6.2f}  ratio {ours / plain:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
