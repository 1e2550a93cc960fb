"""Scenario files (YAML) and traces (CSV, or gzip-compressed CSV), validated with clear errors."""

import csv
import gzip
import math
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated, Any, Literal

import msgspec
import yaml

from chamber.common.priorities import DEFAULT_CLASSES


class ScenarioError(ValueError):
    """A scenario or trace that cannot be simulated; the message says where."""


class PoolSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    gpu_model: str = "GPU"
    nodes: Annotated[int, msgspec.Meta(ge=1)]
    gpus_per_node: Annotated[int, msgspec.Meta(ge=1, le=64)] = 8
    nodes_per_rack: Annotated[int, msgspec.Meta(ge=1)] = 16
    cost_per_gpu_hour: Annotated[float, msgspec.Meta(ge=0)] = 0.0


class FleetSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pools: list[PoolSpec]


class TeamSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    cohort: str = "default"
    quota: dict[str, Annotated[int, msgspec.Meta(ge=0)]] = msgspec.field(default_factory=dict)
    borrowing_limit: Annotated[int, msgspec.Meta(ge=0)] | None = None
    lending_limit: Annotated[int, msgspec.Meta(ge=0)] | None = None
    weight: Annotated[float, msgspec.Meta(gt=0)] = 1.0


class Defaults(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    priority: str = "train"
    preemptible: bool = True
    checkpoint_interval_s: Annotated[float, msgspec.Meta(gt=0)] | None = 1800.0
    checkpoint_grace_s: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    max_runtime_factor: Annotated[float, msgspec.Meta(gt=0)] | None = None
    """When set, users give max_runtime_s = duration x this (an estimate for backfill); never the true duration."""


class EstimateSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What users say a job will run (`max_runtime_s`): an estimate the scheduler may use (backfill, ordering);
    the simulator never stops a job when it runs past it.

    - `none`: nobody gives one (unless `defaults.max_runtime_factor` is set: duration x that factor);
    - `exact`: the true duration (an oracle, for comparison only: no user knows it);
    - `user`: duration x a factor drawn from a lognormal (median `median_factor`, log-sd `sigma`): users
      overestimate, some underestimate; rounded up to a limit people type (`round_up`); a `missing` fraction
      gives none. Drawn from a hash of (`seed`, job id), so every policy sees the same estimates.
    """

    model: Literal["none", "exact", "user"] = "none"
    missing: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0
    median_factor: Annotated[float, msgspec.Meta(gt=0)] = 3.0
    sigma: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    round_up: bool = True
    seed: int = 1


class ReplicateRule(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Adds `copies - 1` copies of every trace job that matches (submitted in [from_s, to_s) and at least
    `min_gpus` wide), each submitted up to `jitter_s` away from the original (kept inside the rule's window):
    a burst of arrivals (a deadline week), or more of some kind of job. Deterministic per `seed` and job id."""

    copies: Annotated[int, msgspec.Meta(ge=1, le=100)]
    from_s: float = 0.0
    to_s: float | None = None
    """Times after the window start (`workload.start_s`), like the jobs' submit times."""
    min_gpus: Annotated[int, msgspec.Meta(ge=1)] = 1
    jitter_s: Annotated[float, msgspec.Meta(ge=0)] = 3600.0
    seed: int = 1


class NotebookSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Synthetic interactive sessions that hold GPUs mostly idle: Poisson arrivals over the trace's span at
    `per_day`, teams drawn in proportion to their guarantee, `gpus` drawn from the list, session lengths
    lognormal (median `median_s`, log-sd `sigma`, at most `max_s`), never preempted by default."""

    per_day: Annotated[float, msgspec.Meta(gt=0, le=100_000)]
    gpus: list[Annotated[int, msgspec.Meta(ge=1)]] = msgspec.field(default_factory=lambda: [1, 1, 2, 4])
    median_s: Annotated[float, msgspec.Meta(gt=0)] = 6 * 3600.0
    sigma: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    max_s: Annotated[float, msgspec.Meta(gt=0)] = 7 * 86400.0
    priority: str = "inference"
    preemptible: bool = False
    seed: int = 1


class WorkloadSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    trace: str
    """A CSV file, or a gzip-compressed one (`.csv.gz`), relative to the scenario file."""
    start_s: float = 0.0
    end_s: float | None = None
    defaults: Defaults = msgspec.field(default_factory=Defaults)
    limit: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """At most this many trace jobs (the first ones in the window); synthetic additions scale with them."""
    min_gpus: Annotated[int, msgspec.Meta(ge=1)] = 1
    """Keep only trace jobs at least this wide."""
    replicate: list[ReplicateRule] = msgspec.field(default_factory=list)
    notebooks: NotebookSpec | None = None
    estimates: EstimateSpec = msgspec.field(default_factory=EstimateSpec)


class FaultSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: Literal["none", "llama3"] = "none"
    rate_multiplier: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    seed: int = 1
    health: bool = True
    """Health checks on: a faulty GPU is quarantined at once. Off: it keeps failing the jobs placed on it until a
    manual repair (`manual_repair_s`)."""
    manual_repair_s: Annotated[float, msgspec.Meta(gt=0)] = 24 * 3600.0


class Scenario(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    fleet: FleetSpec
    teams: list[TeamSpec] = msgspec.field(default_factory=list)
    workload: WorkloadSpec
    faults: FaultSpec = msgspec.field(default_factory=FaultSpec)
    cycle_interval_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    """Scheduling cycles run at most this often (simulated seconds); arrivals are decided at once."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    submit_s: float
    duration_s: float
    gpus: int
    team: str
    priority: str
    preemptible: bool
    kind: str = "trace"
    """`trace`, `copy` (added by a replicate rule) or `notebook` (a synthetic interactive session)."""


def load(path: str | Path, overrides: list[str] | None = None) -> tuple[Scenario, Path]:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise ScenarioError(f"cannot read scenario {p}: {exc}") from exc
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ScenarioError(f"--set {item!r}: use key.path=value")
        try:
            _set(raw, key.split("."), yaml.safe_load(value))
        except yaml.YAMLError as exc:
            raise ScenarioError(f"--set {item!r}: the value is not YAML: {exc}") from exc
        except (AttributeError, TypeError) as exc:
            raise ScenarioError(f"--set {item!r}: scenario {p} has no mapping at {key!r}") from exc
    try:
        return msgspec.convert(raw, Scenario), p.parent
    except msgspec.ValidationError as exc:
        raise ScenarioError(f"scenario {p}: {exc}") from exc


def _set(doc: Any, keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        doc = doc.setdefault(key, {})
    doc[keys[-1]] = value


def read_trace(scenario: Scenario, base: Path) -> list[TraceJob]:
    w = scenario.workload
    path = (base / w.trace).resolve()
    jobs: list[TraceJob] = []
    d = w.defaults
    if d.priority not in DEFAULT_CLASSES:
        raise ScenarioError(f"unknown default priority {d.priority!r}")
    try:
        with _open_text(path) as f:
            reader = csv.DictReader(f)
            missing = {"job_id", "submit_time_s", "duration_s", "num_gpus", "user_or_team"} - set(
                reader.fieldnames or []
            )
            if missing:
                raise ScenarioError(f"trace {path}: missing columns {sorted(missing)}")
            for n, row in enumerate(reader, start=2):
                try:
                    submit = float(row["submit_time_s"])
                    if submit < w.start_s or (w.end_s is not None and submit >= w.end_s):
                        continue
                    priority = row.get("priority") or d.priority
                    if priority.lstrip("-").isdigit():
                        priority = _class_for(int(priority))
                    preemptible = row.get("preemptible")
                    job = TraceJob(
                        id=row["job_id"], submit_s=submit - w.start_s, duration_s=float(row["duration_s"]),
                        gpus=int(row["num_gpus"]), team=row["user_or_team"], priority=priority,
                        preemptible=d.preemptible if preemptible in (None, "") else preemptible.lower() == "true",
                    )  # fmt: skip
                except (KeyError, ValueError, TypeError, AttributeError) as exc:
                    raise ScenarioError(f"trace {path}, line {n}: {exc or type(exc).__name__}") from exc
                problem = _trace_problem(job)
                if problem:
                    raise ScenarioError(f"trace {path}, line {n}: {problem}")
                if job.gpus < w.min_gpus:
                    continue
                jobs.append(job)
                if w.limit and len(jobs) >= w.limit:
                    break
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
        raise ScenarioError(f"cannot read trace {path}: {exc}") from exc
    from chamber.sim.synth import notebooks, replicate  # synth builds TraceJobs: imported here, not in a cycle

    jobs += replicate(jobs, w.replicate)
    if w.notebooks is not None:
        if w.notebooks.priority not in DEFAULT_CLASSES:
            raise ScenarioError(f"notebooks: unknown priority {w.notebooks.priority!r}")
        jobs += notebooks(jobs, scenario.teams, w.notebooks)
    jobs.sort(key=lambda j: (j.submit_s, j.id))
    return jobs


def _open_text(path: Path) -> IO[str]:
    """A CSV trace as text: `.gz` files are decompressed as they are read."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", newline="", encoding="utf-8")
    return path.open(newline="", encoding="utf-8")


def _trace_problem(job: TraceJob) -> str | None:
    """Why a parsed trace row cannot be simulated, or None."""
    if not (math.isfinite(job.submit_s) and math.isfinite(job.duration_s)):
        return "submit_time_s and duration_s must be finite numbers"
    if job.duration_s < 0:
        return f"duration_s must not be negative, not {job.duration_s}"
    if job.gpus < 1:
        return f"num_gpus must be at least 1, not {job.gpus}"
    if job.priority not in DEFAULT_CLASSES:
        return f"unknown priority {job.priority!r}; use one of {', '.join(DEFAULT_CLASSES)} or a number"
    return None


def _class_for(value: int) -> str:
    best = min(DEFAULT_CLASSES.values(), key=lambda pc: (abs(pc.value - value), -pc.value))
    return best.name
