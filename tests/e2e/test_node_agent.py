"""The node agent as a process of its own (the collector), killed like a crashed pod: its jobs' processes live
on, and a restarted agent re-adopts them and reports what happened while it was away; an agent that does not
come back has its jobs interrupted and requeued, and their processes stop themselves before the GPUs are reused."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from chamber.cli.infra import free_port
from chamber.collector.agent.replicas import ReplicaStore, alive
from chamber.common.bus import Bus
from chamber.common.codec import Decoder, encode
from chamber.common.contracts import (
    AgentStatus,
    JobLaunchFailed,
    JobSpec,
    JobStopped,
    JobSubmitted,
    LogsChunk,
    LogsRequest,
    ReplicaExited,
)
from chamber.common.jobstore import JobStore
from chamber.common.settings import Settings
from chamber.scheduler import service as scheduler
from tests.support.agents import in_state, job_events, no_leftovers, process_settings, record, replica_reports
from tests.support.jobs import command
from tests.support.processes import ServiceProcesses
from tests.support.services import eventually, running

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
ROOT = Path(__file__).parents[2]


def replica_states(state_dir: Path, job_id: str) -> dict[int, Any]:
    return {
        state.replica: (directory, state)
        for root in state_dir.glob("*/agent/*")
        for directory, state in ReplicaStore(root).load_all()
        if state.job_id == job_id
    }


async def agent_logs(bus: Bus, node: str, job_id: str, replica: int) -> bytes:
    request = LogsRequest(job_id=job_id, attempt=1, replica=replica)
    msg = await bus.nc.request(bus.names.agent_request(node, "logs"), encode(request), timeout=3)
    chunk: LogsChunk = Decoder(LogsChunk).decode(msg.data)
    return chunk.data


async def test_an_agent_killed_and_restarted_loses_nothing(
    settings: Settings, bus: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = tmp_path / "agent"
    proc = process_settings(settings, state_dir, agent_timeout_s=10.0)
    services = ServiceProcesses(proc, tmp_path)
    store = await JobStore.open(bus)
    out = tmp_path / "out"
    out.mkdir()
    statuses: list[AgentStatus] = []

    async def on_status(msg: Any) -> None:
        statuses.append(Decoder(AgentStatus).decode(msg.data))

    await bus.nc.subscribe(bus.names.subject("agents.status.>"), cb=on_status)
    with no_leftovers(state_dir):
        services.start("collector")
        try:
            async with running(proc, ("scheduler", scheduler.main)):
                spec = JobSpec(name="steady", team="ml", gpus_per_replica=4, replicas=2,
                               command=command("until_file", out))  # fmt: skip
                await bus.publish(bus.names.job_submit("steady"),
                                  JobSubmitted(job_id="steady", spec=spec, submitted_at=time.time()))  # fmt: skip
                await eventually(lambda: in_state(store, "steady", "running"), within=30, what="running")
                before = {r: s.shim_pid for r, (_, s) in replica_states(state_dir, "steady").items()}

                services.kill("collector")  # 1: killed while the replicas run; they go on
                assert all(alive(pid, "") for pid in before.values()), "the replicas outlive their agent"
                services.start("collector")
                restarted = time.time()
                await eventually(lambda: any(s.at > restarted and s.replicas for s in statuses), within=30,
                                 what="the restarted agents report the replicas they adopted")  # fmt: skip
                adopted = sorted((r.replica, r.pid) for s in statuses if s.at > restarted for r in s.replicas)
                assert {replica for replica, _ in adopted} == {0, 1}

                services.kill("collector")  # 2: killed, and the replicas end while it is away
                (out / "go").touch()
                await eventually(
                    lambda: all((d / "exit.json").exists() for d, _ in replica_states(state_dir, "steady").values()),
                    what="both replicas ended (their shims recorded it)",
                )  # fmt: skip
                still = await record(store, "steady")
                assert still is not None
                assert still.state == "running", "nobody has reported it yet"
                services.start("collector")
                await eventually(lambda: in_state(store, "steady", "succeeded"), within=30, what="reported at restart")

                done = await record(store, "steady")
                assert done is not None
                assert done.placement is not None
                events = await job_events(bus, "steady")
                reports = await replica_reports(bus, "steady")
                kinds = sorted((type(r).__name__, r.replica) for r in reports)
                logs = {r: await agent_logs(bus, done.placement.gpus[r * 4].node, "steady", r) for r in (0, 1)}
                with capsys.disabled():
                    print(json.dumps({"attempt": done.attempt, "reports": kinds, "adopted_pids": adopted,
                                      "logs": {r: v.decode() for r, v in logs.items()}}))  # fmt: skip
                assert done.attempt == 1, "never restarted"
                assert not [e for e in events if isinstance(e, JobStopped | JobLaunchFailed)]
                assert kinds == [("ReplicaExited", 0), ("ReplicaExited", 1), ("ReplicaStarted", 0),
                                 ("ReplicaStarted", 1)], "each report stored once"  # fmt: skip
                assert all(r.exit_code == 0 for r in reports if isinstance(r, ReplicaExited))
                assert logs == {r: f"replica {r}: before\nreplica {r}: after\n".encode() for r in (0, 1)}
        finally:
            services.stop_all()


async def test_a_lost_agents_jobs_are_interrupted_and_requeued_after_their_processes_stopped(
    settings: Settings, bus: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = tmp_path / "agent"
    timeout = 3.0
    proc = process_settings(settings, state_dir, agent_timeout_s=timeout, fleet_nodes=1)
    services = ServiceProcesses(proc, tmp_path)
    store = await JobStore.open(bus)
    out = tmp_path / "out"
    out.mkdir()
    with no_leftovers(state_dir):
        services.start("collector")
        try:
            async with running(proc, ("scheduler", scheduler.main)):
                spec = JobSpec(name="long", team="ml", gpus_per_replica=4, checkpoint_grace_s=30.0,
                               command=command("checkpointing", out))  # fmt: skip
                await bus.publish(bus.names.job_submit("long"),
                                  JobSubmitted(job_id="long", spec=spec, submitted_at=time.time()))  # fmt: skip
                await eventually((out / "child.pid").exists, within=30, what="running")
                child = int((out / "child.pid").read_text())
                services.kill("collector")
                killed_at = time.time()
                await eventually(lambda: _stopped(bus, "long"), within=timeout + 10, what="the job is interrupted")
                stopped = next(e for e in await job_events(bus, "long") if isinstance(e, JobStopped))
                directory, _ = replica_states(state_dir, "long")[0]
                exit_record = json.loads((directory / "exit.json").read_text())
                # The report is on the bus; the scheduler writes the interrupted record once it has applied it.
                await eventually(lambda: _interruptions(store, "long"), within=10, what="the record interrupted")
                interrupted = await record(store, "long")
                assert interrupted is not None
                with capsys.disabled():
                    print(json.dumps({"agent_killed_at": killed_at, "replica_exit": exit_record,
                                      "stopped": msgspec.to_builtins(stopped),
                                      "record": {"state": interrupted.state, "interruptions": interrupted.interruptions,
                                                 "reason": interrupted.reason}}))  # fmt: skip
                assert stopped.interrupted
                assert not stopped.graceful
                assert "node agent on node-0000 lost" in stopped.reason
                assert stopped.stopped_at - killed_at >= timeout - 0.5
                assert exit_record["fenced"], "the replica stopped itself: its agent was gone"
                assert exit_record["exited_at"] <= stopped.stopped_at, "gone before its GPUs were released"
                assert not alive(child, ""), "with its whole process group"
                assert interrupted.interruptions == 1
                assert (out / "sigterm.json").exists(), "it had the dead-man switch's SIGTERM to checkpoint"

                services.start("collector")  # the node comes back: the requeued job resumes from its checkpoint
                await eventually(lambda: in_state(store, "long", "succeeded"), within=40, what="resumed, finished")
                final = await record(store, "long")
                assert final is not None
                resumed = json.loads((out / f"trainer-attempt{final.attempt}.json").read_text())
                assert resumed["found"] == ["state"], "the checkpoint it wrote on the way out"
        finally:
            services.stop_all()


async def _interruptions(store: JobStore, job_id: str) -> int:
    r = await record(store, job_id)
    return 0 if r is None else r.interruptions


async def _stopped(bus: Bus, job_id: str) -> bool:
    return any(isinstance(e, JobStopped) for e in await job_events(bus, job_id))


def test_chamber_up_with_the_process_executor_runs_real_commands_on_the_simulated_fleet(tmp_path: Path) -> None:
    import httpx

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAMBER_")} | {
        "CHAMBER_EMBEDDED": "1", "CHAMBER_HTTP_PORT": str(port), "CHAMBER_METRICS_PORT": "0",
        "CHAMBER_EXECUTOR": "process", "CHAMBER_AGENT_STATE_DIR": str(tmp_path / "agent"),
        "CHAMBER_FLEET_NODES": "2", "PYTHONUNBUFFERED": "1", "CHAMBER_ADMIN_TOKEN": "agent-e2e-admin-token-0123456789",
    }  # fmt: skip
    log = tmp_path / "up.log"
    with open(log, "wb") as sink:
        up = subprocess.Popen([sys.executable, "-m", "chamber.cli.main", "up"], env=env, stdout=sink, stderr=sink)
    try:
        deadline = time.monotonic() + 60
        auth = {"authorization": f"Bearer {env['CHAMBER_ADMIN_TOKEN']}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5, headers=auth) as http:
            while b"chamber: ready in" not in log.read_bytes():
                assert up.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            while http.get("/v1/fleet").json()["gpus_total"] == 0:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            say = 'echo "replica $CHAMBER_REPLICA sees $CUDA_VISIBLE_DEVICES"'
            job = {
                "name": "hello",
                "team": "demo",
                "gpus_per_replica": 2,
                "replicas": 2,
                "command": ["/bin/sh", "-c", say],
            }
            created = http.post("/v1/jobs", json=job)
            assert created.status_code == 201, created.text
            job_id = created.json()["id"]
            while (view := http.get(f"/v1/jobs/{job_id}").json())["state"] not in ("succeeded", "failed"):
                assert time.monotonic() < deadline, view
                time.sleep(0.1)
            assert view["state"] == "succeeded", view
            outputs = [http.get(f"/v1/jobs/{job_id}/logs", params={"replica": r}).text for r in (0, 1)]
            assert outputs[0].startswith("replica 0 sees GPU-")
            assert outputs[1].startswith("replica 1 sees GPU-")
            assert outputs[0].split()[-1] != outputs[1].split()[-1]
            refused = http.post("/v1/jobs", json={"name": "sim", "team": "demo", "gpus_per_replica": 1,
                                                  "duration_s": 5})  # fmt: skip
            assert refused.status_code == 400, "a job with nothing to run is refused here"
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(timeout=30)
    assert code == 0, log.read_text()


def test_the_device_check_dry_run_on_the_fake_nvml() -> None:
    """deploy/device-check.sh on a machine without GPUs, against the tests' fake NVML: every piece but the GPUs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAMBER_")} | {
        "CHAMBER_NVML_MODULE": "tests.support.fakenvml:TWO_H100",
    }
    done = subprocess.run(
        [str(ROOT / "deploy" / "device-check.sh"), "--json", "--timeout", "90"], env=env, capture_output=True,
        timeout=110, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()[-3000:]
    result = json.loads(done.stdout)
    print(json.dumps(result, indent=1))
    assert result["ok"]
    assert [g["uuid"] for g in result["nvml"]["gpus"]] == ["GPU-fake-0", "GPU-fake-1"]
    assert all(s["sm_activity"] is not None and s["usage"] is not None for s in result["nvml"]["samples"])
    job = result["job"]
    assert job["state"] == "succeeded"
    kinds = [e["kind"] for e in job["events"]]
    assert kinds.index("placed") < kinds.index("started") < kinds.index("succeeded"), kinds
    assert job["cuda_visible_devices"] in ("GPU-fake-0", "GPU-fake-1")
