"""The health state machine per GPU and per node: healthy -> suspect -> quarantined -> recovering -> healthy.

- A fatal rule quarantines at once; a degraded one after `count` hits within its window (suspect until then), or
  once its signal has held in every sample for `sustain_s`; a warning only marks suspect, and only after `count`
  hits (flap suppression). Windows and streaks are measured in the samples' own time, so a consumer that catches
  up on a backlog judges it as it happened.
- A node is silent when its last sample is older than `heartbeat_intervals` of its interval and at least
  `heartbeat_min_s`: a late sample or an agent restart is not a dead node. "Older" is measured against the clock,
  but never beyond `watermark_slack_s` past the newest sample seen from any node: a health service that falls
  behind its telemetry, or a telemetry path that stops for everyone, does not make every node look dead.
- A quarantined entity recovers after `probation_s` without any rule firing (the fault is gone: a reset cleared
  the volatile counter, the node came back), and returns to healthy after a second clean probation.
- A repeat offender (`repeat_count` fatal events within `repeat_window_s`) and anything an operator cordoned stay
  out until an operator releases them.
- Circuit breaker: if quarantining would put more than `breaker_share` of the nodes into quarantine within
  `breaker_window_s` (a bad rule, a bad driver rollout), nothing more is quarantined: the verdict is an alert
  (`breaker_open`, once per entity per breaker window), and scheduling goes on.

Pure: observations and the time in, verdicts out. The shell turns quarantines into ledger cordons.
"""

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from chamber.common.contracts import GpuHealthVerdict, HealthCommand, HealthState, NodeTelemetry
from chamber.health.core.rules import DEFAULT_RULES, CounterHistory, Rule, RuleIndex, Severity, gpu_signals

Key = tuple[str, int | None]
"""(node, GPU index); None for the node as a whole."""


