"""The `chamber` client commands: login, submit, jobs, describe, cancel, teams, nodes, top, tokens.

Each is a thin caller of the HTTP API (docs/api.md) with kubectl-like output; the API does every check, so the
CLI never disagrees with it.
"""

import argparse
import getpass
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from chamber.cli.client import Api, CliError, read_token_file, resolve, write_config
from chamber.cli.output import Column, age, console, emit, parse_duration, pct, table, until

FORMATS = ("table", "wide", "json", "yaml")

JOB_COLUMNS = [
    Column("ID", lambda j: j["id"]),
    Column("NAME", lambda j: j["name"]),
    Column("TEAM", lambda j: j["team"]),
    Column(
        "STATE",
        lambda j: (
            j["state"]
            + (
                " (cancelling)"
                if j.get("cancel_requested") and j["state"] not in ("cancelled", "succeeded", "failed")
                else ""
            )
        ),
    ),
    Column("GPUS", lambda j: f"{j['replicas']}x{j['gpus_per_replica']}"),
    Column("PRIORITY", lambda j: j["priority"]),
    Column("AGE", lambda j: age(j["submitted_at"])),
    Column("ATTEMPT", lambda j: j.get("attempt", 0), wide_only=True),
    Column("PREEMPTED", lambda j: j.get("preemptions", 0), wide_only=True),
    Column("RUN", lambda j: f"{j.get('run_s', 0):.0f}s", wide_only=True),
    Column(
        "NODES",
        lambda j: ",".join(sorted({g[0] for g in (j.get("placement") or {}).get("gpus", [])})) or "-",
        wide_only=True,
    ),
    Column("REASON", lambda j: j.get("reason", "")),
]
TEAM_COLUMNS = [
    Column("TEAM", lambda t: t["name"]),
    Column("ORG", lambda t: (t.get("config") or {}).get("org", t["usage"].get("org", ""))),
    Column("NOMINAL", lambda t: t["usage"]["nominal"]),
    Column("RUNNING", lambda t: t["usage"]["gpus_running"]),
    Column("BORROWED", lambda t: t["usage"]["borrowed"]),
    Column("LENT", lambda t: t["usage"]["lent"]),
    Column("FAIR SHARE", lambda t: f"{t['usage']['fair_share']:.1f}"),
    Column("PENDING", lambda t: t["usage"]["jobs_pending"]),
    Column("GPU-H", lambda t: f"{t['usage']['gpu_hours']:.1f}", wide_only=True),
    Column("COST", lambda t: f"{t['usage']['cost']:.0f}", wide_only=True),
    Column(
        "BUDGET",
        lambda t: (
            t["usage"]["budget_state"]
            + (f" {pct(t['usage']['budget_used'])}" if t["usage"]["budget_state"] != "none" else "")
        ),
    ),
]
NODE_COLUMNS = [
    Column("NODE", lambda n: n["name"]),
    Column("POOL", lambda n: n["pool"]),
    Column("MODEL", lambda n: n["gpu_model"]),
    Column("RACK", lambda n: n["rack"], wide_only=True),
    Column("ZONE", lambda n: n["zone"], wide_only=True),
    Column("GPUS", lambda n: n["gpus_total"]),
    Column("ALLOCATED", lambda n: n["gpus_allocated"]),
    Column("OUT", lambda n: n["gpus_unschedulable"]),
    Column(
        "WHY OUT",
        lambda n: "; ".join(f"{i}: {r}" for i, r in sorted(n["unschedulable"].items())) or "-",
        wide_only=True,
    ),
]
TOKEN_COLUMNS = [
    Column("ID", lambda t: t["id"]),
    Column("NAME", lambda t: t["name"]),
    Column("ROLE", lambda t: t["role"]),
    Column("TEAMS", lambda t: ",".join(t["teams"]) or "-"),
    Column("AGE", lambda t: age(t["created_at"])),
    Column("CREATED BY", lambda t: t["created_by"]),
    Column("EXPIRES", lambda t: "never" if t.get("expires_at") is None else until(t["expires_at"])),
]


def _api(args: argparse.Namespace) -> Api:
    """The command's client, closed by `_guard` when the command ends."""
    api = Api(resolve(args.url, args.token))
    args.opened.append(api)
    return api


def _login(args: argparse.Namespace) -> int:
    token = args.token
    if args.token_file:
        token = read_token_file(Path(args.token_file))
        if not token:
            raise CliError(f"no token in {args.token_file}")
    if not token and sys.stdin.isatty():
        token = getpass.getpass("API token: ")
    target = resolve(args.url, token or None)
    if not target.token:
        raise CliError("give a token: --token, --token-file, or type it when asked")
    api = Api(target)
    args.opened.append(api)
    me = api.get("/v1/me")
    path = write_config(target.url, target.token)
    teams = f", teams {', '.join(me['teams'])}" if me.get("teams") else ""
    print(f"logged in to {target.url} as {me['name']} ({me['role']}{teams}); saved in {path}")
    return 0


