"""A week of noise on the whole fleet, in virtual time, through the real health engine: how often it quarantines
a healthy GPU.

A week of 1-second samples from 10,000 GPUs is six billion samples, too many to feed one by one. But between noise
events a healthy GPU's samples carry no signal and change nothing the engine keeps except the node's last-seen
time, so each node is fed exactly the samples around its noise: the one before every event (rates are differences
between consecutive samples), the event's own samples, and the one after (which ends a streak). Each node has its
own `HealthEngine` (no rule spans nodes; the circuit breaker only ever holds quarantines back), which is ticked
as the service ticks (every 0.25 s) through every silence (agent restarts) and at the last moment before every
late sample arrives, so heartbeat loss is judged on every gap the node really has. A witness node stands for the
rest of the fleet, which goes on reporting meanwhile (the engine judges silence against the newest sample it
has read from anyone).
"""

import math
import random
from collections import defaultdict
from dataclasses import dataclass, field

from chamber.common.contracts import GpuHealthVerdict, GpuSample, HealthState, NodeTelemetry
from chamber.health.bench.fleet import GPUS_PER_NODE, THERMAL, WEEK_S, Noise
from chamber.health.core.engine import HealthEngine

TICK_S = 0.25
WITNESS = "the-rest-of-the-fleet"
WITNESS_INTERVAL_S = 1e9
"""The witness reports only when the node under test is watched in a gap; it is never due."""


@dataclass
class Event:
    gpu: int
    kind: str
    size: int = 0
    samples: int = 1


@dataclass
class WeekResult:
    gpus: int
    samples_represented: int = 0
    samples_fed: int = 0
    ticks: int = 0
    noise_events: int = 0
    restarts: int = 0
    late_samples: int = 0
    false_quarantines: int = 0
    false_suspects: int = 0
    by_rule: dict[str, int] = field(default_factory=dict)


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method (the means here are small)."""
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def simulate_week(nodes: int, noise: Noise, interval_s: float = 1.0, seed: int = 11) -> WeekResult:
    rng = random.Random(seed)
    samples = int(WEEK_S / interval_s)
    result = WeekResult(gpus=nodes * GPUS_PER_NODE, samples_represented=nodes * GPUS_PER_NODE * samples)
    for n in range(nodes):
        _node_week(f"node-{n:05d}", rng, noise, interval_s, samples=samples, out=result)
    return result


def _node_week(name: str, rng: random.Random, noise: Noise, interval: float, *, samples: int, out: WeekResult) -> None:
    events: dict[int, list[Event]] = defaultdict(list)
    for gpu in range(GPUS_PER_NODE):
        for kind, mean, size in (("sbe", noise.sbe_bursts, noise.sbe_per_burst),
                                 ("nvlink", noise.nvlink_blips, noise.nvlink_per_blip),
                                 ("pcie", noise.pcie_blips, noise.pcie_per_blip)):  # fmt: skip
            for _ in range(_poisson(rng, mean)):
                events[rng.randrange(1, samples)].append(Event(gpu, kind, rng.randint(*size)))
        for _ in range(_poisson(rng, noise.throttles)):
            length = max(1, round(rng.uniform(*noise.throttle_s) / interval))
            events[rng.randrange(1, samples)].append(Event(gpu, "throttle", samples=length))
    silences: list[tuple[int, int]] = []  # [first missing sample, first sample back)
    for _ in range(_poisson(rng, noise.restarts_per_node)):
        start = rng.randrange(1, samples)
        silences.append((start, start + max(1, math.ceil(rng.uniform(*noise.restart_silence_s) / interval))))
    late = {rng.randrange(1, samples) for _ in range(_poisson(rng, noise.late_share * samples))}
    out.noise_events += sum(len(v) for v in events.values())
    out.restarts += len(silences)
    out.late_samples += len(late)

    fed: set[int] = set()
    for k, evs in events.items():
        span = max(e.samples for e in evs)
        fed.update(range(k - 1, k + span + 1))
    for start, back in silences:
        fed.update((start - 1, back))
    fed.update(k - 1 for k in late)
    fed.update(late)
    silent = {k for start, back in silences for k in range(start, back)}

    engine = HealthEngine()
    engine.set_inventory(name, GPUS_PER_NODE, 0.0)
    engine.set_inventory(WITNESS, 1, 0.0)
    sbe, nvlink, pcie = [0] * GPUS_PER_NODE, [0] * GPUS_PER_NODE, [0] * GPUS_PER_NODE
    throttled_until = [-1] * GPUS_PER_NODE
    resumes = {back for _, back in silences}
    last_at: float | None = None
    last_k = -1
    for k in sorted(x for x in fed if 0 <= x < samples):
        for e in events.get(k, ()):
            if e.kind == "sbe":
                sbe[e.gpu] += e.size
            elif e.kind == "nvlink":
                nvlink[e.gpu] += e.size
            elif e.kind == "pcie":
                pcie[e.gpu] += e.size
            else:
                throttled_until[e.gpu] = max(throttled_until[e.gpu], k + e.samples)
        if k in silent:
            continue
        at = k * interval
        if last_at is not None and k in resumes:
            t = last_at + TICK_S  # the service ticks through the silence
            while t < at:
                _tick(engine, t, out)
                t += TICK_S
        elif last_at is not None and k in late and last_k == k - 1:
            _tick(engine, at + noise.late_s - 1e-6, out)  # just before the late sample arrives
        gpus = [
            GpuSample(index=i, uuid=f"GPU-{name}-{i}", gpu_util=85.0, power_w=520.0, power_limit_w=700.0,
                      ecc_dbe_volatile=0, ecc_sbe_volatile=sbe[i], clock_event_reasons=THERMAL if k < throttled_until[i]
                      else 0, remapped_rows_pending=False, remapped_rows_failure=False, nvlink_crc_errors=nvlink[i],
                      nvlink_replay_errors=0, nvlink_recovery_errors=0, pcie_replay_count=pcie[i], recovery_action=0)
            for i in range(GPUS_PER_NODE)
        ]  # fmt: skip
        batch = NodeTelemetry(node=name, sampled_at=at, interval_s=interval, gpus=gpus, source="nvml")
        _count(engine.observe(batch, at), out)
        _count(engine.tick(at), out)
        out.samples_fed += GPUS_PER_NODE
        last_at, last_k = at, k


def _tick(engine: HealthEngine, at: float, out: WeekResult) -> None:
    """A service tick at `at`, the rest of the fleet having reported until then."""
    witness = NodeTelemetry(node=WITNESS, sampled_at=at, interval_s=WITNESS_INTERVAL_S,
                            gpus=[GpuSample(index=0, uuid="GPU-witness")])  # fmt: skip
    _count(engine.observe(witness, at), out)
    _count(engine.tick(at), out)
    out.ticks += 1


def _count(verdicts: list[GpuHealthVerdict], out: WeekResult) -> None:
    for v in verdicts:
        if v.state == HealthState.QUARANTINED:
            out.false_quarantines += 1
            out.by_rule[v.rule] = out.by_rule.get(v.rule, 0) + 1
        elif v.state == HealthState.SUSPECT:
            out.false_suspects += 1
