"""A short chaos run in every test run: 300 jobs on 16 x 8 simulated GPUs through `chamber up`, while four
services are SIGKILLed, NATS is restarted, Redis is flushed and the leading scheduler is twice frozen past its
lease (a standby takes over); the checker's invariants must all hold.

`make chaos` runs the full one (2,000 jobs, 50 kills, 3 NATS restarts, 3 Redis flushes, 8 freezes of the leader).
"""

import json
from pathlib import Path

import pytest

from tests.chaos.harness import ChaosConfig, run_chaos

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SHORT = ChaosConfig(jobs=300, kills=4, nats_restarts=1, redis_flushes=1, pauses=2, stall_s=20.0, seed=3)


async def test_a_short_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    report = await run_chaos(SHORT, tmp_path)
    print(json.dumps(report, indent=1))
    broken = {name: inv for name, inv in report["invariants"].items() if not inv["ok"]}
    assert report["all_ended_in_time"], json.dumps(broken, indent=1)
    assert not broken, json.dumps(broken, indent=1)
    assert report["chamber_up_exit_code"] == 0
    assert report["ok"]
