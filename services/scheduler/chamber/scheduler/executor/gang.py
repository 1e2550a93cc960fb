"""One attempt of a gang as its node agents report it: when it counts as started, and how it ended.

Pure: reports in, actions out (publish a job event, stop replicas on a node). Idempotent: a report applied twice
changes nothing, so replaying the REPLICAS stream after a restart rebuilds the same state.

- `JobStarted` once every replica started (at the last start).
- The attempt ends when every replica has ended, and only then is its event published (its GPUs are released by
  it, so no replica may still run):
  - a replica could not start: `JobLaunchFailed`;
  - a replica failed on its own (non-zero exit or a signal nobody sent): `JobFinished(succeeded=False)` with its
    exit code (128 + the signal number for a signal), the others stopped after the job's checkpoint grace; unless
    a node of the gang was lost or cut off (its replicas fenced) in the attempt: its peers' failures are taken as
    what its loss did to them (a collective timing out), and the attempt is interrupted as below;
  - a replica's node agent was lost, or the agent reports a replica lost (its supervisor died) or stopped by its
    own dead-man switch (fenced) while nobody had asked for a stop: `JobStopped(interrupted=True)`, the others
    stopped at once (they would wait on the missing rank, holding every GPU of the gang);
  - the scheduler asked for the stop: `JobStopped` (graceful when it had a grace period);
  - every replica exited 0 by itself: `JobFinished(succeeded=True, exit_code=0)`, even during a stop's grace.
"""

import signal
from collections.abc import Iterable
from dataclasses import dataclass, field

from chamber.common.contracts import JobFinished, JobLaunchFailed, JobStarted, JobStopped

JobReport = JobStarted | JobFinished | JobStopped | JobLaunchFailed


@dataclass(frozen=True, slots=True)
class End:
    at: float
    node: str
    exit_code: int | None = None
    signal: int | None = None
    stop_requested: bool = False
    """It was told to stop (by the scheduler, by this gang's failure, or by its agent's dead-man switch)."""
    lost: bool = False
    never_started: bool = False
    message: str = ""
    fenced: bool = False
    """Stopped by its agent's dead-man switch (the agent was cut off)."""

    @property
    def clean(self) -> bool:
        return self.exit_code == 0 and not self.stop_requested and not self.lost

    @property
    def failed(self) -> bool:
        """It ended on its own, badly."""
        return not (self.stop_requested or self.lost or self.never_started or self.exit_code == 0)

    def describe(self, replica: int) -> str:
        if self.signal is not None:
            return f"replica {replica} on {self.node} was killed by signal {self.signal} ({_signal_name(self.signal)})"
        if self.exit_code is not None:
            return f"replica {replica} on {self.node} exited with code {self.exit_code}"
        return f"replica {replica} on {self.node} ended: {self.message or 'unknown'}"

    @property
    def code(self) -> int | None:
        return 128 + self.signal if self.signal is not None else self.exit_code


@dataclass(frozen=True, slots=True)
class Publish:
    event: JobReport
    what: str
    """The message id's suffix: `started`, `finished`, `stopped`, `launch-failed`."""

    @property
    def final(self) -> bool:
        return self.what != "started"


@dataclass(frozen=True, slots=True)
class Stop:
    node: str
    replicas: tuple[int, ...]
    grace_s: float
    reason: str


Action = Publish | Stop


