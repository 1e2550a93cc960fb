"""The node agent's replicas as real processes: a shim that dies without recording an exit (the OOM killer,
kill -9) takes its command with it before the replica is reported exited, and a shim that cannot write its log
(a full disk) keeps supervising."""

import asyncio
import contextlib
import dataclasses
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chamber.collector.agent.replicas import alive
from chamber.collector.agent.reports import LOST, pending_reports
from chamber.collector.agent.runner import NodeRunner, Replica, RunnerConfig
from chamber.common.clock import SystemClock
from chamber.common.contracts import GpuDevice, LaunchReplicas, ReplicaAssignment, ReplicaExited

pytestmark = pytest.mark.timeout(60)
KEY = ("j1", 1, 0)


def config(tmp_path: Path) -> RunnerConfig:
    return RunnerConfig(
        node="n1", gpus=[GpuDevice(index=0, uuid="GPU-a", model="H100")], root=tmp_path / "agent",
        checkpoint_root=tmp_path / "ck", address="127.0.0.1", timeout_s=3600,
    )  # fmt: skip


def launch(runner: NodeRunner, command: list[str]) -> Replica:
    req = LaunchReplicas(job_id="j1", attempt=1, replicas=1, assignments=[ReplicaAssignment(replica=0, gpus=[0])],
                         command=command)  # fmt: skip
    assert runner.launch(req).ok
    return runner.replicas[KEY]


async def until(check: Callable[[], object], within_s: float = 10.0) -> None:
    async with asyncio.timeout(within_s):
        while not check():  # noqa: ASYNC110 - polling another process's effects
            await asyncio.sleep(0.02)


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids to SIGKILL after the test (a failed test leaves no sleep behind), and zombie shims to reap."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


