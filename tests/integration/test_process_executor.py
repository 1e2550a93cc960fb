"""Real job processes under the scheduler: the process executor, node agents on the simulated fleet's GPUs (each
simulated node served by a local agent), real NATS and Redis. What each replica saw is printed as JSON (-s)."""

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from chamber.cli.infra import free_port
from chamber.collector import service as collector
from chamber.collector.agent.replicas import ReplicaStore, alive
from chamber.common.bus import Bus
from chamber.common.codec import Decoder
from chamber.common.contracts import (
    JobFinished,
    JobSpec,
    JobState,
    JobStopped,
    JobSubmitted,
    NodeInventory,
    ReplicaExited,
)
from chamber.common.jobstore import JobStore
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.common.subjects import INVENTORY
from chamber.gateway import service as gateway
from chamber.scheduler import service as scheduler
from tests.support.agents import in_state, job_events, no_leftovers, process_settings, record, replica_reports
from tests.support.gateway import bearer, gateway_client
from tests.support.jobs import command
from tests.support.services import eventually, running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture
def proc(settings: Settings, tmp_path: Path) -> Settings:
    return process_settings(settings, tmp_path / "agent")


@pytest.fixture
async def system(proc: Settings, tmp_path: Path, cleanup: None) -> AsyncIterator[None]:
    with no_leftovers(tmp_path / "agent"):
        async with running(proc, ("collector", collector.main), ("scheduler", scheduler.main)):
            yield


async def submit(bus: Bus, job_id: str, spec: JobSpec) -> None:
    await bus.publish(bus.names.job_submit(job_id), JobSubmitted(job_id=job_id, spec=spec, submitted_at=time.time()))


async def test_a_gang_starts_its_replicas_with_disjoint_gpus_and_the_gang_variables(
    bus: Bus, system: None, tmp_path: Path
) -> None:
    store = await JobStore.open(bus)
    out = tmp_path / "out"
    out.mkdir()
    spec = JobSpec(name="gang", team="ml", gpus_per_replica=4, replicas=2, command=command("env_dump", out))
    await submit(bus, "gang", spec)
    await eventually(lambda: in_state(store, "gang", "succeeded"), within=20, what="the gang ran and finished")
    seen = [json.loads((out / f"attempt1-replica{r}.json").read_text()) for r in (0, 1)]
    print(json.dumps({"gang": seen}, indent=1))
    done = await record(store, "gang")
    assert done is not None
    assert done.placement is not None
    inventory = {i.node.name: i.node for i in await bus.read_latest(INVENTORY, bus.names.subject("inventory.>"),
                                                                    Decoder(NodeInventory))}  # fmt: skip
    for r, env in enumerate(seen):
        placed = done.placement.gpus[r * 4 : (r + 1) * 4]
        node = inventory[placed[0].node]
        assert env["CUDA_VISIBLE_DEVICES"].split(",") == [node.gpus[g.index].uuid for g in placed]
        assert env["CHAMBER_REPLICA"] == str(r)
        assert env["CHAMBER_NODE"] == placed[0].node
        assert env["PET_NODE_RANK"] == str(r)
        assert env["sid"] != os.getsid(0), "its own session (its shim's), not the agent's"
    first, second = (set(env["CUDA_VISIBLE_DEVICES"].split(",")) for env in seen)
    assert not first & second, "disjoint GPUs"
    for key in ("CHAMBER_JOB_ID", "CHAMBER_ATTEMPT", "CHAMBER_REPLICAS", "MASTER_ADDR", "MASTER_PORT",
                "CHAMBER_CHECKPOINT_DIR", "PET_NNODES"):  # fmt: skip
        assert seen[0][key] == seen[1][key], key
    assert (seen[0]["CHAMBER_JOB_ID"], seen[0]["CHAMBER_REPLICAS"], seen[0]["MASTER_ADDR"]) == (
        "gang",
        "2",
        "127.0.0.1",
    )
    assert int(seen[0]["MASTER_PORT"]) > 0


