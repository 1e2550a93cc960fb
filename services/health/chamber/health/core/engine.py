"""The health state machine per GPU and per node: healthy -> suspect -> quarantined -> recovering -> healthy.

- A fatal rule quarantines at once; a degraded one after `count` hits within its window (suspect until then), or
  once its signal has held in every sample for `sustain_s`; a warning only marks suspect, and only after `count`
  hits (flap suppression). Windows and streaks are measured in the samples' own time, so a consumer that catches
  up on a backlog judges it as it happened.
- Only a batch with an interval (a sample of the node's series) is a heartbeat, feeds the counter history and ends
  streaks; an observation without one (an XID event) is judged on what it carries (an XID event: its XIDs) only.
- A node is silent when its last sample is older than `heartbeat_intervals` of its interval and at least
  `heartbeat_min_s` (a late sample or an agent restart is not a dead node), on two clocks at once: its sample
  time against the clock, but never beyond `watermark_slack_s` past the newest sample seen from any node (a health
  service that falls behind its telemetry, or a telemetry path that stops for everyone, does not make every node
  look dead), and the time since anything from it arrived (a node whose clock lags is not a dead node).
- A quarantined entity recovers after `probation_s` without any rule firing (the fault is gone: a reset cleared
  the volatile counter, the node came back), and returns to healthy after a second clean probation. A fault that
  only a reset clears and that leaves no counter to watch (a fatal XID: `Rule.needs_reset`) proves nothing by
  clean samples: its probation starts only once the node reports from another boot (a new boot ID; a reboot
  resets every GPU) or an operator releases it (after resetting the GPU). After a
  restart, the restored unwell entities of a node make no progress until the node has been heard from: a node
  that died while the service was down is not released for its silence. Each node's last sample before the
  restart is taken too (`heard_before`), so a node that was well and died while the service was down is found
  silent after the restart.
- A node reporting fewer physical GPUs than it has ever had (in this process) is taken out: a node back from a
  reboot without one of its GPUs publishes the smaller inventory itself. An operator's release of the node accepts
  its current inventory.
- A repeat offender (`repeat_count` fatal events within `repeat_window_s`) and anything an operator cordoned stay
  out until an operator releases them.
- Circuit breaker: if quarantining would put more than `breaker_share` of the nodes into quarantine within
  `breaker_window_s` (a bad rule, a bad driver rollout), nothing more is quarantined: the verdict is an alert
  (`breaker_open`, once per entity per breaker window), and scheduling goes on.

Pure: observations and the time in, verdicts out. The shell turns quarantines into ledger cordons.
"""

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from chamber.common.contracts import GpuDevice, GpuHealthVerdict, GpuSample, HealthCommand, HealthState, NodeTelemetry
from chamber.health.core.rules import DEFAULT_RULES, CounterHistory, Rule, RuleIndex, Severity, gpu_signals

Key = tuple[str, int | None]
"""(node, GPU index); None for the node as a whole."""


OUT = (HealthState.QUARANTINED, HealthState.RECOVERING)
"""The states in which an entity is held out of service (cordoned)."""


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
    needs_reset: bool = False
    """A quarantine it makes waits for a reboot or an operator (`Rule.needs_reset`)."""


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
    degraded_quarantines: deque[float] = field(default_factory=deque)
    """When it was quarantined for a degraded fault, within the repeat window: a GPU that keeps coming back with
    the same fault is held too (found by review: a correctable-ECC burst every 30 min made 47 quarantines, and
    47 drains of its jobs, a day)."""
    streaks: dict[str, float] = field(default_factory=dict)
    breaker_alerted: float = float("-inf")
    """Sustained rule -> the sample time its signal started holding."""
    uuid: str = ""
    awaiting_reset: bool = False
    """Quarantined by a `needs_reset` rule: no probation until the node reports from another boot."""
    boot_id: str = ""
    """The node's boot ID when it was so quarantined (empty: not known, so only an operator's release helps)."""
    faulted_at: float = float("-inf")
    """When a fault last moved it to suspect or quarantined (not an operator's order, nor hits while it stays out):
    a release issued before that did not see the fault."""


