"""What a replica is started with: its environment and the shim's instructions (`launch.json`).

The environment is the agent's own (without Chamber's settings), the torchrun options, the job's `env`, and then
what Chamber sets and a job may not override: the placed GPUs, the gang's coordinates and the checkpoint
directory (docs/agent.md lists them).
"""

import os
import socket
from collections.abc import Mapping
from pathlib import Path

import msgspec

from chamber.collector.agent.marker import MARKER
from chamber.collector.agent.replicas import ReplicaState
from chamber.common.contracts import LaunchReplicas
from chamber.common.workload import RESERVED_ENV, RESERVED_PREFIXES

FENCE_AFTER = 0.5
FENCE_GRACE = 0.2
"""Shares of the agent timeout: a cut-off replica gets SIGTERM at 0.5 and SIGKILL at 0.7 of it, so it is gone
before the executor counts it lost (at 1.0) and its GPUs are given to another job."""


def replica_environment(
    base: Mapping[str, str], req: LaunchReplicas, state: ReplicaState, node: str, checkpoint: Path
) -> dict[str, str]:
    inherited = {k: v for k, v in base.items() if k not in RESERVED_ENV and not k.startswith(RESERVED_PREFIXES)}
    torchrun = {  # torchrun reads its options from PET_* variables: `torchrun train.py` joins the gang as it is
        "PET_NNODES": str(req.replicas), "PET_NODE_RANK": str(state.replica),
        "PET_MASTER_ADDR": state.master_addr, "PET_MASTER_PORT": str(state.master_port),
        "PET_NPROC_PER_NODE": str(len(state.gpus)),
    }  # fmt: skip
    chamber = {
        "CUDA_VISIBLE_DEVICES": state.visible_devices, "CHAMBER_JOB_ID": req.job_id,
        "CHAMBER_ATTEMPT": str(req.attempt), "CHAMBER_REPLICA": str(state.replica),
        "CHAMBER_REPLICAS": str(req.replicas), "CHAMBER_NODE": node, "CHAMBER_CHECKPOINT_DIR": str(checkpoint),
        "MASTER_ADDR": state.master_addr, "MASTER_PORT": str(state.master_port),
        MARKER: state.marker,  # how its processes are found, whatever session or group they move to
    }  # fmt: skip
    return inherited | torchrun | req.env | chamber


def write_launch(
    directory: Path, req: LaunchReplicas, env: dict[str, str], log_max_bytes: int, agent_timeout_s: float
) -> None:
    """The shim's instructions, readable only by the agent's user (the environment may hold secrets)."""
    spec = {
        "argv": req.command, "env": env, "cwd": req.working_dir, "log_max_bytes": log_max_bytes,
        "fence_after_s": FENCE_AFTER * agent_timeout_s, "fence_grace_s": FENCE_GRACE * agent_timeout_s,
    }  # fmt: skip
    fd = os.open(directory / "launch.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(msgspec.json.encode(spec))


def free_port() -> int:
    """A TCP port free now on this host (for `MASTER_PORT`; torchrun binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port
