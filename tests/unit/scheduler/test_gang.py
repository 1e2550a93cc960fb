"""How a gang's replica reports become the job's events (the process executor's pure part), as a scenario table."""

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chamber.common.contracts import JobFinished, JobLaunchFailed, JobStarted, JobStopped
from chamber.scheduler.executor.gang import Action, End, Gang, Publish, Stop


def gang(replicas: int = 2, grace: float = 5.0) -> Gang:
    nodes = [f"n{r}" for r in range(replicas)]
    return Gang(job_id="j", attempt=1, nodes=nodes, gpus=[[0, 1]] * replicas, grace_s=grace)


def start(r: int, at: float = 1.0) -> tuple[str, Any]:
    return ("start", (r, at))


def exit_(
    r: int, code: int | None = 0, sig: int | None = None, stopped: bool = False, at: float = 10.0, *,
    gone: bool = False, message: str = "", fenced: bool = False,
) -> Any:  # fmt: skip
    end = End(at=at, node=f"n{r}", exit_code=code, signal=sig, stop_requested=stopped or fenced, lost=gone,
              message=message, fenced=fenced)  # fmt: skip
    return ("end", (r, end))


def lost(node: str, at: float = 20.0) -> tuple[str, Any]:
    return ("lost", (node, at))


def stop(reason: str = "preempted by x", grace: float = 5.0) -> tuple[str, Any]:
    return ("stop", (reason, grace))


def launch_failed(r: int, reason: str = "no such file") -> tuple[str, Any]:
    return ("launch_failed", ([r], reason, 2.0, f"n{r}"))


def run(g: Gang, steps: list[tuple[str, Any]]) -> list[Action]:
    out: list[Action] = []
    for kind, args in steps:
        if kind == "start":
            out += g.replica_started(*args)
        elif kind == "end":
            out += g.replica_ended(*args)
        elif kind == "lost":
            out += g.node_lost(*args)
        elif kind == "stop":
            out += g.stop(*args)
        else:
            out += g.launch_failed(*args)
    return out


@dataclass
class Case:
    name: str
    steps: list[tuple[str, Any]]
    events: list[str]
    """The events published, in order, by class name."""
    stops: list[tuple[str, float]]
    """(node, grace) of every stop asked of an agent."""
    check: Any = None


