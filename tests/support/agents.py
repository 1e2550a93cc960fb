"""Helpers for tests that run real job processes through node agents (the process executor)."""

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from chamber.collector.agent.replicas import ReplicaStore, alive, signal_group
from chamber.common.bus import Bus
from chamber.common.codec import Decoder
from chamber.common.contracts import JobEvent, JobRecord, ReplicaReport
from chamber.common.jobstore import JobStore
from chamber.common.settings import Settings
from chamber.common.subjects import JOBS, REPLICAS


def process_settings(settings: Settings, state_dir: Path, **overrides: Any) -> Settings:
    """The test's settings with jobs run as processes by local agents on the simulated fleet."""
    values: dict[str, Any] = {
        "executor": "process", "agent_state_dir": str(state_dir), "agent_heartbeat_s": 0.2, "agent_timeout_s": 5.0,
        "fleet_nodes": 2, "gpus_per_node": 4, "launch_timeout_s": 60.0,
    }  # fmt: skip
    return msgspec.structs.replace(settings, **(values | overrides))


@contextmanager
def no_leftovers(state_dir: Path) -> Iterator[None]:
    """After the test, kill every replica's process group still alive (a failed test leaves none behind)."""
    try:
        yield
    finally:
        for root in state_dir.glob("*/agent/*"):
            for _, state in ReplicaStore(root).load_all():
                if state.ending is None and alive(state.shim_pid, state.shim_start):
                    signal_group(state.shim_pid, signal.SIGKILL)


async def record(store: JobStore, job_id: str) -> JobRecord | None:
    got = await store.get(job_id)
    return None if got is None else got[0]


async def in_state(store: JobStore, job_id: str, *states: str) -> JobRecord | None:
    r = await record(store, job_id)
    return r if r is not None and r.state in states else None


async def job_events(bus: Bus, job_id: str) -> list[Any]:
    return await bus.read_since(JOBS, bus.names.job_lifecycle(job_id), 0.0, Decoder(JobEvent))


async def replica_reports(bus: Bus, job_id: str) -> list[Any]:
    return await bus.read_since(REPLICAS, bus.names.replica_reports(job_id), 0.0, Decoder(ReplicaReport))