def _submit(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {}
    if args.file:
        try:
            loaded = yaml.safe_load(Path(args.file).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise CliError(f"cannot read {args.file}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise CliError(f"{args.file} must hold one job (a mapping of fields, docs/api.md)")
        body.update(loaded)
    flags = {"name": args.name, "team": args.team, "gpus_per_replica": args.gpus, "replicas": args.replicas,
             "priority": args.priority, "duration_s": args.duration, "pool": args.pool,
             "gpu_model": args.gpu_model}  # fmt: skip
    body.update({k: v for k, v in flags.items() if v is not None})
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    job = _api(args).request("POST", "/v1/jobs", json_body=body, headers=headers)
    if args.output in ("json", "yaml"):
        emit(job, args.output)
    else:
        print(f"job {job['id']} submitted ({job['state']}: {job['reason']})")
    return 0


def _jobs(args: argparse.Namespace) -> int:
    api = _api(args)

    def fetch() -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = api.get("/v1/jobs", state=args.state, team=args.team, limit=args.limit)
        return jobs

    if not args.watch:
        jobs = fetch()
        emit(jobs, args.output, columns=JOB_COLUMNS)
        return 0
    from rich.live import Live

    deadline = time.monotonic() + args.watch_for if args.watch_for else None
    with Live(table(fetch(), JOB_COLUMNS, wide=args.output == "wide"), console=console(), auto_refresh=False) as live:
        for event, _ in api.events("job", for_s=args.watch_for or None):
            if event in {"job", "resync"}:
                live.update(table(fetch(), JOB_COLUMNS, wide=args.output == "wide"), refresh=True)
            if deadline is not None and time.monotonic() > deadline:
                break
    return 0


TIMELINE = [
    Column("WHEN", lambda e: time.strftime("%H:%M:%S", time.localtime(e["at"]))),
    Column("EVENT", lambda e: e["kind"]),
    Column("ATTEMPT", lambda e: e.get("attempt") if e.get("attempt") is not None else "-"),
    Column("GPUS", lambda e: len(e["gpus"]) if e.get("gpus") else "-"),
    Column("BY", lambda e: e.get("by") or "-"),
    Column("DETAIL", lambda e: e.get("detail", "")),
]


def _describe(args: argparse.Namespace) -> int:
    if args.kind != "job":
        raise CliError("only `chamber describe job ID` for now")
    data = _api(args).get(f"/v1/jobs/{args.id}/events")
    if args.output in ("json", "yaml"):
        emit(data, args.output)
        return 0
    job = data["job"]
    out = console()
    fields = [("Job", f"{job['id']} ({job['name']})"), ("Team", job["team"]), ("Priority", job["priority"]),
              ("State", job["state"]), ("Reason", job["reason"]),
              ("GPUs", f"{job['replicas']} x {job['gpus_per_replica']}"),
              ("Submitted", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job["submitted_at"]))),
              ("Attempt", str(job["attempt"])), ("Preemptions", str(job["preemptions"])),
              ("Ran", f"{job['run_s']:.1f} s (lost {job['lost_s']:.1f} s)")]  # fmt: skip
    placement = job.get("placement")
    if placement:
        per_node: dict[str, list[int]] = {}
        for node, index in placement["gpus"]:
            per_node.setdefault(node, []).append(index)
        fields.append(("Placed on", ", ".join(f"{n} ({len(ix)} GPUs)" for n, ix in sorted(per_node.items()))))
    for key, value in fields:
        out.print(f"[bold]{key + ':':<13}[/bold]{value}", highlight=False)
    out.print()
    out.print(table(data["events"], TIMELINE, title="Timeline"))
    return 0


def _cancel(args: argparse.Namespace) -> int:
    job = _api(args).request("DELETE", f"/v1/jobs/{args.id}")
    print(f"job {job['id']} cancel requested (was {job['state']})")
    return 0


def _teams(args: argparse.Namespace) -> int:
    emit(_api(args).get("/v1/teams"), args.output, columns=TEAM_COLUMNS)
    return 0


def _nodes(args: argparse.Namespace) -> int:
    emit(_api(args).get("/v1/nodes"), args.output, columns=NODE_COLUMNS)
    return 0


def _tokens(args: argparse.Namespace) -> int:
    api = _api(args)
    if args.action == "create":
        if not args.name or not args.role:
            raise CliError("chamber tokens create NAME --role ROLE [--team TEAM ...]")
        request: dict[str, object] = {"name": args.name, "role": args.role, "teams": args.team or []}
        if args.expires_in:
            try:
                request["expires_in_s"] = parse_duration(args.expires_in)
            except ValueError as exc:
                raise CliError(f"--expires-in: {exc}") from exc
        made = api.request("POST", "/v1/tokens", json_body=request)
        if args.output in ("json", "yaml"):
            emit(made, args.output)
        else:
            print(f"token {made['id']} ({made['role']}) made; it is shown only now:\n{made['token']}")
    elif args.action == "revoke":
        if not args.name:
            raise CliError("chamber tokens revoke ID")
        api.request("DELETE", f"/v1/tokens/{args.name}")
        print(f"token {args.name} revoked")
    else:
        emit(api.get("/v1/tokens"), args.output, columns=TOKEN_COLUMNS)
    return 0


def _top(args: argparse.Namespace) -> int:
    from chamber.cli.top import run_top

    return run_top(_api(args), interval_s=args.interval, once=args.once)


def _common(p: argparse.ArgumentParser, *, output: bool = True) -> None:
    p.add_argument("--url", help="the API (default: CHAMBER_URL, the login, or http://127.0.0.1:8080)")
    p.add_argument("--token", help="an API token (default: CHAMBER_TOKEN, the login, or .chamber/dev-admin-token)")
    if output:
        p.add_argument("-o", "--output", choices=FORMATS, default="table", help="table, wide, json or yaml")


def _guard(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        args.opened = []
        try:
            return func(args)
        except CliError as exc:
            print(f"chamber: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        finally:
            for api in args.opened:
                api.close()

    return run


def register(sub: Any, bench: Any) -> None:
    """Add the client commands (and `bench gateway`) to the `chamber` parser."""
    p = sub.add_parser("login", help="save the API URL and a token for the commands below")
    _common(p, output=False)
    p.add_argument("--token-file", help="read the token from a file (e.g. .chamber/dev-admin-token)")
    p.set_defaults(func=_guard(_login))

    p = sub.add_parser("submit", help="submit a job (flags, or a YAML file with the API's fields)")
    _common(p)
    p.add_argument("-f", "--file", help="YAML: name, team, gpus_per_replica, replicas, priority, duration_s, ...")
    p.add_argument("--name")
    p.add_argument("--team")
    p.add_argument("--gpus", type=int, help="GPUs per replica")
    p.add_argument("--replicas", type=int)
    p.add_argument("--priority", choices=["inference", "train", "research", "best-effort"])
    p.add_argument("--duration", type=float, help="seconds it runs (simulated executor)")
    p.add_argument("--pool")
    p.add_argument("--gpu-model")
    p.add_argument("--idempotency-key", help="retrying with the same key returns the same job")
    p.set_defaults(func=_guard(_submit))

    p = sub.add_parser("jobs", help="list jobs, newest first")
    _common(p)
    p.add_argument("--state", choices=["pending", "running", "preempted", "succeeded", "failed", "cancelled"])
    p.add_argument("--team")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("-w", "--watch", action="store_true", help="keep the list current (live stream)")
    p.add_argument("--watch-for", type=float, default=0.0, help=argparse.SUPPRESS)
    p.set_defaults(func=_guard(_jobs))

    p = sub.add_parser("describe", help="one object in detail: `describe job ID` (state, reasons, timeline)")
    _common(p)
    p.add_argument("kind", choices=["job"])
    p.add_argument("id")
    p.set_defaults(func=_guard(_describe))

    p = sub.add_parser("cancel", help="cancel a job")
    _common(p, output=False)
    p.add_argument("id")
    p.set_defaults(func=_guard(_cancel))

    for name, func, what in (("teams", _teams, "teams: quota, usage, borrowing, fair share, budget"),
                             ("nodes", _nodes, "nodes: allocation and GPUs out of service")):  # fmt: skip
        p = sub.add_parser(name, help=what)
        _common(p)
        p.set_defaults(func=_guard(func))

    p = sub.add_parser("top", help="a live view of the fleet in the terminal")
    _common(p, output=False)
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--once", action="store_true", help="draw one frame and exit")
    p.set_defaults(func=_guard(_top))

    p = sub.add_parser("tokens", help="API tokens (admins): list, create NAME --role R [--team T], revoke ID")
    _common(p)
    p.add_argument("action", nargs="?", choices=["list", "create", "revoke"], default="list")
    p.add_argument("name", nargs="?", help="create: the token's name; revoke: its id")
    p.add_argument("--role", choices=["admin", "operator", "member", "viewer"])
    p.add_argument("--team", action="append", help="a member's team (repeat for several)")
    p.add_argument("--expires-in", help="create: refused after this long (e.g. 3600, 90m, 12h, 30d); default never")
    p.set_defaults(func=_guard(_tokens))

    p = bench.add_parser("gateway", help="reads and authenticated submits against a running system (processes)")
    p.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    p.add_argument("--connections", type=int, default=32, help="concurrent keep-alive connections for reads")
    p.add_argument("--submit-rate", type=float, default=500.0, help="submits per second (open loop)")
    p.add_argument("--preload", type=int, default=1000, help="jobs (1 GPU, an hour long) submitted before measuring")
    p.add_argument("--nodes", type=int, default=128, help="simulated nodes (8 GPUs each)")
    p.add_argument("--json", action="store_true", help="one line of JSON")
    p.set_defaults(func=_bench_gateway)


def _bench_gateway(args: argparse.Namespace) -> int:
    import json

    from chamber.gateway.bench import BenchConfig, run

    result = run(BenchConfig(seconds=args.seconds, connections=args.connections, submit_rate=args.submit_rate,
                             preload=args.preload, nodes=args.nodes))  # fmt: skip
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