@dataclass
class Gang:
    job_id: str
    attempt: int
    nodes: list[str]
    """The node of each replica."""
    gpus: list[list[int]]
    """The GPU indices (on its node) of each replica."""
    grace_s: float = 0.0
    """The job's checkpoint grace: what the rest of a failed gang gets to stop."""
    started: dict[int, float] = field(default_factory=dict)
    ends: dict[int, End] = field(default_factory=dict)
    launch_error: str = ""
    requested: tuple[str, float] | None = None
    """The scheduler's stop: (reason, grace)."""
    started_at: float | None = None
    """When `JobStarted` was published (or the record says it started)."""
    accepted: set[str] = field(default_factory=set)
    """Nodes whose agent accepted the launch of this attempt's replicas there."""
    done: bool = False
    interrupted: bool = False
    """A replica ended without anyone here asking (lost, or fenced by its agent): the rest are being stopped."""

    @property
    def replicas(self) -> int:
        return len(self.nodes)

    def live(self) -> list[int]:
        return [r for r in range(self.replicas) if r not in self.ends]

    def live_nodes(self) -> set[str]:
        return {self.nodes[r] for r in self.live()}

    def on_node(self, node: str) -> list[int]:
        return [r for r, n in enumerate(self.nodes) if n == node]

    # ---- inputs -------------------------------------------------------------------------------------------------

    def replica_started(self, replica: int, at: float) -> list[Action]:
        if replica in self.started or not 0 <= replica < self.replicas:
            return []
        self.started[replica] = at
        if len(self.started) < self.replicas or self.started_at is not None or self.launch_error or self.done:
            return []
        self.started_at = max(self.started.values())
        return [Publish(JobStarted(job_id=self.job_id, attempt=self.attempt, started_at=self.started_at), "started")]

    def replica_ended(self, replica: int, end: End) -> list[Action]:
        if replica in self.ends or not 0 <= replica < self.replicas:
            return []
        unasked = (end.lost or end.stop_requested) and self.requested is None and not self._stopping_rest()
        first = (end.failed or unasked) and not self._stopping_rest()
        self.ends[replica] = end
        self.interrupted = self.interrupted or unasked
        grace = self.grace_s if end.failed else 0.0
        actions = self._stop_live(grace, f"{end.describe(replica)}; stopping the gang") if first else []
        return actions + self._settle()

    def launch_failed(self, replicas: Iterable[int], reason: str, at: float, node: str) -> list[Action]:
        fresh = [r for r in replicas if r not in self.ends]
        if not fresh:
            return []
        first = not self.launch_error and not self._stopping_rest()
        self.launch_error = self.launch_error or reason
        for r in fresh:
            self.ends[r] = End(at=at, node=node, never_started=True, message=reason)
        actions = self._stop_live(0.0, f"launch failed: {reason}") if first else []
        return actions + self._settle()

    def node_lost(self, node: str, at: float) -> list[Action]:
        lost = [r for r in self.on_node(node) if r not in self.ends]
        if not lost:
            return []
        first = not self._stopping_rest()
        for r in lost:
            self.ends[r] = End(at=at, node=node, lost=True, message=f"node agent on {node} lost")
        actions = self._stop_live(0.0, f"node agent on {node} lost") if first else []
        return actions + self._settle()

    def stop(self, reason: str, grace_s: float) -> list[Action]:
        """The scheduler asks: every live replica gets SIGTERM, then SIGKILL after `grace_s`. A second request
        may only shorten the grace (a cancel during a preemption's grace kills at once)."""
        if self.requested is not None and self.requested[1] <= grace_s:
            return self._stop_live(self.requested[1], self.requested[0])
        self.requested = (self.requested[0] if self.requested else reason, grace_s)
        return self._stop_live(grace_s, self.requested[0]) + self._settle()

    # ---- outcome ------------------------------------------------------------------------------------------------

    def _stopping_rest(self) -> bool:
        return bool(self.launch_error) or self.interrupted or any(e.failed or e.lost for e in self.ends.values())

    def _stop_live(self, grace_s: float, reason: str) -> list[Action]:
        by_node: dict[str, list[int]] = {}
        for r in self.live():
            by_node.setdefault(self.nodes[r], []).append(r)
        return [Stop(node, tuple(rs), grace_s, reason) for node, rs in sorted(by_node.items())]

    def _settle(self) -> list[Action]:
        if self.done or len(self.ends) < self.replicas:
            return []
        self.done = True
        ends = self.ends
        at = max(e.at for e in ends.values())
        job, attempt, started = self.job_id, self.attempt, self.started_at
        failures = sorted((e.at, r) for r, e in ends.items() if e.failed)
        lost = sorted({e.node for e in ends.values() if e.lost})
        fenced = sorted({e.node for e in ends.values() if e.fenced})
        if self.launch_error and started is None:  # once it started, the attempt ends as a stop (requeued)
            return [Publish(JobLaunchFailed(job_id=job, attempt=attempt, failed_at=at, reason=self.launch_error),
                            "launch-failed")]  # fmt: skip
        if failures and not lost and not fenced:
            replica = failures[0][1]
            first = ends[replica]
            event = JobFinished(job_id=job, attempt=attempt, finished_at=at, succeeded=False,
                                message=first.describe(replica), started_at=started, exit_code=first.code)  # fmt: skip
            return [Publish(event, "finished")]
        if all(e.clean for e in ends.values()):
            event = JobFinished(job_id=job, attempt=attempt, finished_at=at, started_at=started, exit_code=0)
            return [Publish(event, "finished")]
        if lost or (fenced and failures):
            # A node cut off takes its ranks with it, and their peers fail (a collective times out) before the
            # node is judged lost: the job is interrupted, requeued, not failed (found by review).
            reason = f"node agent on {', '.join(lost)} lost" if lost else f"node agent on {', '.join(fenced)} cut off"
            stopped = JobStopped(job_id=job, attempt=attempt, stopped_at=at, reason=reason, graceful=False,
                                 started_at=started, interrupted=True)  # fmt: skip
            return [Publish(stopped, "stopped")]
        if self.requested is not None:
            reason, grace = self.requested
            stopped = JobStopped(job_id=job, attempt=attempt, stopped_at=at, reason=reason, graceful=grace > 0,
                                 started_at=started)  # fmt: skip
            return [Publish(stopped, "stopped")]
        why = next((e.message for e in ends.values() if e.message), "stopped by its node agent")
        stopped = JobStopped(job_id=job, attempt=attempt, stopped_at=at, reason=why, graceful=False,
                             started_at=started, interrupted=True)  # fmt: skip
        return [Publish(stopped, "stopped")]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
