"""Seeds of the long fault runner (``python3 -m benchmarks.faults``), each a whole run
of its schedule: minutes, so marked ``long`` and left out of the default run (select
with ``-m long``). Each seed's run must hold every promise of its mode."""

from __future__ import annotations

import pytest
from harness import can_admin_network

from benchmarks.faults.runner import Run
from benchmarks.faults.schedule import draw

SEEDS: list[tuple[int, float]] = [(0, 1.0), (1, 1.0), (2, 1.0), (3, 1.0), (0, 2.0), (6, 3.5)]
"""(seed, minutes), with ``--nodes 3``: one minute of each mode (seeds 0-3: ASYNC_FLUSH,
SYNC_FLUSH, SYNC_MASTER, Raft), and every schedule that found a violation: seed 0's
two minutes kill a broker under load (its group's committed offsets read back lower
after its restart when a broker kept them only in memory between saves); seed 6's
first three and a half minutes end with a SYNC_MASTER master's power loss, after
which it took writes again at queue offsets it had acknowledged (messages lost)."""


@pytest.mark.long
@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("seed", "minutes"), SEEDS)
def test_seed_holds_every_promise_of_its_mode(seed: int, minutes: float) -> None:
    if not can_admin_network():
        pytest.skip("needs root with CAP_NET_ADMIN to make network namespaces")
    result = Run(draw(seed, minutes, 3)).execute()
    print()
    print(result.HEADER)
    print(result.row())
    assert not result.violations, result.to_json()
