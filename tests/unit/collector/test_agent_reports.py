"""What the agent reports about a replica, from its state file alone, and how a replica whose shim is gone ended."""

from pathlib import Path

import pytest

from chamber.collector.agent.launching import replica_environment
from chamber.collector.agent.replicas import Ending, ReplicaState, StopOrder
from chamber.collector.agent.reports import LOST, ending_from, pending_reports
from chamber.common.contracts import LaunchReplicas, ReplicaAssignment, ReplicaExited, ReplicaLaunchFailed

STOP = StopOrder(reason="preempted", grace_s=5, requested_at=10.0, kill_at=15.0)


def state(**changes: object) -> ReplicaState:
    base = ReplicaState(job_id="j", attempt=2, replica=1, replicas=2, gpus=[0, 1], visible_devices="GPU-a,GPU-b")
    for k, v in changes.items():
        setattr(base, k, v)
    return base


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        (state(), []),
        (state(started_at=1.0), ["started"]),
        (state(started_at=1.0, reported=["started"]), []),
        (state(started_at=1.0, ending=Ending(exited_at=2.0, exit_code=0)), ["started", "exited"]),
        (state(started_at=1.0, reported=["started", "exited"], ending=Ending(exited_at=2.0, exit_code=0)), []),
        (state(ending=Ending(exited_at=2.0, launch_error="no such file")), ["failed"]),
        (state(ending=Ending(exited_at=2.0, launch_error="x"), reported=["failed"]), []),
    ],
    ids=["nothing-yet", "started", "started-acknowledged", "ended", "all-acknowledged", "failed", "failed-acked"],
)
def test_only_what_was_not_acknowledged_is_reported(s: ReplicaState, expected: list[str]) -> None:
    assert [what for what, _ in pending_reports("n1", s)] == expected


def test_an_exit_after_a_stop_or_the_dead_man_switch_says_it_was_asked_to_stop() -> None:
    ((_, asked),) = pending_reports("n1", state(stop=STOP, ending=Ending(exited_at=3.0, signal=15)))
    assert isinstance(asked, ReplicaExited)
    assert (asked.signal, asked.stop_requested, asked.node, asked.attempt) == (15, True, "n1", 2)
    ((_, fenced),) = pending_reports("n1", state(ending=Ending(exited_at=3.0, signal=9, fenced=True)))
    assert isinstance(fenced, ReplicaExited)
    assert fenced.stop_requested
    assert "agent was gone" in fenced.message
    ((_, failed),) = pending_reports("n1", state(ending=Ending(exited_at=3.0, launch_error="bad cwd")))
    assert isinstance(failed, ReplicaLaunchFailed)


@pytest.mark.parametrize(
    ("record", "s", "expected"),
    [
        ({"exit_code": 0, "signal": None, "exited_at": 5.0}, state(), Ending(exited_at=5.0, exit_code=0)),
        ({"exit_code": None, "signal": 15, "exited_at": 5.0}, state(), Ending(exited_at=5.0, signal=15)),
        ({"signal": 9, "fenced": True, "exited_at": 5.0}, state(), Ending(exited_at=5.0, signal=9, fenced=True)),
        ({"launch_error": "No such file", "exited_at": 5.0}, state(),
         Ending(exited_at=5.0, launch_error="cannot start on n1: No such file")),
        (None, state(stop=StopOrder(reason="x", grace_s=0, requested_at=1, kill_at=1, killed=True)),
         Ending(exited_at=9.0, signal=9)),
        (None, state(), Ending(exited_at=9.0, lost=True, message=LOST)),
        ({"exit_code": "garbage"}, state(), Ending(exited_at=9.0, exit_code=None)),
    ],
    ids=["exit-0", "signal", "fenced", "launch-error", "killed-with-its-shim", "unknown", "garbage"],
)  # fmt: skip
def test_how_a_replica_ended(record: dict[str, object] | None, s: ReplicaState, expected: Ending) -> None:
    assert ending_from(record, s, "n1", now=9.0) == expected


def test_the_environment_chamber_sets_wins_and_settings_do_not_leak(tmp_path: Path) -> None:
    req = LaunchReplicas(job_id="j", attempt=3, replicas=2, assignments=[ReplicaAssignment(replica=1, gpus=[0, 1])],
                         command=["x"], env={"LR": "1", "PET_NPROC_PER_NODE": "1"})  # fmt: skip
    s = state(master_addr="10.0.0.5", master_port=29500)
    base = {"PATH": "/bin", "CHAMBER_NATS_URL": "nats://secret", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    env = replica_environment(base, req, s, "n1", tmp_path / "ckpt" / "j")
    assert env["PATH"] == "/bin"
    assert "CHAMBER_NATS_URL" not in env, "the agent's own settings stay with the agent"
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert (env["CHAMBER_ATTEMPT"], env["CHAMBER_REPLICA"], env["CHAMBER_REPLICAS"]) == ("3", "1", "2")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["PET_NODE_RANK"]) == ("10.0.0.5", "29500", "1")
    assert env["PET_NPROC_PER_NODE"] == "1", "a job may set torchrun's options itself"
    assert env["LR"] == "1"
    assert env["CHAMBER_CHECKPOINT_DIR"] == str(tmp_path / "ckpt" / "j")