@dataclass(frozen=True, slots=True)
class HealthConfig:
    probation_s: float = 600.0
    suspect_clear_s: float = 300.0
    heartbeat_intervals: int = 3
    heartbeat_min_s: float = 30.0
    watermark_slack_s: float = 1.0
    repeat_count: int = 5
    repeat_window_s: float = 86400.0
    breaker_share: float = 0.5
    breaker_window_s: float = 300.0
    breaker_min_nodes: int = 3
    """The breaker opens only when at least this many nodes would be in quarantine (a small fleet can lose one)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """Why an entity moves: the rule, its severity, what was seen and what to do about it."""

    severity: str = ""
    rule: str = ""
    reason: str = ""
    action: str = ""
    evidence: dict[str, float] = field(default_factory=dict)


@dataclass
class Entity:
    node: str
    gpu: int | None
    state: HealthState = HealthState.HEALTHY
    since: float = 0.0
    severity: str = ""
    rule: str = ""
    reason: str = ""
    action: str = ""
    evidence: dict[str, float] = field(default_factory=dict)
    last_bad: float = float("-inf")
    held: bool = False
    hits: dict[str, deque[float]] = field(default_factory=dict)
    fatal_events: deque[float] = field(default_factory=deque)
    streaks: dict[str, float] = field(default_factory=dict)
    breaker_alerted: float = float("-inf")
    """Sustained rule -> the sample time its signal started holding."""
    uuid: str = ""


class HealthEngine:
    def __init__(self, rules: Iterable[Rule] = DEFAULT_RULES, config: HealthConfig | None = None) -> None:
        self.rules = tuple(rules)
        self.gpu_rules = tuple(r for r in self.rules if r.signal not in ("heartbeat_loss", "gpu_count_drop"))
        self.index = RuleIndex(self.gpu_rules)
        self.config = config or HealthConfig()
        self.entities: dict[Key, Entity] = {}
        self.node_gpus: dict[str, int] = {}
        self.last_seen: dict[str, tuple[float, float]] = {}
        self.quarantines: deque[tuple[float, str]] = deque()
        self.history = CounterHistory()
        self.watermark = float("-inf")
        """The newest sample time seen from any node: how far the telemetry has been read."""
        self.unwell: set[Key] = set()
        """Entities not healthy: the only ones whose time-driven transitions `tick` has to look at."""

    # ---- inputs ---------------------------------------------------------------------------------------------

    def set_inventory(self, node: str, gpus: int, now: float) -> None:
        self.node_gpus[node] = gpus
        self.last_seen.setdefault(node, (now, 0.0))

    def observe(self, batch: NodeTelemetry, now: float) -> list[GpuHealthVerdict]:
        node = batch.node
        self.last_seen[node] = (batch.sampled_at, batch.interval_s)
        if batch.interval_s and batch.sampled_at > self.watermark:
            self.watermark = batch.sampled_at
        verdicts: list[GpuHealthVerdict] = []
        node_hits: list[tuple[Rule, float]] = []
        expected = self.node_gpus.get(node, 0)
        if batch.interval_s and expected and len(batch.gpus) < expected:
            node_hits += [(r, float(expected - len(batch.gpus))) for r in self.rules if r.signal == "gpu_count_drop"]
        at = batch.sampled_at
        for sample in batch.gpus:
            signals = gpu_signals(sample, self.history, node, at)
            hits = self.index.match(signals, sample.xids)
            gpu_hits = [(r, v) for r, v in hits if r.scope == "gpu"]
            node_hits += [(r, v) for r, v in hits if r.scope == "node"]
            entity = self._entity(node, sample.index)
            entity.uuid = sample.uuid
            if entity.streaks:
                _break_streaks(entity, gpu_hits)
            verdicts += self._judge(entity, gpu_hits, now, at)
        node_entity = self._entity(node, None)
        if node_entity.streaks:
            _break_streaks(node_entity, node_hits)
        if node_hits or batch.interval_s:
            verdicts += self._judge(node_entity, node_hits, now, at)
        return verdicts

    def silence_limit(self, interval_s: float) -> float:
        """How long a node reporting every `interval_s` may stay silent before it counts as lost."""
        return max(self.config.heartbeat_intervals * interval_s, self.config.heartbeat_min_s)

    def command(self, cmd: HealthCommand, now: float) -> list[GpuHealthVerdict]:
        entity = self._entity(cmd.node, cmd.gpu_index)
        if cmd.command == "cordon":
            entity.held = True
            finding = Finding(Severity.DEGRADED.value, "operator-cordon", cmd.reason or "cordoned by an operator")
            return self._move(entity, HealthState.QUARANTINED, now, finding, force=True)
        entity.held = False
        entity.fatal_events.clear()
        entity.hits.clear()
        entity.last_bad = float("-inf")
        finding = Finding("", "operator-release", cmd.reason or "released by an operator")
        return self._move(entity, HealthState.HEALTHY, now, finding, force=True)

    def tick(self, now: float) -> list[GpuHealthVerdict]:
        """Time-driven transitions: heartbeat loss, and recovery of entities that stayed clean."""
        verdicts: list[GpuHealthVerdict] = []
        horizon = min(now, self.watermark + self.config.watermark_slack_s)
        for node, (seen, interval) in list(self.last_seen.items()):
            if interval and horizon - seen > self.silence_limit(interval):
                rules = [(r, horizon - seen) for r in self.rules if r.signal == "heartbeat_loss"]
                verdicts += self._judge(self._entity(node, None), rules, now, now)
        c = self.config
        for key in list(self.unwell):
            entity = self.entities[key]
            clean_for = now - entity.last_bad
            if entity.held:
                continue
            if entity.state == HealthState.SUSPECT and clean_for >= c.suspect_clear_s:
                verdicts += self._move(entity, HealthState.HEALTHY, now, Finding(reason="no fault since"))
            elif entity.state == HealthState.QUARANTINED and clean_for >= c.probation_s:
                finding = Finding(entity.severity, entity.rule, f"clean for {clean_for:.0f} s; on probation",
                                  entity.action)  # fmt: skip
                verdicts += self._move(entity, HealthState.RECOVERING, now, finding)
            elif entity.state == HealthState.RECOVERING and clean_for >= 2 * c.probation_s:
                verdicts += self._move(entity, HealthState.HEALTHY, now, Finding(reason="passed probation"))
        return verdicts

    # ---- the state machine ----------------------------------------------------------------------------------

    def _entity(self, node: str, gpu: int | None) -> Entity:
        key = (node, gpu)
        entity = self.entities.get(key)
        if entity is None:
            entity = self.entities[key] = Entity(node, gpu)
        return entity

    def _judge(self, entity: Entity, hits: list[tuple[Rule, float]], now: float, at: float) -> list[GpuHealthVerdict]:
        """`now`: when the verdict is made; `at`: the time of the observation (sample time) the hits come from."""
        if not hits:
            return []
        entity.last_bad = now
        worst: tuple[Rule, float] | None = None
        for rule, value in hits:
            if rule.sustain_s:
                since = entity.streaks.setdefault(rule.name, at)
                if at - since < rule.sustain_s:
                    continue  # not held long enough (a warning rule on the same signal may mark it suspect)
            elif rule.count > 1:
                times = entity.hits.setdefault(rule.name, deque())
                times.append(at)
                while times and at - times[0] > rule.window_s:
                    times.popleft()
                if len(times) < rule.count:
                    if rule.severity == Severity.DEGRADED and entity.state == HealthState.HEALTHY:
                        reason = f"{rule.name}: {value:g} ({len(times)} of {rule.count})"
                        finding = Finding(
                            rule.severity.value, rule.name, reason, rule.action, {str(rule.signal): value}
                        )
                        return self._move(entity, HealthState.SUSPECT, now, finding)
                    continue
            if worst is None or _rank(rule.severity) > _rank(worst[0].severity):
                worst = (rule, value)
        if worst is None:
            return []
        rule, value = worst
        evidence: dict[str, float] = {str(rule.signal): value}
        if rule.severity == Severity.WARNING:
            if entity.state == HealthState.HEALTHY:
                finding = Finding(rule.severity.value, rule.name, f"{rule.name}: {value:g}", rule.action, evidence)
                return self._move(entity, HealthState.SUSPECT, now, finding)
            return []
        if entity.state == HealthState.QUARANTINED:
            return []
        if rule.severity == Severity.FATAL:
            entity.fatal_events.append(now)
            while entity.fatal_events and now - entity.fatal_events[0] > self.config.repeat_window_s:
                entity.fatal_events.popleft()
            if len(entity.fatal_events) >= self.config.repeat_count:
                entity.held = True
        reason = f"{rule.name}: {value:g}"
        if entity.held and rule.severity == Severity.FATAL:
            reason += f"; {len(entity.fatal_events)} fatal events in 24 h: out until an operator releases it"
        action = "rma" if entity.held and rule.action else rule.action
        return self._move(entity, HealthState.QUARANTINED, now, Finding(rule.severity.value, rule.name, reason, action,
                                                                        evidence))  # fmt: skip

    def _move(
        self, entity: Entity, state: HealthState, now: float, finding: Finding, *, force: bool = False
    ) -> list[GpuHealthVerdict]:
        if state == HealthState.QUARANTINED and entity.state not in (HealthState.QUARANTINED, HealthState.RECOVERING):
            if not force and self._breaker_trips(entity.node, now):
                if now - entity.breaker_alerted < self.config.breaker_window_s:
                    return []  # alerted already
                entity.breaker_alerted = now
                share = f"{self.config.breaker_share:.0%}"
                held_back = Finding(finding.severity, finding.rule,
                                    f"circuit breaker open: would quarantine more than {share} of nodes; "
                                    f"{finding.reason}", finding.action, finding.evidence)  # fmt: skip
                return [self._verdict(entity, HealthState.SUSPECT, now, held_back, breaker=True)]
            self.quarantines.append((now, entity.node))
        if entity.state == state and not force:
            return []
        entity.state = state
        entity.since = now
        if state == HealthState.HEALTHY:
            self.unwell.discard((entity.node, entity.gpu))
        else:
            self.unwell.add((entity.node, entity.gpu))
        entity.severity, entity.rule, entity.reason, entity.action = (
            finding.severity, finding.rule, finding.reason, finding.action
        )  # fmt: skip
        entity.evidence = finding.evidence
        return [self._verdict(entity, state, now, finding)]

    def _breaker_trips(self, node: str, now: float) -> bool:
        while self.quarantines and now - self.quarantines[0][0] > self.config.breaker_window_s:
            self.quarantines.popleft()
        nodes = {n for _, n in self.quarantines} | {node}
        total = max(1, len(self.node_gpus) or len(self.last_seen))
        return len(nodes) >= self.config.breaker_min_nodes and len(nodes) / total > self.config.breaker_share

    def _verdict(
        self, entity: Entity, state: HealthState, now: float, finding: Finding, *, breaker: bool = False
    ) -> GpuHealthVerdict:
        return GpuHealthVerdict(
            node=entity.node, gpu_index=entity.gpu, state=state, reason=finding.reason, observed_at=now,
            uuid=entity.uuid, evidence=finding.evidence, severity=finding.severity, rule=finding.rule,
            action=finding.action, held=entity.held, breaker_open=breaker,
        )  # fmt: skip

    def restore(self, verdict: GpuHealthVerdict) -> None:
        """Take back the state a previous run published (at start-up)."""
        if verdict.breaker_open:
            return
        entity = self._entity(verdict.node, verdict.gpu_index)
        entity.state, entity.since = verdict.state, verdict.observed_at
        if verdict.state == HealthState.HEALTHY:
            self.unwell.discard((verdict.node, verdict.gpu_index))
        else:
            self.unwell.add((verdict.node, verdict.gpu_index))
        entity.severity, entity.rule, entity.reason = verdict.severity, verdict.rule, verdict.reason
        entity.action, entity.held, entity.uuid = verdict.action, verdict.held, verdict.uuid
        if verdict.state in (HealthState.QUARANTINED, HealthState.SUSPECT):
            entity.last_bad = verdict.observed_at

    def out_of_service(self) -> list[Entity]:
        """Entities whose GPUs must be unschedulable now."""
        return [e for e in self.entities.values() if e.state in (HealthState.QUARANTINED, HealthState.RECOVERING)]


def _break_streaks(entity: Entity, hits: list[tuple[Rule, float]]) -> None:
    """A sample without a sustained rule's signal ends its streak."""
    held = {rule.name for rule, _ in hits}
    for name in [n for n in entity.streaks if n not in held]:
        del entity.streaks[name]


def _rank(severity: Severity) -> int:
    return {Severity.WARNING: 0, Severity.DEGRADED: 1, Severity.FATAL: 2}[severity]