CASES = [
    Case("both replicas exit 0: started, then succeeded", [start(0), start(1), exit_(0), exit_(1)],
         ["JobStarted", "JobFinished"], [],
         lambda e: e[1].succeeded and e[1].exit_code == 0 and e[0].started_at == 1.0),
    Case("started counts only once every replica started", [start(0), start(0), exit_(0)], [], []),
    Case("a replica fails: the other is stopped with the checkpoint grace, the job failed with its code",
         [start(0), start(1), exit_(1, code=3, at=5.0), exit_(0, code=None, sig=15, stopped=True, at=6.0)],
         ["JobStarted", "JobFinished"], [("n0", 5.0)],
         lambda e: not e[1].succeeded and e[1].exit_code == 3 and "replica 1 on n1 exited with code 3" in e[1].message
         and e[1].finished_at == 6.0),
    Case("killed by a signal nobody sent: failed with 128 + the signal",
         [start(0), start(1), exit_(0, code=None, sig=9), exit_(1, code=None, sig=9, stopped=True)],
         ["JobStarted", "JobFinished"], [("n1", 5.0)],
         lambda e: e[1].exit_code == 137 and "SIGKILL" in e[1].message),
    Case("a requested stop: both stopped, graceful",
         [start(0), start(1), stop(), exit_(0, code=None, sig=15, stopped=True), exit_(1, code=0, stopped=True)],
         ["JobStarted", "JobStopped"], [("n0", 5.0), ("n1", 5.0)],
         lambda e: e[1].graceful and not e[1].interrupted and e[1].reason == "preempted by x"),
    Case("a cancel during the grace shortens it; the first reason stays",
         [start(0), start(1), stop(grace=5.0), stop("cancelled", 0.0), exit_(0, stopped=True), exit_(1, stopped=True)],
         ["JobStarted", "JobStopped"], [("n0", 5.0), ("n1", 5.0), ("n0", 0.0), ("n1", 0.0)],
         lambda e: not e[1].graceful),
    Case("finished by itself during a stop's grace: succeeded",
         [start(0), start(1), stop(), exit_(0), exit_(1)], ["JobStarted", "JobFinished"], [("n0", 5.0), ("n1", 5.0)],
         lambda e: e[1].succeeded),
    Case("a lost agent: its replica lost, the other stopped at once, the job interrupted",
         [start(0), start(1), lost("n1"), exit_(0, code=None, sig=9, stopped=True)],
         ["JobStarted", "JobStopped"], [("n0", 0.0)],
         lambda e: e[1].interrupted and not e[1].graceful and "n1" in e[1].reason),
    Case("a replica cannot start: the rest stopped, launch failed",
         [start(0), launch_failed(1), exit_(0, code=None, sig=9, stopped=True)],
         ["JobLaunchFailed"], [("n0", 0.0)], lambda e: "no such file" in e[0].reason),
    Case("reports after the end change nothing",
         [start(0), start(1), exit_(0), exit_(1), exit_(1, code=4), lost("n0"), stop()],
         ["JobStarted", "JobFinished"], [], lambda e: e[1].succeeded),
    Case("a replica fenced by its agent's dead-man switch, unasked: the other stopped at once, the job interrupted",
         [start(0), start(1), exit_(1, code=None, sig=9, stopped=True, message="stopped: its node agent was gone"),
          exit_(0, code=None, sig=9, stopped=True)],
         ["JobStarted", "JobStopped"], [("n0", 0.0)],
         lambda e: e[1].interrupted and e[1].reason == "stopped: its node agent was gone"),
    Case("a replica its agent reports lost (its supervisor died): the other stopped at once",
         [start(0), start(1), exit_(1, code=None, gone=True, message="its supervisor ended"),
          exit_(0, code=None, sig=9, stopped=True)],
         ["JobStarted", "JobStopped"], [("n0", 0.0)], lambda e: e[1].interrupted),
    Case("three replicas, two fenced: the rest is stopped once",
         [start(0), start(1), start(2), exit_(1, code=None, sig=9, stopped=True),
          exit_(2, code=None, sig=9, stopped=True), exit_(0, code=None, sig=9, stopped=True)],
         ["JobStarted", "JobStopped"], [("n0", 0.0), ("n2", 0.0)]),
    # Found by review: a node cut off takes its ranks with it, their peers fail before it is judged lost (a
    # collective times out), and the job failed instead of being requeued.
    Case("a peer fails, then its node is judged lost: interrupted, not failed",
         [start(0), start(1), exit_(0, code=1, at=5.0), lost("n1", at=30.0)],
         ["JobStarted", "JobStopped"], [("n1", 5.0)],
         lambda e: e[1].interrupted and "n1" in e[1].reason),
    Case("a peer fails, then the cut-off node's fenced replica is reported: interrupted, not failed",
         [start(0), start(1), exit_(0, code=1, at=5.0), exit_(1, code=None, sig=15, fenced=True, at=6.0)],
         ["JobStarted", "JobStopped"], [("n1", 5.0)],
         lambda e: e[1].interrupted and "n1 cut off" in e[1].reason),
    Case("a stop before any start: each node tombstones its replicas, the job stopped",
         [stop("cancelled", 0.0), exit_(0, code=None, stopped=True), exit_(1, code=None, stopped=True)],
         ["JobStopped"], [("n0", 0.0), ("n1", 0.0)], lambda e: e[0].started_at is None),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_gang_scenarios(case: Case) -> None:
    actions = run(gang(3 if any(step[0] == "start" and step[1][0] == 2 for step in case.steps) else 2), case.steps)
    published = [a.event for a in actions if isinstance(a, Publish)]
    assert [type(e).__name__ for e in published] == case.events
    assert [(a.node, a.grace_s) for a in actions if isinstance(a, Stop)] == case.stops
    if case.check is not None:
        assert case.check(published)


def test_the_final_event_waits_for_every_replica() -> None:
    """A failed replica's job event releases the GPUs, so it is published only once the others ended too."""
    g = gang(3)
    actions = run(g, [start(0), start(1), start(2), exit_(2, code=1)])
    assert not [a for a in actions if isinstance(a, Publish) and a.final]
    assert not g.done


steps = st.lists(
    st.one_of(
        st.builds(start, st.integers(0, 2), st.floats(0, 10)),
        st.builds(exit_, st.integers(0, 2), st.sampled_from([0, 1, None]), st.sampled_from([None, 9, 15]),
                  st.booleans(), st.floats(0, 10)),
        st.builds(lost, st.sampled_from(["n0", "n1", "n2"]), st.floats(0, 10)),
        st.builds(stop, st.just("preempted"), st.sampled_from([0.0, 5.0])),
        st.builds(launch_failed, st.integers(0, 2)),
    ),
    max_size=20,
)  # fmt: skip


@given(steps)
def test_one_final_event_exactly_when_every_replica_ended(sequence: list[tuple[str, Any]]) -> None:
    g = gang(3)
    actions = run(g, sequence)
    finals = [a for a in actions if isinstance(a, Publish) and a.final]
    started = [a for a in actions if isinstance(a, Publish) and not a.final]
    assert len(finals) == (1 if len(g.ends) == 3 else 0)
    assert len(started) <= 1
    assert g.done == bool(finals)
    for a in actions:
        if isinstance(a, Publish):
            assert isinstance(a.event, JobStarted | JobFinished | JobStopped | JobLaunchFailed)
            assert (a.event.job_id, a.event.attempt) == ("j", 1)
    # nothing is published after the final event
    if finals:
        assert actions.index(finals[0]) == max(i for i, a in enumerate(actions) if isinstance(a, Publish))
