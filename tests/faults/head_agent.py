"""Answers a fault lab's questions about its Ray cluster, from inside the head's network
namespace, straight from the GCS (``python3 head_agent.py <gcs address>``).

The lab asked each question with a new Ray driver (``ray.init`` and ``ray.nodes()``),
which costs a driver's start: one to five seconds on two busy cores, and a lab waiting
for its nodes asked every half second. One process asking the GCS's own client answers
in milliseconds. Reads one question per line on stdin, writes one JSON line per answer:

- ``nodes``: the addresses of the nodes the GCS counts alive;
- ``actors``: ``[namespace, name]`` of every named actor not dead.

An error is answered as ``{"error": "..."}``; the process lives until stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys

from ray._raylet import GcsClient  # type: ignore[attr-defined]

ALIVE = 0  # GcsNodeInfo.GcsNodeState.ALIVE
DEAD = 4  # ActorTableData.ActorState.DEAD
TIMEOUT_S = 10


def nodes(gcs: GcsClient) -> list[str]:
    infos = gcs.get_all_node_info(timeout=TIMEOUT_S)
    return [n.node_manager_address for n in infos.values() if n.state == ALIVE]


def actors(gcs: GcsClient) -> list[list[str]]:
    async def ask() -> dict[object, object]:
        return await gcs.async_get_all_actor_info(timeout=TIMEOUT_S)  # type: ignore[no-any-return]

    infos: dict[object, object] = asyncio.run(ask())
    return [[a.ray_namespace, a.name] for a in infos.values() if a.name and a.state != DEAD]  # type: ignore[attr-defined]


def main() -> None:
    gcs = GcsClient(address=sys.argv[1])
    asks = {"nodes": nodes, "actors": actors}
    for line in sys.stdin:
        ask = asks.get(line.strip())
        try:
            answer: object = ask(gcs) if ask else {"error": f"no question {line.strip()!r}"}
        except Exception as exc:  # noqa: BLE001 - answered, the lab decides
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
