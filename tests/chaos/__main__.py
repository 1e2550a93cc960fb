"""`python -m tests.chaos` (what `make chaos` runs): the full chaos run; prints its JSON report, exits 1 if any
invariant broke."""

import argparse
import asyncio
import json
import sys
from pathlib import Path

from tests.chaos.harness import ChaosConfig, run_chaos


def main(argv: list[str] | None = None) -> int:
    d = ChaosConfig()
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    p.add_argument("--jobs", type=int, default=d.jobs)
    p.add_argument("--kills", type=int, default=d.kills, help="SIGKILLs of a random service")
    p.add_argument("--nats-restarts", type=int, default=d.nats_restarts)
    p.add_argument("--redis-flushes", type=int, default=d.redis_flushes)
    p.add_argument("--pauses", type=int, default=d.pauses, help="SIGSTOPs of the leading scheduler past its lease")
    p.add_argument("--rate", type=float, default=d.rate, help="submits per second")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default="chaos-out", help="directory for the services' logs")
    p.add_argument("--json", action="store_true", help="one line of JSON")
    args = p.parse_args(argv)
    cfg = ChaosConfig(
        jobs=args.jobs, kills=args.kills, nats_restarts=args.nats_restarts, redis_flushes=args.redis_flushes,
        pauses=args.pauses, rate=args.rate, seed=args.seed,
    )  # fmt: skip
    report = asyncio.run(run_chaos(cfg, Path(args.out)))
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