async def started_sleeper(runner: NodeRunner, tmp_path: Path, leftovers: list[int]) -> tuple[Replica, int]:
    pidfile = tmp_path / "child.pid"
    replica = launch(runner, ["sh", "-c", f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; exec sleep 1000"])
    leftovers.append(replica.state.shim_pid)
    await until(lambda: replica.state.started_at is not None and pidfile.exists())
    child = int(pidfile.read_text())
    leftovers.append(child)
    assert alive(child, "")
    return replica, child


def lost_exit(replica: Replica) -> ReplicaExited:
    reports = [r for what, r in pending_reports("n1", replica.state) if what == "exited"]
    assert len(reports) == 1
    (exited,) = reports
    assert isinstance(exited, ReplicaExited)
    assert (exited.lost, exited.exit_code, exited.message) == (True, None, LOST)
    return exited


async def test_a_shim_killed_without_an_exit_record_takes_its_command_with_it(
    tmp_path: Path, leftovers: list[int]
) -> None:
    runner = NodeRunner(SystemClock(), config(tmp_path))
    try:
        replica, child = await started_sleeper(runner, tmp_path, leftovers)
        os.kill(replica.state.shim_pid, signal.SIGKILL)  # the OOM killer
        await until(lambda: replica.state.ending is not None)
        assert not alive(child, ""), "the command still runs on the GPU the ledger is about to free"
        lost_exit(replica)
        assert runner.live() == []
    finally:
        await runner.close()


async def test_an_agent_restarted_after_a_shim_died_kills_its_command_before_reporting(
    tmp_path: Path, leftovers: list[int]
) -> None:
    first = NodeRunner(SystemClock(), config(tmp_path))
    replica, child = await started_sleeper(first, tmp_path, leftovers)
    await first.close()  # the agent goes; the replica keeps running
    os.kill(replica.state.shim_pid, signal.SIGKILL)  # and its shim dies while nobody watches
    await until(lambda: not alive(replica.state.shim_pid, replica.state.shim_start))
    second = NodeRunner(SystemClock(), config(tmp_path))
    try:
        second.adopt()
        adopted = second.replicas[KEY]
        await until(lambda: adopted.state.ending is not None)
        assert not alive(child, ""), "the command still runs on the GPU the ledger is about to free"
        lost_exit(adopted)
    finally:
        await second.close()


async def test_a_shim_that_cannot_write_the_log_keeps_supervising_and_records_the_exit(
    tmp_path: Path, leftovers: list[int]
) -> None:
    runner = NodeRunner(SystemClock(), config(tmp_path))
    log = runner.store.directory(*KEY) / "log"
    log.mkdir(parents=True)
    (log / f"{0:020d}.log").symlink_to("/dev/full")  # every write: ENOSPC
    try:
        replica = launch(runner, ["sh", "-c", "for i in 1 2 3; do echo output $i; sleep 0.1; done; exit 3"])
        leftovers.append(replica.state.shim_pid)
        await until(lambda: replica.state.ending is not None)
        assert replica.state.ending is not None
        assert (replica.state.ending.lost, replica.state.ending.exit_code) == (False, 3)
    finally:
        await runner.close()


DETACHING = """
import os, subprocess, sys, time
worker = subprocess.Popen(['sleep', '1000'], start_new_session=True)  # as torchrun starts each worker
open(sys.argv[1] + '.tmp', 'w').write(str(worker.pid)); os.rename(sys.argv[1] + '.tmp', sys.argv[1])
time.sleep(1000)
"""


@pytest.mark.parametrize("how", ["stopped", "shim-killed"])
async def test_a_worker_in_a_session_of_its_own_goes_with_its_replica(
    tmp_path: Path, leftovers: list[int], how: str
) -> None:
    """torchrun's workers leave the shim's process group; signalling the group alone left them running on GPUs
    the scheduler had already given to another job, and counted as rogue processes."""
    import sys

    from chamber.collector.agent.marker import marked
    from chamber.common.contracts import StopReplicas

    runner = NodeRunner(SystemClock(), config(tmp_path))
    try:
        pidfile = tmp_path / "worker.pid"
        replica = launch(runner, [sys.executable, "-c", DETACHING, str(pidfile)])
        leftovers.append(replica.state.shim_pid)
        await until(pidfile.exists)
        worker = int(pidfile.read_text())
        leftovers.append(worker)
        assert os.getsid(worker) == worker != replica.state.shim_pid, "out of the shim's session and group"
        assert runner.owner(worker, 0) == "j1", "its GPU work is the job's, not rogue"
        assert worker in marked(replica.state.marker)
        if how == "stopped":
            runner.stop(StopReplicas(job_id="j1", attempt=1, grace_s=0.5, reason="preempted"))
        else:
            os.kill(replica.state.shim_pid, signal.SIGKILL)  # the OOM killer picks the shim
        await until(lambda: replica.state.ending is not None, 15)
        assert not alive(worker, ""), "the worker is gone before the replica is reported ended"
    finally:
        await runner.close()


COUNTING_TERMS = """
import signal, sys, time
def on_term(signum, frame):
    open(sys.argv[1], 'a').write('SIGTERM\\n')
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[1] + '.ready', 'w').close()
while True:
    time.sleep(0.05)
"""


async def test_a_repeated_shorter_stop_moves_the_kill_earlier_without_a_second_sigterm(
    tmp_path: Path, leftovers: list[int]
) -> None:
    """An executor restarted during a preemption re-sends the stop with what is left of the grace (a little less,
    computed from the record): a second SIGTERM reads, to torchrun, as an interruption of its own shutdown."""
    import sys

    from chamber.common.contracts import StopReplicas

    runner = NodeRunner(SystemClock(), config(tmp_path))
    try:
        terms = tmp_path / "terms"
        replica = launch(runner, [sys.executable, "-c", COUNTING_TERMS, str(terms)])
        leftovers.append(replica.state.shim_pid)
        await until(lambda: Path(f"{terms}.ready").exists())
        runner.stop(StopReplicas(job_id="j1", attempt=1, grace_s=60, reason="preempted"))
        await until(terms.exists)
        runner.stop(StopReplicas(job_id="j1", attempt=1, grace_s=1.0, reason="preempted"))  # resent, shorter
        await until(lambda: replica.state.ending is not None, 15)
        assert terms.read_text() == "SIGTERM\n", "one SIGTERM; the kill came at the shorter deadline"
        assert replica.state.ending is not None
        assert replica.state.ending.signal == signal.SIGKILL
    finally:
        await runner.close()


async def test_a_replica_whose_state_file_is_unreadable_is_not_left_running(
    tmp_path: Path, leftovers: list[int]
) -> None:
    """The agent cannot supervise or report a replica it cannot read back (a state file emptied by a power loss
    before it was written durably, which it is now): what runs of it is killed, found by its marker."""
    runner = NodeRunner(SystemClock(), config(tmp_path))
    _, child = await started_sleeper(runner, tmp_path, leftovers)
    directory = runner.store.directory(*KEY)
    await runner.close()
    (directory / "state.json").write_bytes(b"")
    restarted = NodeRunner(SystemClock(), config(tmp_path))
    try:
        restarted.adopt()
        await until(lambda: not alive(child, ""), 10)
        assert KEY not in restarted.replicas
    finally:
        await restarted.close()


EXITS_ON_TERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda s, f: sys.exit(0))
while True:
    time.sleep(0.05)
"""


async def test_a_stop_right_after_the_launch_stops_the_command_not_the_shim(
    tmp_path: Path, leftovers: list[int]
) -> None:
    """The shim used to die of a SIGTERM that came before it installed its handler: the replica was reported lost
    (an interruption), not stopped. Now the signal waits, masked, and the command gets it once it runs."""
    import sys

    from chamber.common.contracts import StopReplicas

    runner = NodeRunner(SystemClock(), config(tmp_path))
    try:
        replica = launch(runner, [sys.executable, "-c", EXITS_ON_TERM])
        leftovers.append(replica.state.shim_pid)
        runner.stop(StopReplicas(job_id="j1", attempt=1, grace_s=30, reason="preempted"))
        await until(lambda: replica.state.ending is not None, 15)
        ending = replica.state.ending
        assert ending is not None
        assert not ending.lost, ending
        assert (ending.exit_code, ending.signal) in ((0, None), (None, signal.SIGTERM)), ending
        reports = [r for what, r in pending_reports("n1", replica.state) if what == "exited"]
        assert isinstance(reports[0], ReplicaExited)
        assert reports[0].stop_requested
    finally:
        await runner.close()


async def test_gpus_are_named_by_their_own_index_when_one_is_missing(tmp_path: Path, leftovers: list[int]) -> None:
    """A GPU unreadable at the agent's start keeps its index, so the node's GPUs are 0, 2 and 3: a replica placed
    on GPU 2 sees GPU 2's UUID, and GPU 1 is refused."""
    gpus = [GpuDevice(index=i, uuid=f"GPU-{i}", model="H100") for i in (0, 2, 3)]
    runner = NodeRunner(SystemClock(), dataclasses.replace(config(tmp_path), gpus=gpus))
    try:
        missing = LaunchReplicas(job_id="j0", attempt=1, replicas=1, command=["true"],
                                 assignments=[ReplicaAssignment(replica=0, gpus=[1])])  # fmt: skip
        refused = runner.launch(missing)
        assert not refused.ok
        assert "no GPU [1]" in refused.error
        req = LaunchReplicas(job_id="j1", attempt=1, replicas=1, command=["true"],
                             assignments=[ReplicaAssignment(replica=0, gpus=[2, 3])])  # fmt: skip
        assert runner.launch(req).ok
        replica = runner.replicas[KEY]
        leftovers.append(replica.state.shim_pid)
        assert replica.state.visible_devices == "GPU-2,GPU-3"
        await until(lambda: not replica.live)
    finally:
        await runner.close()


async def test_a_stop_does_not_wait_on_the_scan_for_the_replicas_processes(
    tmp_path: Path, leftovers: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan of every process's environment (for a replica's processes outside its group) can block on a
    process stuck in the driver: it runs off the event loop, so the agent's heartbeats and requests go on, and the
    signals still go out."""
    import time

    from chamber.collector.agent.marker import signal_marked as real
    from chamber.common.contracts import StopReplicas

    scanned = []

    def stuck_scan(marker: str, sig: int, outside_group: int = 0) -> None:
        time.sleep(1.0)  # a read of /proc/<pid>/environ waiting on a process in the driver
        real(marker, sig, outside_group)
        scanned.append(sig)

    monkeypatch.setattr("chamber.collector.agent.runner.signal_marked", stuck_scan)
    runner = NodeRunner(SystemClock(), config(tmp_path))
    try:
        replica, child = await started_sleeper(runner, tmp_path, leftovers)
        loop = asyncio.get_running_loop()
        started = loop.time()
        runner.stop(StopReplicas(job_id="j1", attempt=1, grace_s=0.0, reason="preempted"))
        assert loop.time() - started < 0.5, "the request was answered without waiting on the scan"
        await until(lambda: replica.state.ending is not None, 15)
        await until(lambda: signal.SIGKILL in scanned, 5)
        assert not alive(child, "")
    finally:
        await runner.close()


CHECKPOINTS_ON_TERM = """
import signal, sys, time
def on_term(*_):
    time.sleep(1.5)  # writing the checkpoint
    open(sys.argv[1], "w").write("checkpoint")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[1] + ".ready", "w").write("")
