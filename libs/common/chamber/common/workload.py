"""What a job must say for the configured executor to run it: one rule, used where jobs are submitted (the
gateway answers 400) and where they are launched (the process executor refuses a job submitted under another
executor, so it fails with the same words instead of running nothing).

The contract's types already bound sizes; these are the rules across fields, and the shape of environment names.
"""

import re

from chamber.common.contracts import JobSpec

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT"})
"""Set by the node agent for each replica; a job may not override them (CUDA_VISIBLE_DEVICES is its isolation)."""
RESERVED_PREFIXES = ("CHAMBER_",)


def workload_problem(spec: JobSpec, executor: str) -> str | None:
    """Why `spec` cannot run on `executor` (`simulated`, `process`, `kubernetes`), naming the field; None if it can."""
    problem = _shape_problem(spec)
    if problem is not None:
        return problem
    if executor == "process":
        if spec.command is None:
            return "command: required; this Chamber runs each replica's command as a process on its node"
        if spec.image is not None:
            return "image: the process executor runs `command` on the node directly and cannot use an image"
    elif executor == "kubernetes" and spec.workload is None:
        return (
            "workload: this Chamber runs jobs as the Kubernetes workloads they stand for (CHAMBER_EXECUTOR="
            "kubernetes): create a batch/v1 Job, a JobSet, a PyTorchJob or a TrainJob labelled chamber.io/team "
            "instead (docs/kubernetes.md)"
        )
    elif executor == "simulated" and (spec.command is not None or spec.env or spec.working_dir or spec.image):
        return (
            "command: this Chamber simulates its jobs (CHAMBER_EXECUTOR=simulated) and would not run it; give "
            "duration_s instead, or start Chamber with CHAMBER_EXECUTOR=process to run real commands"
        )
    return None


def _shape_problem(spec: JobSpec) -> str | None:
    if spec.command is not None:
        if spec.duration_s is not None:
            return (
                "duration_s: only for simulated jobs; a job with a command runs until its processes exit "
                "(bound it with max_runtime_s)"
            )
        if not spec.command[0]:
            return "command: the program (command[0]) is empty"
        if any("\0" in arg for arg in spec.command):
            return "command: an argument contains a NUL character"
    elif spec.env or spec.working_dir:
        return "command: env and working_dir need a command to run"
    for name, value in spec.env.items():
        if not ENV_NAME.fullmatch(name):
            return f"env.{name}: not a variable name (letters, digits and _, not starting with a digit)"
        if name in RESERVED_ENV or name.startswith(RESERVED_PREFIXES):
            return f"env.{name}: set by Chamber for each replica; it cannot be overridden"
        if "\0" in value:
            return f"env.{name}: the value contains a NUL character"
    if spec.working_dir is not None and (not spec.working_dir.startswith("/") or "\0" in spec.working_dir):
        return f"working_dir: must be an absolute path, got {spec.working_dir!r}"
    return None
