"""`chamber device-check` (what `deploy/device-check.sh` runs): does Chamber work on this GPU machine?

1. NVML: the GPUs it lists (UUIDs, models, MIG profiles), and one sample per GPU with the GPM fields (SM, tensor
   and DRAM activity over one second, the usage derived from them).
2. The whole system (`chamber up` on embedded NATS and Redis, node agent, process executor): a one-GPU job that
   runs a small CUDA workload (matrix products for 3 s with PyTorch if this Python has it, else `nvidia-smi`, else
   only its environment) is placed, started and finished; its output shows the `CUDA_VISIBLE_DEVICES` it was
   given, and the fleet view (the node's NVML telemetry, through the bus) what its GPU did while it ran.

Everything is reported as one JSON document; `ok` says whether all of it worked. With
`CHAMBER_NVML_MODULE=tests.support.fakenvml:TWO_H100` it runs on any machine against the tests' fake NVML.
"""

import contextlib
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import msgspec

from chamber.cli.infra import free_port

TORCH_WORKLOAD = """
import json, os, time, torch
assert torch.cuda.is_available(), "CUDA is not available to PyTorch"
x = torch.randn(4096, 4096, device="cuda")
y = x @ x
torch.cuda.synchronize()
t = time.perf_counter()
n = 0
while time.perf_counter() - t < 3.0:  # long enough for the node's telemetry to see the GPU at work
    for _ in range(20):
        y = x @ x
    torch.cuda.synchronize()
    n += 20
dt = time.perf_counter() - t
print(json.dumps({"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "device_count": torch.cuda.device_count(), "device": torch.cuda.get_device_name(0),
    "tflops": round(n * 2 * 4096**3 / dt / 1e12, 1), "checksum": float(y[0, 0])}))
"""
ENV_WORKLOAD = """
import json, os
keys = ("CUDA_VISIBLE_DEVICES", "CHAMBER_JOB_ID", "CHAMBER_ATTEMPT", "CHAMBER_REPLICA", "CHAMBER_REPLICAS",
        "CHAMBER_CHECKPOINT_DIR", "MASTER_ADDR", "MASTER_PORT")
print(json.dumps({k: os.environ.get(k) for k in keys}))
"""
VISIBLE = re.compile(r'CUDA_VISIBLE_DEVICES"?\s*[:=]\s*"?([^"\s]*)')
SAMPLE_FIELDS = (
    "index", "uuid", "sm_activity", "tensor_activity", "dram_activity", "usage", "gpu_util", "power_w",
    "power_limit_w", "temperature_c", "mem_used_mb", "processes", "unallocated_processes",
)  # fmt: skip


def workload() -> tuple[str, list[str]]:
    """The small CUDA job: PyTorch if this Python or the `python3` on PATH has it, else nvidia-smi, else (no GPU
    stack at all) the environment only."""
    python = _python_with_torch()
    if python is not None:
        return f"pytorch ({python})", [python, "-c", TORCH_WORKLOAD]
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        script = 'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; exec "$0" -L'
        return "nvidia-smi", ["/bin/sh", "-c", script, smi]
    return "environment only (no PyTorch, no nvidia-smi)", [sys.executable, "-c", ENV_WORKLOAD]