time.sleep(1000)
"""


async def test_a_trainer_behind_a_shell_wrapper_gets_its_whole_grace(tmp_path: Path, leftovers: list[int]) -> None:
    """Found by review: `sh -c "cd ... && python train.py"` dies on the stop's SIGTERM at once; the shim then
    killed the whole group, so the trainer, still writing its checkpoint, was killed 0.2 s into a 10 s grace.
    The rest of a stopped group has until the grace's end."""
    import sys

    from chamber.common.contracts import StopReplicas

    script, checkpoint = tmp_path / "train.py", tmp_path / "ck.txt"
    script.write_text(CHECKPOINTS_ON_TERM)
    runner = NodeRunner(SystemClock(), config(tmp_path))
    try:
        # A job of its own: the marker scan an earlier test left stuck (on purpose) kills what carries j1's marker.
        command = ["sh", "-c", f"cd {tmp_path} && {sys.executable} train.py {checkpoint}; echo ended"]
        req = LaunchReplicas(job_id="wrapped", attempt=1, replicas=1, command=command,
                             assignments=[ReplicaAssignment(replica=0, gpus=[0])])  # fmt: skip
        assert runner.launch(req).ok
        replica = runner.replicas[("wrapped", 1, 0)]
        leftovers.append(replica.state.shim_pid)
        await until(lambda: Path(f"{checkpoint}.ready").exists(), 15)
        runner.stop(StopReplicas(job_id="wrapped", attempt=1, grace_s=10.0, reason="preempted"))
        await until(lambda: replica.state.ending is not None, 15)
        assert checkpoint.read_text() == "checkpoint", "killed before its checkpoint was written"
    finally:
        await runner.close()