async def test_exit_codes_map_to_succeeded_and_failed(bus: Bus, system: None, tmp_path: Path) -> None:
    store = await JobStore.open(bus)
    out = tmp_path / "out"
    out.mkdir()
    await submit(bus, "ok", JobSpec(name="ok", team="ml", gpus_per_replica=1, command=command("env_dump", out, 0)))
    await submit(bus, "bad", JobSpec(name="bad", team="ml", gpus_per_replica=1, command=command("env_dump", out, 3)))
    sleeper = command("checkpointing", out)
    fail_when_ready = f"while [ ! -e {out}/child.pid ]; do sleep 0.05; done; exit 7"  # replica 0 handles SIGTERM
    gang = ["/bin/sh", "-c", f'if [ "$CHAMBER_REPLICA" = 1 ]; then {fail_when_ready}; fi; exec "$@"', "sh", *sleeper]
    await submit(bus, "half", JobSpec(name="half", team="ml", gpus_per_replica=1, replicas=2, checkpoint_grace_s=0.5,
                                      command=gang))  # fmt: skip
    await submit(bus, "nosuch", JobSpec(name="nosuch", team="ml", gpus_per_replica=1, command=["/no/such/program"]))
    for job in ("ok", "bad", "half", "nosuch"):
        await eventually(partial(in_state, store, job, "succeeded", "failed"), within=30, what=f"{job} ended")
    finished = {}
    for job in ("ok", "bad", "half"):
        finished[job] = next(e for e in await job_events(bus, job) if isinstance(e, JobFinished))
    summary = {
        j: {"succeeded": e.succeeded, "exit_code": e.exit_code, "message": e.message} for j, e in finished.items()
    }
    nosuch = await record(store, "nosuch")
    assert nosuch is not None
    summary["nosuch"] = {"state": nosuch.state, "reason": nosuch.reason}
    print(json.dumps(summary, indent=1))
    assert (finished["ok"].succeeded, finished["ok"].exit_code) == (True, 0)
    assert (finished["bad"].succeeded, finished["bad"].exit_code) == (False, 3)
    assert "exited with code 3" in finished["bad"].message
    assert (finished["half"].succeeded, finished["half"].exit_code) == (False, 7)
    assert (out / "sigterm.json").exists(), "the other replica of the failed gang was stopped with SIGTERM"
    assert nosuch.state == "failed"
    assert "launch failed 3 times" in nosuch.reason
    assert "/no/such/program" in nosuch.reason


async def test_preemption_sends_sigterm_waits_the_grace_kills_the_group_and_the_job_resumes_from_its_checkpoint(
    bus: Bus, system: None, tmp_path: Path
) -> None:
    store = await JobStore.open(bus)
    out = tmp_path / "out"
    out.mkdir()
    grace = 1.0
    trainer = JobSpec(name="trainer", team="lab", gpus_per_replica=4, priority="research", checkpoint_grace_s=grace,
                      command=command("checkpointing", out))  # fmt: skip
    await submit(bus, "trainer", trainer)
    await eventually(lambda: in_state(store, "trainer", "running"), within=20, what="trainer running")
    await eventually((out / "child.pid").exists, what="trainer's child started")
    child = int((out / "child.pid").read_text())
    urgent = JobSpec(name="urgent", team="core", gpus_per_replica=4, replicas=2, priority="train",
                     command=command("env_dump", out, 0, 0.5))  # fmt: skip
    await submit(bus, "urgent", urgent)
    await eventually(lambda: in_state(store, "urgent", "succeeded"), within=30, what="urgent ran")
    await eventually(lambda: in_state(store, "trainer", "succeeded"), within=30, what="trainer resumed and finished")

    sigterm = json.loads((out / "sigterm.json").read_text())
    killed = next(
        r for r in await replica_reports(bus, "trainer") if isinstance(r, ReplicaExited) and r.attempt == 1
    )  # fmt: skip
    first, second = (json.loads((out / f"trainer-attempt{a}.json").read_text()) for a in (1, 2))
    stopped = next(e for e in await job_events(bus, "trainer") if isinstance(e, JobStopped))
    done = await record(store, "trainer")
    assert done is not None
    print(json.dumps({"sigterm_at": sigterm["at"], "killed": {"signal": killed.signal, "exited_at": killed.exited_at,
                      "after_sigterm_s": round(killed.exited_at - sigterm["at"], 3)}, "attempt1": first,
                      "attempt2": second, "stopped": {"graceful": stopped.graceful, "reason": stopped.reason}},
                     indent=1))  # fmt: skip
    assert killed.signal == 9, "it ignored SIGTERM, so the grace ended in SIGKILL"
    assert killed.stop_requested
    assert grace - 0.2 <= killed.exited_at - sigterm["at"] <= grace + 2.0
    assert not alive(child, ""), "the whole process group was killed, the child that ignored SIGTERM too"
    assert stopped.graceful
    assert first["checkpoint_dir"] == second["checkpoint_dir"], "the same checkpoint directory across attempts"
    assert (first["found"], second["found"]) == ([], ["state"])
    assert (done.attempt, done.preemptions) == (2, 1)


