"""Per-team usage from job records: what each team runs and what it waits for."""

from collections.abc import Iterable

from chamber.common.contracts import JobRecord, JobState, TeamUsage


def team_usage(records: Iterable[JobRecord]) -> dict[str, TeamUsage]:
    acc: dict[str, list[int]] = {}
    for r in records:
        row = acc.setdefault(r.spec.team, [0, 0, 0, 0])
        if r.state == JobState.RUNNING:
            row[0] += r.spec.gpus
            row[1] += 1
        elif r.state in (JobState.PENDING, JobState.PREEMPTED):
            row[2] += 1
            row[3] += r.spec.gpus
    return {
        team: TeamUsage(team=team, gpus_running=g, jobs_running=j, jobs_pending=p, gpus_pending=gp)
        for team, (g, j, p, gp) in sorted(acc.items())
    }