class HealthEngine:
    def __init__(self, rules: Iterable[Rule] = DEFAULT_RULES, config: HealthConfig | None = None) -> None:
        self.rules = tuple(rules)
        self.gpu_rules = tuple(r for r in self.rules if r.signal not in ("heartbeat_loss", "gpu_count_drop"))
        self.heartbeat_rules = tuple(r for r in self.rules if r.signal == "heartbeat_loss")
        self.count_rules = tuple(r for r in self.rules if r.signal == "gpu_count_drop")
        self.index = RuleIndex(self.gpu_rules)
        self.signal_of = {r.name: r.signal for r in self.gpu_rules if r.signal != "xid"}
        """Rule -> the sample signal it reads (the signal a quarantine by it waits to see clean again)."""
        self.config = config or HealthConfig()
        self.entities: dict[Key, Entity] = {}
        self.node_gpus: dict[str, int] = {}
        """Physical GPUs in each node's latest inventory."""
        self.expected_gpus: dict[str, int] = {}
        """The most physical GPUs each node's inventory has had (reset by an operator's release of the node)."""
        self.missing_before: dict[str, int] = {}
        """GPUs a node was out for missing when this process started (`restore`): its first inventory after the
        restart does not have them, and expected them too (found by review: a node quarantined for a lost GPU came
        back healthy after a restart of the health service, the GPU still gone)."""
        self.parents: dict[str, Mapping[str, str]] = {}
        """Per node, MIG instance UUID -> its physical GPU's UUID, to count a batch's samples by physical GPU."""
        self.last_seen: dict[str, tuple[float, float]] = {}
        """Node -> (its newest sample time, its interval); interval 0: not heard from in this process."""
        self.arrived: dict[str, float] = {}
        """Node -> when (service clock) its newest heartbeat arrived."""
        self.unheard: set[str] = set()
        """Nodes with restored unwell entities that have not reported since: those entities cannot progress."""
        self.quarantines: deque[tuple[float, str]] = deque()
        self.history = CounterHistory()
        self.watermark = float("-inf")
        """The newest sample time seen from any node: how far the telemetry has been read."""
        self.unwell: set[Key] = set()
        """Entities not healthy: the only ones whose time-driven transitions `tick` has to look at."""
        self.boots: dict[str, str] = {}
        """Node -> the boot ID of its newest heartbeat (nodes whose agent reports one)."""

    # ---- inputs ---------------------------------------------------------------------------------------------

    def set_inventory(
        self, node: str, gpus: int, now: float, parents: Mapping[str, str] | None = None, unreadable: int = 0
    ) -> None:
        """`gpus`: the node's physical GPUs its agent reads; `parents`: its MIG instances' physical GPUs (see
        `physical_gpus`); `unreadable`: GPUs the node has that its agent could not read at start.

        The expected count only grows: an agent back from a reboot without a GPU reports the smaller inventory
        itself, and that is the fault gpu-count-drop is for. An operator's release accepts the readable ones."""
        self.node_gpus[node] = gpus
        missing = self.missing_before.pop(node, 0)
        self.expected_gpus[node] = max(gpus + unreadable + missing, self.expected_gpus.get(node, 0))
        self.parents[node] = dict(parents or {})
        self.last_seen.setdefault(node, (now, 0.0))

    def observe(self, batch: NodeTelemetry, now: float) -> list[GpuHealthVerdict]:
        """`now`: the service clock when the batch arrived (a node's own clock may be off; arrivals are not)."""
        node = batch.node
        heartbeat = batch.interval_s > 0
        if heartbeat:
            self._heard(batch, now)
        verdicts: list[GpuHealthVerdict] = []
        node_hits = self._count_drop(batch) if heartbeat else []
        seen_on: dict[str, str] = {}
        """A node rule's name -> the GPU whose sample hit it (XID 79: which GPU fell off the bus, to replace it)."""
        at = batch.sampled_at
        history = self.history if heartbeat else None
        for sample in batch.gpus:
            signals = gpu_signals(sample, history, node, at)
            hits = self.index.match(signals, sample.xids)
            gpu_hits = [(r, v) for r, v in hits if r.scope == "gpu"]
            for r, v in hits:
                if r.scope == "node":
                    node_hits.append((r, v))
                    seen_on.setdefault(r.name, f"GPU {sample.index} ({sample.uuid})" if sample.uuid else
                                       f"GPU {sample.index}")  # fmt: skip
            entity = self._entity(node, sample.index)
            entity.uuid = sample.uuid
            if heartbeat and entity.streaks:
                _break_streaks(entity, gpu_hits)
            verdicts += self._judge(entity, gpu_hits, now, at)
            if heartbeat and entity.state in OUT and self.signal_of.get(entity.rule, "") not in ("", *signals):
                # The sample does not carry the signal the GPU is out for (a read that failed, a field the driver
                # stopped answering): no evidence that it cleared, so its probation starts again (found by review:
                # samples without their ECC fields brought a GPU with double-bit errors back).
                entity.last_bad = now
        node_entity = self._entity(node, None)
        if heartbeat and node_entity.streaks:
            _break_streaks(node_entity, node_hits)
        if node_hits or heartbeat:
            verdicts += self._judge(node_entity, node_hits, now, at, seen_on)
        return verdicts

    def _heard(self, batch: NodeTelemetry, now: float) -> None:
        """A sample of the node's series: it is alive, on its own clock and on ours. A sample time ahead of ours
        counts as now (found by review: a node 600 s ahead was found silent 600 s late, and its future samples
        moved the watermark past the service's clock, so a service that fell behind found every node lost)."""
        sampled = min(batch.sampled_at, now)
        self.last_seen[batch.node] = (sampled, batch.interval_s)
        self.arrived[batch.node] = now
        self.unheard.discard(batch.node)
        self.watermark = max(self.watermark, sampled)
        if batch.boot_id:
            self.boots[batch.node] = batch.boot_id  # another than an entity waits in: it was reset (see `tick`)

    def _count_drop(self, batch: NodeTelemetry) -> list[tuple[Rule, float]]:
        """gpu-count-drop hits: fewer physical GPUs in the batch than the node has had."""
        expected = self.expected_gpus.get(batch.node, 0)
        missing = expected - reported_gpus(batch.gpus, self.parents.get(batch.node, {}))
        if not expected or missing <= 0:
            return []
        return [(r, float(missing)) for r in self.count_rules]

    def silence_limit(self, interval_s: float) -> float:
        """How long a node reporting every `interval_s` may stay silent before it counts as lost."""
        return max(self.config.heartbeat_intervals * interval_s, self.config.heartbeat_min_s)

    def command(self, cmd: HealthCommand, now: float) -> list[GpuHealthVerdict]:
        """An operator's order. A release issued before the entity's latest fault is not carried out: it did not
        see that fault (an order delivered again after its ack was lost, or replayed at a restart, would otherwise
        release a GPU quarantined since for a new fault)."""
        entity = self._entity(cmd.node, cmd.gpu_index)
        if cmd.command == "release" and cmd.issued_at and cmd.issued_at < entity.faulted_at:
            return []
        if cmd.command == "release" and cmd.gpu_index is None:
            self.missing_before.pop(cmd.node, None)
            if cmd.node in self.node_gpus:
                self.expected_gpus[cmd.node] = self.node_gpus[cmd.node]  # re-provisioned with fewer GPUs on purpose
        if cmd.command == "cordon":
            entity.held = True
            finding = Finding(Severity.DEGRADED.value, "operator-cordon", cmd.reason or "cordoned by an operator")
            return self._move(entity, HealthState.QUARANTINED, now, finding, force=True)
        entity.held = False
        entity.awaiting_reset = False
        entity.fatal_events.clear()
        entity.degraded_quarantines.clear()
        entity.hits.clear()
        entity.last_bad = float("-inf")
        finding = Finding("", "operator-release", cmd.reason or "released by an operator")
        return self._move(entity, HealthState.HEALTHY, now, finding, force=True)

    def tick(self, now: float) -> list[GpuHealthVerdict]:
        """Time-driven transitions: heartbeat loss, and recovery of entities that stayed clean."""
        verdicts = self._silent_nodes(now)
        for key in list(self.unwell):
            entity = self.entities[key]
            if entity.held:
                continue
            if entity.node in self.unheard:
                self._hold_clean_time(entity, now)
                continue
            if entity.awaiting_reset:
                boot = self.boots.get(entity.node, "")
                if not (entity.boot_id and boot and boot != entity.boot_id):
                    continue  # clean samples prove nothing until a reset
                entity.awaiting_reset, entity.last_bad = False, now  # the node rebooted: its probation starts
            verdicts += self._progress(entity, now)
        return verdicts

    def _silent_nodes(self, now: float) -> list[GpuHealthVerdict]:
        """Heartbeat loss: silent both in sample time (against the horizon) and in arrival time."""
        verdicts: list[GpuHealthVerdict] = []
        horizon = min(now, self.watermark + self.config.watermark_slack_s)
        for node, (seen, interval) in list(self.last_seen.items()):
            if not interval:
                continue
            limit = self.silence_limit(interval)
            if horizon - seen > limit and now - self.arrived.get(node, float("-inf")) > limit:
                rules = [(r, horizon - seen) for r in self.heartbeat_rules]
                verdicts += self._judge(self._entity(node, None), rules, now, now)
        return verdicts

    def _hold_clean_time(self, entity: Entity, now: float) -> None:
        """A restored entity of a node not heard from since: its clean time stands still (a recovering one keeps
        the first probation it had passed)."""
        credit = self.config.probation_s if entity.state == HealthState.RECOVERING else 0.0
        entity.last_bad = max(entity.last_bad, now - credit)

    def _progress(self, entity: Entity, now: float) -> list[GpuHealthVerdict]:
        """Suspect -> healthy, quarantined -> recovering -> healthy, for an entity that stayed clean long enough."""
        c = self.config
        clean_for = now - entity.last_bad
        if entity.state == HealthState.SUSPECT and clean_for >= c.suspect_clear_s:
            return self._move(entity, HealthState.HEALTHY, now, Finding(reason="no fault since"))
        if entity.state == HealthState.QUARANTINED and clean_for >= c.probation_s:
            finding = Finding(entity.severity, entity.rule, f"clean for {clean_for:.0f} s; on probation", entity.action)
            return self._move(entity, HealthState.RECOVERING, now, finding)
        if entity.state == HealthState.RECOVERING and clean_for >= 2 * c.probation_s:
            return self._move(entity, HealthState.HEALTHY, now, Finding(reason="passed probation"))
        return []

    # ---- the state machine ----------------------------------------------------------------------------------

    def _entity(self, node: str, gpu: int | None) -> Entity:
        key = (node, gpu)
        entity = self.entities.get(key)
        if entity is None:
            entity = self.entities[key] = Entity(node, gpu)
        return entity

    def _judge(
        self,
        entity: Entity,
        hits: list[tuple[Rule, float]],
        now: float,
        at: float,
        seen_on: Mapping[str, str] | None = None,
    ) -> list[GpuHealthVerdict]:
        """`now`: when the verdict is made; `at`: the time of the observation (sample time) the hits come from;
        `seen_on`: a node rule's name -> the GPU whose sample hit it, named in the reason.

        Every hit is counted, and the worst one that is due decides; a degraded rule still short of its count (an
        early hit: suspect) decides only when nothing worse is due, so a fatal XID is never lost behind it."""
        if not hits:
            return []
        entity.last_bad = now
        worst: tuple[Rule, float] | None = None
        early: Finding | None = None
        for rule, value in hits:
            if rule.sustain_s:
                since = entity.streaks.setdefault(rule.name, at)
                if at - since < rule.sustain_s:
                    continue  # not held long enough (a warning rule on the same signal may mark it suspect)
            elif rule.count > 1:
                times = _count_hit(entity, rule, at)
                if len(times) < rule.count:
                    if early is None and rule.severity == Severity.DEGRADED:
                        reason = f"{_said(rule, value, seen_on)} ({len(times)} of {rule.count})"
                        early = Finding(rule.severity.value, rule.name, reason, rule.action, {str(rule.signal): value})
                    continue
            if worst is None or _rank(rule.severity) > _rank(worst[0].severity):
                worst = (rule, value)
        if early is not None and (worst is None or worst[0].severity == Severity.WARNING):
            if entity.state == HealthState.HEALTHY:
                return self._move(entity, HealthState.SUSPECT, now, early)
            return []
        if worst is None:
            return []
        rule, value = worst
        evidence: dict[str, float] = {str(rule.signal): value}
        if rule.severity == Severity.WARNING:
            if entity.state == HealthState.HEALTHY:
                finding = Finding(rule.severity.value, rule.name, _said(rule, value, seen_on), rule.action, evidence)
                return self._move(entity, HealthState.SUSPECT, now, finding)
            return []
        escalation = False
        if entity.state == HealthState.QUARANTINED:
            # Already out: only a worse fault changes anything (found by review: a fatal XID on a GPU quarantined
            # as degraded was dropped, and the GPU came back after its probation without the reset it needs).
            held_for = Severity(entity.severity) if entity.severity in Severity.__members__.values() else None
            worse = held_for is None or _rank(rule.severity) > _rank(held_for)
            if not (worse or (rule.needs_reset and not entity.awaiting_reset)):
                return []
            escalation = True
        made = escalation or entity.state == HealthState.RECOVERING or not self._breaker_trips(entity.node, now)
        if rule.severity == Severity.FATAL and made:  # (one the breaker holds back is no event: found by review,
            entity.fatal_events.append(now)  # a persistent DBE then counted at every sample, and made an RMA)
            while entity.fatal_events and now - entity.fatal_events[0] > self.config.repeat_window_s:
                entity.fatal_events.popleft()
            if len(entity.fatal_events) >= self.config.repeat_count:
                entity.held = True
        elif rule.severity == Severity.DEGRADED and made and not escalation:
            entity.degraded_quarantines.append(now)
            while entity.degraded_quarantines and now - entity.degraded_quarantines[0] > self.config.repeat_window_s:
                entity.degraded_quarantines.popleft()
            if len(entity.degraded_quarantines) >= self.config.repeat_count:
                entity.held = True
        reason = _said(rule, value, seen_on)
        if entity.held and rule.severity == Severity.FATAL:
            reason += f"; {len(entity.fatal_events)} fatal events in 24 h: out until an operator releases it"
        elif entity.held:
            reason += f"; {len(entity.degraded_quarantines)} quarantines in 24 h: out until an operator releases it"
        elif rule.needs_reset:
            reason += "; out until the node reboots or an operator releases it"
        action = "rma" if entity.held and rule.action else rule.action
        finding = Finding(rule.severity.value, rule.name, reason, action, evidence, rule.needs_reset)
        return self._move(entity, HealthState.QUARANTINED, now, finding, force=escalation)

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
        if state in (HealthState.SUSPECT, HealthState.QUARANTINED) and not finding.rule.startswith("operator-"):
            entity.faulted_at = now
        # Only a quarantine really made (not one the breaker held back) waits for a reset; leaving it ends that.
        entity.awaiting_reset = state == HealthState.QUARANTINED and finding.needs_reset
        entity.boot_id = self.boots.get(entity.node, "") if entity.awaiting_reset else ""
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
            awaiting_reset=entity.awaiting_reset and state != HealthState.HEALTHY, boot_id=entity.boot_id,
        )  # fmt: skip

    def heard_before(self, batch: NodeTelemetry, now: float) -> None:
        """At start-up: the node's last sample on the bus before this process ran. A node heard from before and not
        since is watched for silence from `now` (its arrival clock starts at the restart), so a node that died
        while the service was down is found lost once its silence limit passes, not forgotten."""
        if batch.interval_s <= 0 or self.last_seen.get(batch.node, (0.0, 0.0))[1]:
            return  # not a sample of its series, or heard from in this process already
        sampled = min(batch.sampled_at, now)  # (a sample time ahead of ours counts as now, as in `_heard`)
        self.last_seen[batch.node] = (sampled, batch.interval_s)
        self.arrived[batch.node] = now
        self.watermark = max(self.watermark, sampled)
        if batch.boot_id:
            self.boots[batch.node] = batch.boot_id  # its boot when the service stopped: no reboot evidence by itself

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
        entity.awaiting_reset, entity.boot_id = verdict.awaiting_reset, verdict.boot_id
        if verdict.gpu_index is None and verdict.state in OUT and verdict.rule == "gpu-count-drop":
            missing = int(verdict.evidence.get("gpu_count_drop", 0))
            if verdict.node in self.node_gpus:  # its inventory came first
                self.expected_gpus[verdict.node] = max(
                    self.expected_gpus.get(verdict.node, 0), self.node_gpus[verdict.node] + missing
                )
            else:
                self.missing_before[verdict.node] = missing
        if verdict.state != HealthState.HEALTHY and not verdict.rule.startswith("operator-"):
            entity.faulted_at = verdict.observed_at  # (at the latest: the fault itself may be older)
        if verdict.state in (HealthState.QUARANTINED, HealthState.SUSPECT):
            entity.last_bad = verdict.observed_at
        elif verdict.state == HealthState.RECOVERING:
            entity.last_bad = verdict.observed_at - self.config.probation_s  # the first probation was passed
        if verdict.state != HealthState.HEALTHY and not self.last_seen.get(verdict.node, (0.0, 0.0))[1]:
            self.unheard.add(verdict.node)  # its entities wait until the node reports again

    def out_of_service(self) -> list[Entity]:
        """Entities whose GPUs must be unschedulable now."""
        return [e for e in self.entities.values() if e.state in (HealthState.QUARANTINED, HealthState.RECOVERING)]


