"""Can a job ever run on this fleet? Jobs that cannot (an unknown pool, a GPU model nobody has, a gang larger than
every pool that could hold it, a team that has no quota where quotas are configured, a priority class its team may
not use) are refused at submit with the reason, instead of waiting forever behind a misleading "not enough free
GPUs".

Pure: the inventory and the quota configuration in, the reasons out. It answers "never", not "not now": a job
that fits an empty fleet passes even when the fleet is busy. A node's GPU model is its first GPU's (as the
scheduler indexes it), and a gang is placed within one pool, each replica on one node.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from chamber.common.contracts import JobSpec, Node, QuotaConfig, TeamConfig


@dataclass(frozen=True, slots=True)
class Infeasible:
    """Why a job can never run: a machine-readable `code` and a sentence for people."""

    code: str
    message: str
    field: str


def _model(node: Node) -> str:
    return node.gpus[0].model if node.gpus else ""


def _group(node: Node, level: str) -> str:
    if level == "node":
        return node.name
    if level == "rack":
        return node.topology.rack
    return node.topology.zone


def _replica_slots(nodes: Iterable[Node], gpus_per_replica: int) -> int:
    """How many replicas of this size the nodes hold when empty."""
    return sum(len(n.gpus) // gpus_per_replica for n in nodes)


def priority_denial(team: TeamConfig | None, priority: str) -> str | None:
    """Why `team` may not run a job of this priority class (`TeamConfig.priorities`); None when it may."""
    if team is None or not team.priorities or priority in team.priorities:
        return None
    return f"team {team.name!r} may not use priority {priority!r}; its classes: {', '.join(team.priorities)}"


def never_fits(spec: JobSpec, nodes: Sequence[Node], config: QuotaConfig | None = None) -> list[Infeasible]:
    """Every reason `spec` can never be placed; empty when it can (or when the inventory is not known yet)."""
    problems: list[Infeasible] = []
    team = next((t for t in config.teams if t.name == spec.team), None) if config is not None else None
    if config is not None and config.teams and team is None:
        known = ", ".join(sorted(t.name for t in config.teams))
        problems.append(
            Infeasible("unknown-team", f"team {spec.team!r} has no quota; quotas are configured for: {known}", "team")
        )
    denied = priority_denial(team, spec.priority)
    if denied is not None:
        problems.append(Infeasible("priority-not-allowed", denied, "priority"))
    if not nodes:
        return problems
    declared = {p.name: p for p in config.pools} if config is not None else {}
    pools = {n.pool for n in nodes}
    if spec.pool is not None and spec.pool not in pools:
        if spec.pool in declared:
            problems.append(Infeasible("empty-pool", f"pool {spec.pool!r} has no GPUs in the inventory", "pool"))
        else:
            known = ", ".join(sorted(pools | set(declared)))
            problems.append(Infeasible("unknown-pool", f"unknown pool {spec.pool!r}; pools: {known}", "pool"))
        return problems
    models = {_model(n) for n in nodes}
    if spec.gpu_model is not None and spec.gpu_model not in models:
        known = ", ".join(sorted(models))
        problems.append(
            Infeasible("unknown-gpu-model", f"no node has GPU model {spec.gpu_model!r}; models: {known}", "gpu_model")
        )
        return problems
    candidates = [
        n
        for n in nodes
        if (spec.pool is None or n.pool == spec.pool) and (spec.gpu_model is None or _model(n) == spec.gpu_model)
    ]
    where = "".join(f" of {c}" for c in (spec.gpu_model, spec.pool and f"pool {spec.pool}") if c)
    largest = max((len(n.gpus) for n in candidates), default=0)
    if spec.gpus_per_replica > largest:
        problems.append(
            Infeasible(
                "replica-too-large",
                f"gpus_per_replica={spec.gpus_per_replica} exceeds the largest node{where} ({largest} GPUs); "
                "split the job into more replicas",
                "gpus_per_replica",
            )
        )
        return problems
    by_pool: dict[str, list[Node]] = {}
    for n in candidates:
        by_pool.setdefault(n.pool, []).append(n)
    most = max(_replica_slots(group, spec.gpus_per_replica) for group in by_pool.values())
    if spec.replicas > most:
        gpus = max(sum(len(n.gpus) for n in group) for group in by_pool.values())
        problems.append(
            Infeasible(
                "gang-too-large",
                f"{spec.replicas} replicas x {spec.gpus_per_replica} GPUs never fit: the largest pool{where} holds "
                f"{most} such replicas ({gpus} GPUs)",
                "replicas",
            )
        )
        return problems
    if spec.topology is not None and spec.topology.required:
        level = spec.topology.level
        domains: dict[tuple[str, str], list[Node]] = {}
        for n in candidates:
            domains.setdefault((n.pool, _group(n, level)), []).append(n)
        best = max(_replica_slots(group, spec.gpus_per_replica) for group in domains.values())
        if spec.replicas > best:
            problems.append(
                Infeasible(
                    "topology-too-small",
                    f"{spec.replicas} replicas x {spec.gpus_per_replica} GPUs never fit in one {level}: the largest "
                    f"{level}{where} holds {best} such replicas; ask for a wider level or make it preferred",
                    "topology",
                )
            )
    return problems
