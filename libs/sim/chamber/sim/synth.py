"""What a scenario adds to its trace: users' runtime estimates, copies of jobs (a burst of arrivals, more large
gangs) and interactive notebook sessions.

Everything is drawn deterministically: estimates and copies from a hash of (seed, job id), so that every policy
of a `--compare` run, and every run of the same scenario, sees the same workload; notebooks from one seeded
generator over the trace's span.
"""

import hashlib
import math
import random
from statistics import NormalDist
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chamber.sim.scenario import EstimateSpec, NotebookSpec, ReplicateRule, TeamSpec, TraceJob

ROUND_LIMITS_S: tuple[float, ...] = tuple(
    m * 60.0 for m in (5, 15, 30, 60, 120, 180, 240, 360, 480, 720, 1440, 2880, 4320, 7200, 10080, 20160, 43200)
)
"""Limits people type (5 min ... 30 days): a user's estimate is rounded up to the next one (then to whole days)."""
MIN_ESTIMATE_S = 1e-3
"""`max_runtime_s` must be positive: the estimate of a job that runs for no time at all."""
_NORMAL = NormalDist()


def uniform(seed: int, salt: str, key: str) -> float:
    """A number in (0, 1) fixed by (seed, salt, key): the same job gets the same draw under every policy."""
    digest = hashlib.blake2b(f"{seed}/{salt}/{key}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / 2**64


def estimate(spec: "EstimateSpec", job_id: str, duration_s: float, factor: float | None = None) -> float | None:
    """The `max_runtime_s` a user gives for a job that truly runs `duration_s`; None when none is given.
    `factor` (the older `defaults.max_runtime_factor`) applies when the model is `none`."""
    if spec.model == "none":
        return None if factor is None else max(MIN_ESTIMATE_S, duration_s * factor)
    if spec.model == "exact":
        return max(MIN_ESTIMATE_S, duration_s)
    if spec.missing and uniform(spec.seed, "missing", job_id) < spec.missing:
        return None
    z = _NORMAL.inv_cdf(uniform(spec.seed, "factor", job_id))
    value = max(MIN_ESTIMATE_S, duration_s * spec.median_factor * math.exp(spec.sigma * z))
    return round_up(value) if spec.round_up else value


def round_up(seconds: float) -> float:
    for limit in ROUND_LIMITS_S:
        if seconds <= limit:
            return limit
    return math.ceil(seconds / 86400.0) * 86400.0


def replicate(jobs: "list[TraceJob]", rules: "list[ReplicateRule]") -> "list[TraceJob]":
    """The copies the rules add (the originals stay): copy k of job j is `j-r<rule>.<k>`, submitted within
    `jitter_s` of the original and inside the rule's window."""
    from dataclasses import replace

    added: list[TraceJob] = []
    for r, rule in enumerate(rules):
        high = math.inf if rule.to_s is None else rule.to_s
        for job in jobs:
            if job.kind != "trace" or job.gpus < rule.min_gpus or not rule.from_s <= job.submit_s < high:
                continue
            for k in range(1, rule.copies):
                offset = (2 * uniform(rule.seed, f"copy{r}.{k}", job.id) - 1) * rule.jitter_s
                submit = min(max(job.submit_s + offset, rule.from_s, 0.0), math.nextafter(high, -math.inf))
                added.append(replace(job, id=f"{job.id}-r{r}.{k}", submit_s=submit, kind="copy"))
    return added


def notebooks(jobs: "list[TraceJob]", teams: "list[TeamSpec]", spec: "NotebookSpec") -> "list[TraceJob]":
    """Interactive sessions over the trace's span (first to last submission), `nb-<n>`."""
    from chamber.sim.scenario import TraceJob

    if not jobs:
        return []
    start = min(j.submit_s for j in jobs)
    end = max(j.submit_s for j in jobs)
    weights = {t.name: float(sum(t.quota.values())) for t in teams if sum(t.quota.values()) > 0}
    if not weights:
        weights = dict.fromkeys(sorted({j.team for j in jobs}), 1.0)
    names, w = list(weights), list(weights.values())
    rng = random.Random(spec.seed)
    rate = spec.per_day / 86400.0
    added: list[TraceJob] = []
    t = start
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            return added
        length = min(spec.max_s, spec.median_s * math.exp(spec.sigma * rng.gauss(0.0, 1.0)))
        added.append(TraceJob(
            id=f"nb-{len(added):05d}", submit_s=t, duration_s=length, gpus=rng.choice(spec.gpus),
            team=rng.choices(names, w)[0], priority=spec.priority, preemptible=spec.preemptible, kind="notebook",
        ))  # fmt: skip