def _python_with_torch() -> str | None:
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    other = shutil.which("python3")
    if other is None or Path(other).resolve() == Path(sys.executable).resolve():
        return None
    try:
        found = subprocess.run([other, "-c", "import torch"], capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return other if found.returncode == 0 else None


def read_nvml(module: str) -> dict[str, Any]:
    from chamber.collector.nvml import NvmlReader, load_nvml

    nvml = load_nvml(module)
    reader = NvmlReader(nvml)
    try:
        gpus = [msgspec.to_builtins(d) for d in reader.devices()]
        time.sleep(1.0)  # GPM activity is measured between two snapshots: this one and the one taken at start
        samples = [msgspec.to_builtins(reader.sample(i)) for i in reader.present]
        driver = ""
        with contextlib.suppress(Exception):
            raw = nvml.nvmlSystemGetDriverVersion()
            driver = raw.decode() if isinstance(raw, bytes) else str(raw)
    finally:
        reader.close()
    return {
        "driver": driver,
        "gpus": gpus,
        "samples": [{k: s.get(k) for k in SAMPLE_FIELDS} for s in samples],
        "gpm": any(s.get("sm_activity") is not None for s in samples),
    }


def run(timeout_s: float = 180.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    result: dict[str, Any] = {"ok": False}
    module = os.environ.get("CHAMBER_NVML_MODULE", "")
    try:
        result["nvml"] = read_nvml(module)
    except Exception as exc:  # NVML missing, no driver: the check's answer, not a crash
        result["error"] = f"NVML: {type(exc).__name__}: {exc}"
        return result
    if not result["nvml"]["gpus"]:
        result["error"] = "NVML found no GPU"
        return result
    kind, command = workload()
    with tempfile.TemporaryDirectory(prefix="chamber-device-check-") as tmp:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHAMBER_")} | {
            "CHAMBER_EMBEDDED": "1", "CHAMBER_HTTP_PORT": str(port), "CHAMBER_METRICS_PORT": "0",
            "CHAMBER_NAMESPACE": f"devcheck{secrets.token_hex(3)}", "CHAMBER_EXECUTOR": "process",
            "CHAMBER_COLLECTOR_ROLE": "local", "CHAMBER_AGENT_STATE_DIR": tmp, "CHAMBER_TELEMETRY_INTERVAL_S": "1",
            "CHAMBER_NVML_MODULE": module, "PYTHONUNBUFFERED": "1", "CHAMBER_ADMIN_TOKEN": TOKEN,
        }  # fmt: skip
        log_path = Path(tmp) / "chamber-up.log"
        with open(log_path, "wb") as log:
            up = subprocess.Popen([sys.executable, "-m", "chamber.cli.main", "up"], env=env, stdout=log, stderr=log)
        try:
            result["job"] = _run_job(f"http://127.0.0.1:{port}", kind, command, deadline)
            result["ok"] = result["job"].get("state") == "succeeded" and _seen_at_work(kind, result["job"])
        except Exception as exc:  # report what failed, with the system's log
            result["error"] = f"{type(exc).__name__}: {exc}"
            result["log_tail"] = log_path.read_text(errors="replace")[-4000:]
        finally:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(timeout=30)
            except subprocess.TimeoutExpired:
                up.kill()
    return result


def _seen_at_work(kind: str, job: dict[str, Any]) -> bool:
    """A PyTorch workload computes for 3 s: the fleet view must have shown its GPU as the job's, and busy. (The
    other workloads end too fast for a telemetry interval to see them.)"""
    if not kind.startswith("pytorch"):
        return True
    seen = job["telemetry_while_running"]
    return bool(seen["held_by_job"]) and (seen["max_util"] or 0.0) > 0.0


def _run_job(url: str, kind: str, command: list[str], deadline: float) -> dict[str, Any]:
    nodes = _wait(lambda: _nodes(url), deadline, "the node agent's inventory")
    spec = {"name": "device-check", "team": "ops", "gpus_per_replica": 1, "command": command}
    status, body = _http(url, "POST", "/v1/jobs", spec)
    if status != 201:
        raise RuntimeError(f"submit refused: {status} {body!r}")
    job_id = json.loads(body)["id"]
    t0 = time.monotonic()
    timeline: list[dict[str, Any]] = []
    view: dict[str, Any] = {}
    placement = None
    seen = _Seen(job_id)
    while time.monotonic() < deadline:
        view = json.loads(_http(url, "GET", f"/v1/jobs/{job_id}")[1])
        placement = placement or view.get("placement")
        if view["state"] == "running" and placement:
            seen.look(url, placement["gpus"])
        moment = {"state": view["state"], "reason": view.get("reason", ""), "after_s": round(time.monotonic() - t0, 2)}
        if not timeline or (timeline[-1]["state"], timeline[-1]["reason"]) != (moment["state"], moment["reason"]):
            timeline.append(moment)
        if view["state"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.1)
    status, body = _http(url, "GET", f"/v1/jobs/{job_id}/events")
    events = json.loads(body).get("events", []) if status == 200 else []
    lifecycle = [{"kind": e["kind"], "after_s": round(e["at"] - events[0]["at"], 3)} for e in events] if events else []
    status, body = _http(url, "GET", f"/v1/jobs/{job_id}/logs")
    output = body.decode(errors="replace") if status == 200 else f"({status}: {body!r})"
    match = VISIBLE.search(output)
    visible = match.group(1) if match else None
    return {
        "id": job_id, "workload": kind, "nodes": nodes, "placement": placement, "state": view.get("state"),
        "reason": view.get("reason"), "timeline": timeline, "events": lifecycle, "cuda_visible_devices": visible,
        "telemetry_while_running": seen.report(), "output": output[-2000:],
    }  # fmt: skip


class _Seen:
    """What the fleet view (`GET /v1/fleet/gpus`: the node's NVML telemetry through the bus) showed of the job's
    GPUs while it ran: whether they were shown as the job's, and the busiest reading."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.readings = 0
        self.held_by_job = False
        self.max_util: float | None = None
        self.max_power_w: float | None = None

    def look(self, url: str, gpus: list[list[Any]]) -> None:
        status, body = _http(url, "GET", "/v1/fleet/gpus")
        if status != 200:
            return
        wanted = {(str(node), int(index)) for node, index in gpus}
        for node in json.loads(body):
            for cell in node["gpus"]:
                if (node["name"], cell["index"]) not in wanted or node.get("sampled_at") is None:
                    continue
                self.readings += 1
                self.held_by_job = self.held_by_job or cell.get("allocated_to") == self.job_id
                for key, field in (("max_util", "util"), ("max_power_w", "power_w")):
                    value = cell.get(field)
                    if value is not None:
                        setattr(self, key, max(value, getattr(self, key) or 0.0))

    def report(self) -> dict[str, Any]:
        return {"readings": self.readings, "held_by_job": self.held_by_job, "max_util": self.max_util,
                "max_power_w": self.max_power_w}  # fmt: skip


TOKEN = f"device-check-{secrets.token_hex(16)}"
"""The admin token of the check's own, throwaway Chamber."""


def _http(url: str, method: str, path: str, body: object = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json", "authorization": f"Bearer {TOKEN}"}
    request = urllib.request.Request(f"{url}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


def _nodes(url: str) -> list[Any] | None:
    try:
        status, body = _http(url, "GET", "/v1/nodes")
        nodes = json.loads(body) if status == 200 else None
    except (OSError, ValueError):
        return None
    return nodes if isinstance(nodes, list) and nodes else None


def _wait(probe: Any, deadline: float, what: str) -> Any:
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not appear")
