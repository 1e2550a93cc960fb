"""`chamber bench health`: every rule family's fault in noisy telemetry, on the real services, and a week of noise.

- per family (`xid`, `dbe`, `ecc_rate`, `row_remap`, `nvlink_rate`, `pcie_rate`, `thermal`, `heartbeat`,
  `gpu_drop`): `fault_to_quarantine_p99_ms`, from the moment the rule's own window closes in the fault's own
  samples (the sample that completes it; for a silent node, its last sample plus the silence limit) to the
  verdict, and `fault_to_job_stopped_p99_ms`, from the same moment to the executor's report that the job on the
  GPU stopped (`live`);
- `false_quarantines_live`: quarantines of anything that had no fault, during the live run (noise scaled up so
  that a short run sees plenty of it); `false_quarantines_week`: the same over a simulated week of noise on the
  whole fleet, in virtual time through the real health engine (`week`).
"""

import asyncio
import statistics
import time
import uuid

from chamber.common.cleanup import delete_namespace
from chamber.common.contracts import HealthState
from chamber.common.settings import Settings
from chamber.health.bench.fleet import FAMILIES, GPUS_PER_NODE, Noise
from chamber.health.bench.live import job_of, quarantined_at, reference_of, run_live
from chamber.health.bench.week import simulate_week
from chamber.health.core.engine import HealthConfig

LIVE_NOISE = 200.0
"""The live run's noise is this many times a week's rate (a three-minute run sees ten hours' worth)."""


def _p(values: list[float], q: float) -> float:
    if not values:
        return -1.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def run(
    *, gpus: int = 10_000, per_family: int = 3, quiet_s: float = 20.0, interval_s: float = 1.0, week: bool = True
) -> dict[str, object]:
    from chamber.cli.infra import resolve

    nodes = gpus // GPUS_PER_NODE
    noise = Noise()
    infra = resolve()
    try:
        settings = Settings.from_env(nats_url=infra.nats_url, redis_url=infra.redis_url,
                                     namespace=f"bench{uuid.uuid4().hex[:8]}", telemetry_interval_s=interval_s,
                                     schedule_interval_s=1.0, metrics_port=0)  # fmt: skip

        async def go() -> dict[str, object]:
            try:
                return await _live(settings, nodes, noise, quiet_s, per_family)
            finally:
                await delete_namespace(settings.nats_url, settings.redis_url, settings.namespace)

        result = asyncio.run(go())
    finally:
        infra.stop()
    if week:
        started = time.perf_counter()
        w = simulate_week(nodes, noise, interval_s)
        result.update({
            "false_quarantines_week": w.false_quarantines, "week_quarantines_by_rule": w.by_rule,
            "week_suspects": w.false_suspects, "week_noise_events": w.noise_events, "week_agent_restarts": w.restarts,
            "week_late_samples": w.late_samples, "week_gpu_samples": w.samples_represented,
            "week_gpu_samples_fed": w.samples_fed, "week_s": round(time.perf_counter() - started, 1),
        })  # fmt: skip
    return result


async def _live(settings: Settings, nodes: int, noise: Noise, quiet_s: float, per_family: int) -> dict[str, object]:
    faults, seen, owners, _ = await run_live(
        settings, nodes=nodes, noise=noise.scaled(LIVE_NOISE), quiet_s=quiet_s, per_family=per_family
    )
    config = HealthConfig()
    families: dict[str, dict[str, float]] = {}
    for family in FAMILIES:
        to_quarantine, to_stop, from_onset = [], [], []
        mine = [f for f in faults if f.family == family]
        for fault in mine:
            ref = reference_of(fault, config, settings.telemetry_interval_s)
            got = quarantined_at(fault, seen)
            if ref is None or got is None:
                continue
            to_quarantine.append((got - ref) * 1000)
            from_onset.append((got - fault.onset) * 1000)
            job = job_of(fault, owners)
            if job is not None and job in seen.stopped:
                to_stop.append((seen.stopped[job] - ref) * 1000)
        families[family] = {
            "faults": len(mine), "quarantined": len(to_quarantine), "jobs_stopped": len(to_stop),
            "fault_to_quarantine_p50_ms": _p(to_quarantine, 0.5), "fault_to_quarantine_p99_ms": _p(to_quarantine, 0.99),
            "fault_to_job_stopped_p50_ms": _p(to_stop, 0.5), "fault_to_job_stopped_p99_ms": _p(to_stop, 0.99),
            "onset_to_quarantine_p99_ms": _p(from_onset, 0.99),
        }  # fmt: skip
    faulted = {(f.node, None if f.node_scoped else f.gpu) for f in faults}
    false_live = [v for _, v in seen.verdicts
                  if v.state == HealthState.QUARANTINED and (v.node, v.gpu_index) not in faulted]  # fmt: skip
    every_q = [x["fault_to_quarantine_p99_ms"] for x in families.values()]
    every_s = [x["fault_to_job_stopped_p99_ms"] for x in families.values()]
    return {
        "gpus": nodes * GPUS_PER_NODE,
        "interval_s": settings.telemetry_interval_s,
        "live_noise_x_week_rate": LIVE_NOISE,
        "faults": len(faults),
        "fault_to_quarantine_p99_ms": max(every_q),
        "fault_to_job_stopped_p99_ms": max(every_s),
        "false_quarantines_live": len(false_live),
        "false_quarantine_rules_live": sorted({v.rule for v in false_live}),
        "suspect_verdicts_live": sum(v.state == HealthState.SUSPECT for _, v in seen.verdicts),
        "telemetry_round_p99_s": _p(seen.rounds_s, 0.99) if seen.rounds_s else -1,
        "telemetry_round_max_s": round(max(seen.rounds_s), 2) if seen.rounds_s else -1,
        "families": families,
        "median_quarantine_ms": round(statistics.median(every_q), 1) if every_q else -1,
    }
