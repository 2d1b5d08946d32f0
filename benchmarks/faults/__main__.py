"""``python3 -m benchmarks.faults``: see ``--help``."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from harness import can_admin_network, missing_tools

from .runner import Result, Run
from .schedule import MODES, draw

log = logging.getLogger("raymq.benchmarks.faults")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python3 -m benchmarks.faults",
        description="Jepsen-style fault runs: Ray nodes in network namespaces, faults "
        "from a seed, every acknowledged message checked.",
    )
    ap.add_argument("--seeds", type=int, default=20, help="how many seeds (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    ap.add_argument("--only-seed", action="store_true", help="run --seed alone")
    ap.add_argument("--minutes", type=float, default=5.0, help="faults per seed (default 5)")
    ap.add_argument(
        "--nodes", type=int, default=3, help="broker nodes (default 3; a Raft group takes "
        "the largest odd number of them); 2 more run the head and the client",
    )  # fmt: skip
    ap.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"modes to cycle through (default {','.join(MODES)})",
    )
    ap.add_argument("--plan", action="store_true", help="print the seeds' schedules and exit")
    ap.add_argument("--out", type=Path, help="write each seed's result as JSON lines here")
    ap.add_argument("--keep", action="store_true", help="keep the lab's directory (stores, logs)")
    args = ap.parse_args(argv)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"--modes: unknown {bad}; known {list(MODES)}")
    if args.seeds < 1 or args.minutes <= 0 or args.nodes < 3:
        ap.error("--seeds >= 1, --minutes > 0, --nodes >= 3")
    args.modes = modes
    return args


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # the lab's `with` takes everything down


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    seeds = [args.seed] if args.only_seed else list(range(args.seed, args.seed + args.seeds))
    plans = [draw(s, args.minutes, args.nodes, args.modes) for s in seeds]
    if args.plan:
        for plan in plans:
            print(f"seed {plan.seed}: {plan.mode}, idempotent={plan.idempotent}")
            for fault in plan.faults:
                print(f"  {fault.describe()}")
        return 0
    if not can_admin_network():
        print("needs root with CAP_NET_ADMIN (it makes network namespaces)", file=sys.stderr)
        return 2
    if missing := missing_tools():
        print(f"missing {missing}: apt-get install iproute2 nftables", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    results: list[Result] = []
    began = time.monotonic()
    for plan in plans:
        t = time.monotonic()
        result = Run(plan, keep=args.keep).execute()
        results.append(result)
        print(Result.HEADER if len(results) == 1 else "", flush=True)
        print(result.row(), flush=True)
        for ev in result.events:
            print(f"       {json.dumps(ev)}", flush=True)
        if result.failures:
            print(f"       failed ops: {json.dumps(result.failures)}", flush=True)
        print(f"       seed {plan.seed}: {time.monotonic() - t:.0f} s", flush=True)
        if args.out:
            with args.out.open("a") as out:
                out.write(json.dumps(result.to_json()) + "\n")
    print()
    print("summary")
    print(Result.HEADER)
    for result in results:
        print(result.row())
    by_mode: dict[str, list[Result]] = {}
    for result in results:
        by_mode.setdefault(result.plan.mode, []).append(result)
    print()
    print(f"{'mode':<11} {'seeds':>5} {'acked':>8} {'lost':>5} {'allowed':>7} {'dup (idem)':>10} "
          f"{'split':>5} {'roles':>5} {'torn':>4} {'grpc':>6} {'txns':>5} {'unavail s':>9} "
          f"{'recover s max':>13}")  # fmt: skip
    for mode, rs in by_mode.items():
        print(
            f"{mode:<11} {len(rs):>5} {sum(r.acknowledged for r in rs):>8} "
            f"{sum(len(r.lost) for r in rs):>5} {sum(len(r.allowed_loss) for r in rs):>7} "
            f"{sum(len(r.duplicated) for r in rs if r.plan.idempotent):>10} "
            f"{sum(len(r.split_brain) for r in rs):>5} {sum(len(r.split_roles) for r in rs):>5} "
            f"{sum(len(r.torn) for r in rs):>4} {sum(r.grpc_acked for r in rs):>6} "
            f"{sum(r.txns_committed for r in rs):>5} "
            f"{sum(r.unavailable_s for r in rs):>9.1f} {max(r.recover_s for r in rs):>13.1f}"
        )
    bad = [r for r in results if r.violations]
    print(f"\n{len(results)} seeds in {time.monotonic() - began:.0f} s; "
          f"{len(bad)} with violations: {[r.plan.seed for r in bad]}")  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