async def test_a_stop_for_a_replica_whose_shim_pid_was_reused_signals_no_other_process(
    tmp_path: Path, leftovers: list[int]
) -> None:
    """Known before (found reading `_signal`): a stop that came while a replica whose shim was gone settled sent
    SIGTERM, then SIGKILL, to the process group of the shim's old pid, which may by then lead another group (the
    kill path checked the shim's start time; the stop did not). Here the replica's shim pid is that of an unrelated
    group leader started after the shim: the stop signals nothing of it."""
    import sys

    from chamber.collector.agent.replicas import ReplicaState, process_start
    from chamber.common.contracts import StopReplicas

    decoy = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(1000)",
                                                 start_new_session=True)  # fmt: skip
    leftovers.append(decoy.pid)
    await until(lambda: process_start(decoy.pid) != "")
    runner = NodeRunner(SystemClock(), config(tmp_path))
    try:
        state = ReplicaState(job_id="j1", attempt=1, replica=0, replicas=1, gpus=[0], shim_pid=decoy.pid,
                             shim_start=str(int(process_start(decoy.pid)) - 1), started_at=1.0)  # fmt: skip
        runner.replicas[KEY] = Replica(runner.store.directory(*KEY), state)
        runner.stop(StopReplicas(job_id="j1", attempt=1, grace_s=0.0, reason="preempted"))  # SIGKILL at once
        await asyncio.sleep(0.3)
        assert alive(decoy.pid, ""), "the process that now has the shim's old pid was signalled"
        runner.replicas.pop(KEY)
    finally:
        await runner.close()
        decoy.kill()
        await decoy.wait()