async def test_logs_are_served_and_followed(proc: Settings, bus: Bus, tmp_path: Path) -> None:
    small = msgspec.structs.replace(proc, agent_log_max_bytes=8192, http_port=free_port())
    store = await JobStore.open(bus)
    services = (("collector", collector.main), ("scheduler", scheduler.main), ("gateway", gateway.main))
    with no_leftovers(tmp_path / "agent"):
        async with (
            running(small, *services),
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{small.http_port}", timeout=30, headers=bearer(small.admin_token)
            ) as client,
        ):
            await submit(bus, "chatty", JobSpec(name="chatty", team="ml", gpus_per_replica=1,
                                                command=command("chatty", 60, 40, 40)))  # fmt: skip
            await eventually(lambda: in_state(store, "chatty", "running"), within=20, what="chatty running")
            arrivals: list[tuple[float, bytes]] = []
            async with client.stream("GET", "/v1/jobs/chatty/logs", params={"follow": "true"}) as followed:
                assert followed.status_code == 200
                async for chunk in followed.aiter_bytes():
                    arrivals.append((time.monotonic(), chunk))
            text = b"".join(c for _, c in arrivals).decode()
            lines = text.splitlines()
            assert [int(line.split()[0]) for line in lines] == list(range(60)), "every line, in order, once"
            assert arrivals[-1][0] - arrivals[0][0] > 0.5, "streamed as written, not at the end"
            await eventually(lambda: in_state(store, "chatty", "succeeded"), what="chatty finished")
            whole = await client.get("/v1/jobs/chatty/logs")
            assert whole.text == text
            assert whole.headers["x-chamber-next-offset"] == str(60 * 40)
            assert whole.headers["x-chamber-running"] == "false"
            rest = await client.get("/v1/jobs/chatty/logs", params={"offset": 59 * 40})
            assert rest.text.startswith("000059 ")
            assert (await client.get("/v1/jobs/nosuch/logs")).status_code == 404
            assert (await client.get("/v1/jobs/chatty/logs", params={"replica": 3})).status_code == 400
            assert (await client.get("/v1/jobs/chatty/logs", params={"attempt": 9})).status_code == 404

            await submit(bus, "flood", JobSpec(name="flood", team="ml", gpus_per_replica=1,
                                               command=command("chatty", 2000, 50, 0)))  # fmt: skip
            await eventually(lambda: in_state(store, "flood", "succeeded"), within=20, what="flood finished")
            kept = await client.get("/v1/jobs/flood/logs")
            assert int(kept.headers["x-chamber-offset"]) > 0, "the oldest output was rotated away"
            assert int(kept.headers["x-chamber-next-offset"]) == 2000 * 50
            assert len(kept.content) <= 8192, "bounded per replica and attempt"
            assert kept.text.endswith(f"001999 {'x' * 42}\n")
            headers = {k: v for k, v in kept.headers.items() if k.startswith("x-chamber")}
            print(json.dumps({"followed_chunks": len(arrivals), "followed_lines": len(lines), "flood": headers}))


