"""The long fault runner: ``python3 -m benchmarks.faults --seeds 20 --minutes 5``.

Per seed, a schedule of faults drawn from the seed (:mod:`.schedule`) is injected into
real Ray nodes in network namespaces (``tests/faults/harness.py``) while the workload of
``tests/faults/workload.py`` sends through the public API; after healing and a quiet
period every queue is read back and checked (:mod:`.runner`). It prints a Jepsen-style
table per seed and a summary, and exits 1 on any violation of a mode's promise.
"""

import sys
from pathlib import Path

_FAULTS = Path(__file__).resolve().parents[2] / "tests" / "faults"
if str(_FAULTS) not in sys.path:  # the lab, the workload and the checker the tests use
    sys.path.insert(0, str(_FAULTS))
