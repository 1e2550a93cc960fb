"""The README's first command: `chamber up` on embedded servers, a job submitted over HTTP, Ctrl-C; and what the
supervisor must survive: being SIGKILLed, a port in use, a bad file, a service in back-off, a password."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from chamber.cli.infra import free_port, nats_answers, redis_answers, resolve
from tests.support.processes import alive, descendants, service_pids
from tests.support.servers import Servers

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_embedded_servers_start_and_stop() -> None:
    infra = resolve(env={}, allow_local=False)
    try:
        assert infra.origin == {"nats": "embedded", "redis": "embedded"}
        assert nats_answers(infra.nats_url)
        assert redis_answers(infra.redis_url)
        tmp = infra.tmpdir
    finally:
        infra.stop()
    assert not nats_answers(infra.nats_url)
    assert tmp is not None
    assert not Path(tmp).exists(), "the temporary data is removed"


def test_chamber_up_runs_a_job_end_to_end(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAMBER_")} | {
        "CHAMBER_EMBEDDED": "1",
        "CHAMBER_HTTP_PORT": str(port),
        "CHAMBER_METRICS_PORT": "0",
        "CHAMBER_GRPC_PORT": "0",
        "CHAMBER_ADMIN_TOKEN": "e2e-admin-token",
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "up.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "chamber.cli.main", "up"], env=env, stdout=out, stderr=out)
    try:
        deadline = started + 30
        while b"chamber: ready in" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "not ready within 30 s:\n" + log.read_text()
            time.sleep(0.1)
        auth = {"authorization": "Bearer e2e-admin-token"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5, headers=auth) as http:
            while http.get("/v1/fleet").json()["gpus_total"] == 0:
                assert time.monotonic() < deadline, "inventory did not arrive"
                time.sleep(0.1)
            job = http.post("/v1/jobs", json={"name": "hello", "team": "demo", "gpus_per_replica": 8, "duration_s": 2})
            assert job.status_code == 201, job.text
            job_id = job.json()["id"]
            submitted = time.monotonic()
            while http.get(f"/v1/jobs/{job_id}").json()["state"] != "running":
                assert time.monotonic() - submitted < 2.0, "not running within 2 s"
                time.sleep(0.05)
            while http.get(f"/v1/jobs/{job_id}").json()["state"] != "succeeded":
                assert time.monotonic() - submitted < 10.0, "not succeeded after its duration"
                time.sleep(0.1)
            assert time.monotonic() - submitted >= 2.0
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    assert code == 0, log.read_text()


def up_env(port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAMBER_")}
    return env | {"CHAMBER_HTTP_PORT": str(port), "CHAMBER_METRICS_PORT": "0", "PYTHONUNBUFFERED": "1"} | extra


def start_up(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "chamber.cli.main", "up"], env=env, stdout=out, stderr=out)


def wait_for(log: Path, text: bytes, proc: subprocess.Popen[bytes], within: float = 30) -> None:
    deadline = time.monotonic() + within
    while text not in log.read_bytes():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"no {text!r} within {within} s:\n" + log.read_text()
        time.sleep(0.05)


def wait_until(check: object, within: float, what: str) -> float:
    """Poll `check` until true; the seconds it took."""
    started = time.monotonic()
    while not check():  # type: ignore[operator]
        assert time.monotonic() - started < within, f"{what} not within {within} s"
        time.sleep(0.02)
    return time.monotonic() - started


def test_a_killed_chamber_up_leaves_no_process_behind(tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    proc = start_up(up_env(free_port(), CHAMBER_EMBEDDED="1", CHAMBER_NAMESPACE="orphans"), log)
    try:
        wait_for(log, b"chamber: ready in", proc)
        family = descendants(proc.pid)
        names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in family if alive(pid)}
        assert {"nats-server", "valkey-server"} <= names, names
        assert len(service_pids(proc.pid)) == 5
    finally:
        proc.kill()
        proc.wait()
    wait_until(lambda: not any(alive(pid) for pid in family), within=5, what="every child gone")


@pytest.mark.parametrize("setting", ["CHAMBER_HTTP_PORT", "CHAMBER_METRICS_PORT"])
def test_a_port_in_use_is_a_clear_error_before_anything_starts(tmp_path: Path, setting: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = up_env(free_port(), CHAMBER_EMBEDDED="1") | {setting: str(port)}
        done = subprocess.run(
            [sys.executable, "-m", "chamber.cli.main", "up"], env=env, capture_output=True, timeout=30, check=False
        )
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 2, out
    assert f"127.0.0.1:{port} is already in use" in out
    assert setting in out
    assert "chamber: ready" not in out
    assert "nothing was started" in out


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"CHAMBER_QUOTA_FILE": "deploy/examples/quota.yml"}, "cannot read quota file", id="missing"),
        pytest.param(
            {"CHAMBER_QUOTA_FILE": "tests/data/small-scenario.yaml"}, "unknown fields $.name, $.fleet", id="mistyped"
        ),
        pytest.param({"CHAMBER_HEALTH_RULES_FILE": "pyproject.toml"}, "CHAMBER_HEALTH_RULES_FILE", id="rules"),
        pytest.param({"CHAMBER_FLEET_NODES": "many"}, "invalid setting CHAMBER_FLEET_NODES", id="setting"),
    ],
)
def test_a_bad_file_or_setting_is_one_clear_error_at_start(env: dict[str, str], expected: str) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "chamber.cli.main", "up"],
        env=up_env(free_port(), CHAMBER_EMBEDDED="1") | env,
        capture_output=True,
        timeout=30,
        check=False,
    )
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 2, out
    assert expected in out
    assert "Traceback" not in out
    assert "starting services" not in out
    assert time.monotonic() - started < 10


def test_one_service_in_back_off_delays_neither_the_others_nor_ctrl_c(servers: Servers, tmp_path: Path) -> None:
    """Health is killed each time it comes back, so it waits out a growing back-off (0.25, 0.5, 1, 2, 4 s);
    meanwhile the gateway, killed too, is back at once, and Ctrl-C stops everything without waiting."""
    log = tmp_path / "up.log"
    port = free_port()
    env = up_env(
        port, CHAMBER_NATS_URL=servers.nats_url, CHAMBER_REDIS_URL=servers.redis_url, CHAMBER_NAMESPACE="backoff"
    )
    proc = start_up(env, log)
    try:
        wait_for(log, b"chamber: ready in", proc)
        for _ in range(5):
            pid = service_pids(proc.pid)["health"]
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda p=pid: service_pids(proc.pid).get("health", p) != p, within=10, what="health back")
        os.kill(service_pids(proc.pid)["health"], signal.SIGKILL)  # sixth fast failure: an 8 s back-off
        wait_for(log, b"health was killed by SIGKILL after", proc)
        gateway = service_pids(proc.pid)["gateway"]
        os.kill(gateway, signal.SIGKILL)
        back = wait_until(
            lambda: service_pids(proc.pid).get("gateway", gateway) != gateway, within=10, what="gateway back"
        )
        assert back < 1.0, f"the gateway was restarted {back:.2f} s after it died"
        assert "health" not in service_pids(proc.pid), "health is still in its back-off"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=2) as http:
            wait_until(lambda: _answers(http), within=10, what="the API answers again")
        proc.send_signal(signal.SIGINT)
        stopped = wait_until(lambda: proc.poll() is not None, within=10, what="chamber up stopped")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert stopped < 5.0, f"Ctrl-C took {stopped:.1f} s"
    assert proc.returncode == 0, log.read_text()


def _answers(http: httpx.Client) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def test_chamber_up_never_prints_a_password(servers: Servers, tmp_path: Path) -> None:
    """NATS without authentication ignores the credentials; the password must still appear nowhere."""
    nats_url = servers.nats_url.replace("nats://", "nats://chamber:n4ts-s3cret@")
    log = tmp_path / "up.log"
    env = up_env(free_port(), CHAMBER_NATS_URL=nats_url, CHAMBER_REDIS_URL=servers.redis_url)
    proc = start_up(env | {"CHAMBER_NAMESPACE": "redact"}, log)
    try:
        wait_for(log, b"chamber: ready in", proc)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    text = log.read_text()
    assert "chamber:***@" in text
    assert "n4ts-s3cret" not in text


def test_chamber_up_runs_on_nats_and_valkey_that_ask_for_passwords(tmp_path: Path) -> None:
    """What the Helm chart runs by default: NATS with a user and password, Valkey with `requirepass`. Anonymous
    clients are refused; Chamber's services, given the credentials in their URLs, run a job end to end."""
    import redis

    from chamber.cli.infra import embedded_nats, embedded_redis

    secret = "Pw.4-chamber_tests"
    bus = embedded_nats(tmp_path)
    bus.argv += ["--user", "chamber", "--pass", secret]
    ledger = embedded_redis(tmp_path)
    ledger.argv += ["--requirepass", secret]
    for server in (bus, ledger):
        server.spawn()
    try:
        wait_until(lambda: nats_answers(bus.url), within=20, what="nats-server")
        wait_until(lambda: _noauth(ledger.url), within=20, what="valkey-server")
        assert "Authorization Violation" in _anonymous_nats(bus.port)
        with redis.Redis.from_url(ledger.url) as anonymous_client, pytest.raises(redis.AuthenticationError):
            anonymous_client.set("k", "v")

        port = free_port()
        nats_url = bus.url.replace("nats://", f"nats://chamber:{secret}@")
        redis_url = ledger.url.replace("redis://", f"redis://:{secret}@")
        env = up_env(port, CHAMBER_NATS_URL=nats_url, CHAMBER_REDIS_URL=redis_url, CHAMBER_GRPC_PORT="0",
                     CHAMBER_ADMIN_TOKEN="auth-admin-token", CHAMBER_NAMESPACE="auth")  # fmt: skip
        log = tmp_path / "up.log"
        proc = start_up(env, log)
        try:
            wait_for(log, b"chamber: ready in", proc)
            auth = {"authorization": "Bearer auth-admin-token"}
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5, headers=auth) as http:
                wait_until(lambda: http.get("/v1/fleet").json()["gpus_total"] > 0, within=20, what="inventory")
                job = http.post("/v1/jobs", json={"name": "locked", "team": "demo", "gpus_per_replica": 1})
                assert job.status_code == 201, job.text
                job_id = job.json()["id"]
                wait_until(lambda: http.get(f"/v1/jobs/{job_id}").json()["state"] == "running", within=10,
                           what="the job running")  # fmt: skip
        finally:
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=30)
        assert code == 0, log.read_text()
        assert secret not in log.read_text()
    finally:
        for server in (bus, ledger):
            server.kill()


def _noauth(url: str) -> bool:
    """A Redis answers at `url`, refusing anonymous clients."""
    import redis

    try:
        with redis.Redis.from_url(url) as client:
            client.ping()
    except redis.AuthenticationError:
        return True
    except redis.ConnectionError:
        return False
    return False


def _anonymous_nats(port: int) -> str:
    """What a NATS server answers a client that logs in without credentials."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.recv(65536)  # INFO
        sock.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
        return sock.recv(65536).decode()