def physical_gpus(devices: Sequence[GpuDevice]) -> tuple[int, dict[str, str]]:
    """A node's physical GPUs from its inventory's devices, and its MIG instances' parents (UUID -> UUID).

    MIG reconfiguration changes the number of devices, not of GPUs: a GPU in MIG mode is listed as its instances
    instead of itself, each naming it in `parent_uuid`; a whole GPU counts one (as `reported_gpus` counts it)."""
    parents = {d.uuid: d.parent_uuid for d in devices if d.parent_uuid}
    whole = sum(1 for d in devices if not d.parent_uuid)
    return whole + len(set(parents.values())), parents


def reported_gpus(samples: Sequence[GpuSample], parents: Mapping[str, str]) -> int:
    """The physical GPUs a batch reports: a whole GPU's sample counts one, a MIG instance's counts its parent once
    (an instance the inventory does not know yet counts one: an overcount never quarantines)."""
    if not parents:
        return len(samples)
    whole, instances_of = 0, set()
    for sample in samples:
        parent = parents.get(sample.uuid)
        if parent is None:
            whole += 1
        else:
            instances_of.add(parent)
    return whole + len(instances_of)


def _count_hit(entity: Entity, rule: Rule, at: float) -> deque[float]:
    """Record a counted rule's hit at sample time `at`; its hits within the window."""
    times = entity.hits.setdefault(rule.name, deque())
    while times and times[-1] > at:  # the node's clock stepped back: hits "after" this one are of no window now
        times.pop()  # (found by review: kept, they counted with later ones forever, and a GPU was quarantined)
    times.append(at)
    while times and at - times[0] > rule.window_s:
        times.popleft()
    return times


def _break_streaks(entity: Entity, hits: list[tuple[Rule, float]]) -> None:
    """A sample without a sustained rule's signal ends its streak."""
    held = {rule.name for rule, _ in hits}
    for name in [n for n in entity.streaks if n not in held]:
        del entity.streaks[name]


def _said(rule: Rule, value: float, seen_on: Mapping[str, str] | None) -> str:
    """A finding's reason: the rule and the value that hit it, and for a node rule the GPU that showed it."""
    where = seen_on.get(rule.name) if seen_on else None
    return f"{rule.name}: {value:g}" + (f" on {where}" if where else "")


def _rank(severity: Severity) -> int:
    return {Severity.WARNING: 0, Severity.DEGRADED: 1, Severity.FATAL: 2}[severity]
