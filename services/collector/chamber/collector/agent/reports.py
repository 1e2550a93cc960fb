"""What the agent tells the executor about a replica, derived from its state file alone (pure), so that after a
crash whatever was not acknowledged is sent again and nothing else: `started`, then `exited` or `failed`."""

import signal

import msgspec

from chamber.collector.agent.replicas import Ending, ReplicaState
from chamber.common.contracts import ReplicaExited, ReplicaLaunchFailed, ReplicaStarted

LOST = "its supervisor ended without recording an exit; what it left running was killed"


def pending_reports(node: str, s: ReplicaState) -> list[tuple[str, msgspec.Struct]]:
    """The reports of this replica that JetStream has not acknowledged yet, in order, with their id suffix."""
    out: list[tuple[str, msgspec.Struct]] = []
    ending = s.ending
    if s.started_at is not None and "started" not in s.reported:
        out.append(("started", ReplicaStarted(
            node=node, job_id=s.job_id, attempt=s.attempt, replica=s.replica, pid=s.child_pid,
            started_at=s.started_at, visible_devices=s.visible_devices,
        )))  # fmt: skip
    if ending is None:
        return out
    if ending.launch_error:
        if "failed" not in s.reported:
            out.append(("failed", ReplicaLaunchFailed(
                node=node, job_id=s.job_id, attempt=s.attempt, replica=s.replica, failed_at=ending.exited_at,
                reason=ending.launch_error,
            )))  # fmt: skip
    elif "exited" not in s.reported:
        message = ending.message or ("stopped: its node agent was gone" if ending.fenced else "")
        out.append(("exited", ReplicaExited(
            node=node, job_id=s.job_id, attempt=s.attempt, replica=s.replica, exited_at=ending.exited_at,
            exit_code=ending.exit_code, signal=ending.signal, stop_requested=s.stop is not None or ending.fenced,
            lost=ending.lost, message=message, fenced=ending.fenced,
        )))  # fmt: skip
    return out


def ending_from(record: dict[str, object] | None, s: ReplicaState, node: str, now: float) -> Ending:
    """How a replica whose shim is gone ended: from the shim's `exit.json`, else from what the agent did."""
    record = record or {}
    at = _float(record.get("exited_at"), now)
    if record.get("launch_error"):
        return Ending(exited_at=at, launch_error=f"cannot start on {node}: {record['launch_error']}")
    if "exit_code" in record or "signal" in record:
        return Ending(exited_at=at, exit_code=_int(record.get("exit_code")), signal=_int(record.get("signal")),
                      fenced=bool(record.get("fenced")))  # fmt: skip
    if s.stop is not None and s.stop.killed:
        return Ending(exited_at=now, signal=signal.SIGKILL)  # the SIGKILL took the shim too
    return Ending(exited_at=now, lost=True, message=LOST)


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def _float(value: object, default: float) -> float:
    return float(value) if isinstance(value, int | float) else default