async def test_workloads_are_validated_at_submission(proc: Settings, cleanup: None) -> None:
    async with gateway_client(proc) as client:
        base: dict[str, Any] = {"name": "j", "team": "ml", "gpus_per_replica": 1}
        cases = {
            "no command": (base | {"duration_s": 5}, "command: required"),
            "duration": (base | {"command": ["true"], "duration_s": 5}, "duration_s: only for simulated jobs"),
            "empty argv": (base | {"command": []}, "command"),
            "bad env name": (base | {"command": ["true"], "env": {"1X": "a"}}, "env"),
            "reserved env": (base | {"command": ["true"], "env": {"CUDA_VISIBLE_DEVICES": "3"}}, "set by Chamber"),
            "relative dir": (base | {"command": ["true"], "working_dir": "tmp"}, "absolute path"),
        }
        for name, (body, message) in cases.items():
            resp = await client.post("/v1/jobs", json=body)
            assert resp.status_code == 400, (name, resp.text)
            assert message in resp.text, (name, resp.text)
        ok = await client.post("/v1/jobs", json=base | {"command": ["true"], "env": {"LR": "3e-4"}})
        assert ok.status_code == 201, ok.text
    simulated = msgspec.structs.replace(proc, executor="simulated")
    async with gateway_client(simulated) as client:
        resp = await client.post("/v1/jobs", json={"name": "j", "team": "ml", "gpus_per_replica": 1,
                                                   "command": ["python", "train.py"]})  # fmt: skip
        assert resp.status_code == 400
        assert "CHAMBER_EXECUTOR=process" in resp.text


async def test_a_cancelled_job_is_stopped_and_its_process_group_killed(bus: Bus, system: None, tmp_path: Path) -> None:
    store = await JobStore.open(bus)
    out = tmp_path / "out"
    out.mkdir()
    await submit(bus, "c", JobSpec(name="c", team="ml", gpus_per_replica=1, checkpoint_grace_s=5.0,
                                   command=command("checkpointing", out)))  # fmt: skip
    await eventually((out / "child.pid").exists, within=20, what="running with its child")
    child = int((out / "child.pid").read_text())
    from chamber.common.contracts import JobCancelRequested

    await bus.publish(bus.names.job_cancel("c"), JobCancelRequested(job_id="c", requested_at=time.time()))
    await eventually(lambda: in_state(store, "c", "cancelled"), within=10, what="cancelled")
    await eventually(lambda: not alive(child, ""), within=2, what="the group is gone")


async def test_rogue_processes_on_a_gpu_are_counted_by_the_node_agent(
    bus: Bus, tmp_path: Path, settings: Settings
) -> None:
    """A process on a GPU that no job placed on it owns, next to one that a replica of a job does."""
    from chamber.collector.agent.host import runner_config
    from chamber.collector.agent.server import AgentServer
    from chamber.collector.nvml import NvmlReader, NvmlSource
    from chamber.common.clock import SystemClock
    from chamber.common.contracts import LaunchReplicas, Pool, ReplicaAssignment, StopReplicas, TopologyLabels
    from tests.support.fakenvml import H100, FakeNvml

    fake = FakeNvml([H100 | {"procs": []}, H100 | {"procs": []}])
    reader = NvmlReader(fake)
    source = NvmlSource(reader, "gpu-1", Pool(name="p", gpu_model="H100"), TopologyLabels(), 1.0)
    ctx = make_context(process_settings(settings, tmp_path / "agent"), "collector")
    server = AgentServer(bus, SystemClock(), runner_config(ctx, source.node, "127.0.0.1"))
    runner = server.runner
    source.owner = server.owner
    out = tmp_path / "out"
    out.mkdir()
    with no_leftovers(tmp_path / "agent"):
        await server.start()
        try:
            launch = LaunchReplicas(job_id="j", attempt=1, replicas=1, command=command("checkpointing", out),
                                    assignments=[ReplicaAssignment(replica=0, gpus=[1])])  # fmt: skip
            reply = runner.launch(launch)
            assert reply.ok
            await eventually((out / "child.pid").exists, what="the replica runs")
            replica = runner.replicas[("j", 1, 0)]
            await eventually(lambda: replica.state.child_pid, what="its start recorded")
            fake.devices[1]["procs"] = [(replica.state.child_pid, 1024**3), (os.getpid(), 1024**3)]
            fake.devices[0]["procs"] = [(replica.state.child_pid, 1024**3)]
            (batch,) = source.sample(time.time(), {})
            gpu0, gpu1 = batch.gpus
            print(json.dumps({"gpu1": [[p.pid, p.job_id] for p in gpu1.processes or []],
                              "unallocated": [gpu0.unallocated_processes, gpu1.unallocated_processes]}))  # fmt: skip
            assert [(p.pid, p.job_id) for p in gpu1.processes or []] == [
                (replica.state.child_pid, "j"),
                (os.getpid(), ""),
            ]
            assert gpu1.unallocated_processes == 1, "this test's own process is on GPU 1 without a job"
            assert gpu0.unallocated_processes == 1, "the job's process on a GPU it was not given counts too"
            runner.stop(StopReplicas(job_id="j", attempt=1, replicas=[0]))
            await eventually(lambda: not replica.live, what="stopped")
        finally:
            await server.close()
            reader.close()


async def test_a_replica_the_scheduler_does_not_know_is_stopped(bus: Bus, system: None, tmp_path: Path) -> None:
    """No process keeps GPUs that the ledger does not give it: a replica nobody placed (a leftover, a launch
    that arrived after its job moved on) is listed in its agent's heartbeat, and the executor stops it."""
    from chamber.common.codec import encode
    from chamber.common.contracts import AgentReply, LaunchReplicas, ReplicaAssignment

    ghost = LaunchReplicas(job_id="ghost", attempt=1, replicas=1, assignments=[ReplicaAssignment(replica=0, gpus=[2])],
                           command=[sys.executable, "-c", "import time; time.sleep(600)"])  # fmt: skip
    await asyncio.sleep(1.0)  # the executor has started (the scheduler resynced)
    reply = await bus.nc.request(bus.names.agent_request("node-0001", "launch"), encode(ghost), timeout=5)
    assert Decoder(AgentReply).decode(reply.data).ok

    async def ended() -> list[Any]:
        return [r for r in await replica_reports(bus, "ghost") if isinstance(r, ReplicaExited)]

    await eventually(ended, within=10, what="the executor had it stopped")
    (exited,) = await ended()
    assert exited.stop_requested
    assert exited.signal == 9, "at once, without a grace"
    ((_, state),) = [
        found for root in (tmp_path / "agent").glob("*/agent/*") for found in ReplicaStore(root).load_all()
    ]  # fmt: skip
    assert not alive(state.shim_pid, ""), "its process group is gone"


async def test_a_node_without_an_agent_fails_the_launch_with_the_reason(
    settings: Settings, bus: Bus, tmp_path: Path
) -> None:
    from chamber.common.contracts import GpuDevice, Node, Pool

    proc = process_settings(settings, tmp_path / "agent", agent_timeout_s=1.0)
    store = await JobStore.open(bus)
    node = Node(name="no-agent", pool="lonely", gpus=[GpuDevice(index=0, uuid="GPU-x", model="H100")])
    inventory = NodeInventory(node=node, pool=Pool(name="lonely", gpu_model="H100"), observed_at=time.time())
    await bus.publish(bus.names.inventory("no-agent"), inventory)
    with no_leftovers(tmp_path / "agent"):
        async with running(proc, ("collector", collector.main), ("scheduler", scheduler.main)):
            await submit(bus, "orphan", JobSpec(name="orphan", team="ml", gpus_per_replica=1, pool="lonely",
                                                command=["true"]))  # fmt: skip
            await eventually(lambda: in_state(store, "orphan", "failed"), within=30, what="the launch failed")
            failed = await record(store, "orphan")
            assert failed is not None
            assert failed.reason == "launch failed 3 times: no node agent answers on no-agent"
            assert failed.interruptions == 0, "judged by its launch, not as a lost agent"


async def test_an_attempt_whose_record_moved_on_is_stopped(bus: Bus, system: None, tmp_path: Path) -> None:
    """The executor follows the writes of the jobs bucket: a version of a running job's record that no longer
    holds its attempt (written by another leader, say) stops that attempt's processes (it will hear of it no
    other way)."""
    store = await JobStore.open(bus)
    out = tmp_path / "out"
    out.mkdir()
    await submit(bus, "moved", JobSpec(name="moved", team="ml", gpus_per_replica=1, command=command("until_file", out)))
    await eventually(lambda: in_state(store, "moved", "running"), within=20, what="the job runs")
    stored = await store.get("moved")
    assert stored is not None
    running_record, revision = stored
    ended = msgspec.structs.replace(running_record, state=JobState.FAILED, version=running_record.version + 1,
                                    reason="ended elsewhere", finished_at=time.time())  # fmt: skip
    await store.update(ended, revision)

    async def exited() -> list[ReplicaExited]:
        return [r for r in await replica_reports(bus, "moved") if isinstance(r, ReplicaExited)]

    await eventually(exited, within=20, what="the attempt's process stopped")
    found = await exited()
    assert found[0].attempt == running_record.attempt
    assert not (out / "go").exists(), "stopped, not finished"
