"""The `chamber` command line."""

import argparse
import importlib
import os
import sys
import time

from chamber.cli.commands import register as register_client_commands
from chamber.common.settings import Settings, SettingsError

SERVICE_MODULES = {
    "collector": "chamber.collector.service",
    "scheduler": "chamber.scheduler.service",
    "health": "chamber.health.service",
    "quota": "chamber.quota.service",
    "gateway": "chamber.gateway.service",
}


def _service(args: argparse.Namespace) -> int:
    from chamber.common.bus import BusUnavailable
    from chamber.common.runtime import run_service

    settings = Settings.from_env()
    module = importlib.import_module(SERVICE_MODULES[args.name])
    try:
        run_service(args.name, module.main, settings)
    except BusUnavailable as exc:  # NATS unreachable at start: exit with the reason, to be restarted
        print(f"chamber: {exc}", file=sys.stderr)
        return 1
    return 0


def _up(args: argparse.Namespace) -> int:
    from chamber.cli import preflight
    from chamber.cli.gpus import local_defaults
    from chamber.cli.infra import InfraError, resolve
    from chamber.cli.supervisor import supervise

    started = time.monotonic()
    settings = Settings.from_env()
    problems = preflight.problems(settings)
    if problems:
        for problem in problems:
            print(f"chamber: {problem}", file=sys.stderr)
        print("chamber: nothing was started", file=sys.stderr)
        return 2
    try:
        infra = resolve()
    except InfraError as exc:
        print(f"chamber: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"chamber: {infra.describe()}")
        url = f"http://{settings.http_host}:{settings.http_port}"
        env: dict[str, str] = {}
        extra: dict[str, list[str]] = {}
        if args.kube_emulator:
            from chamber.cli.kubesim.modes import emulator_mode

            env, extra = emulator_mode(settings)
            print(f"chamber: emulated Kubernetes API at {env['CHAMBER_KUBE_API']} "
                  f"(try: python deploy/examples/kube_job.py {env['CHAMBER_KUBE_API']})")  # fmt: skip
        print(f"chamber: starting services; API will be at {url} (OpenAPI at {url}/openapi.json)", flush=True)
        local = local_defaults(os.environ)
        if local and not args.kube_emulator:
            print("chamber: NVIDIA GPUs found: jobs run as processes on them (node agent, CHAMBER_EXECUTOR=process)")
            env = {**local, **env}
        return supervise(infra, url, started, out=lambda line: print(line, flush=True), env_overrides=env, extra=extra)
    finally:
        infra.stop()


def _kube_emulator(args: argparse.Namespace) -> int:
    import asyncio

    from chamber.cli.kubesim.serve import serve

    asyncio.run(serve(Settings.from_env(), args.host, args.port, args.webhook_url))
    return 0


def _webhook_cert(args: argparse.Namespace) -> int:
    from chamber.cli.webhook_cert import run

    print(f"chamber: {run(args.namespace, args.service, args.secret, args.webhook, args.api)}")
    return 0


def _positive(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {value}")
    return number


def _emit(result: object, one_line: bool) -> int:
    import json

    print(json.dumps(result) if one_line else json.dumps(result, indent=2))
    return 0


def _bench_logging() -> None:
    """Warnings of the services a benchmark runs go to the process's stderr: stdout is the JSON."""
    import structlog

    from chamber.common.log import setup_logging

    setup_logging("WARNING")
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.__stderr__))


def _bench_scheduler(args: argparse.Namespace) -> int:
    from chamber.scheduler.bench import BenchConfig, run

    teams = args.teams if args.teams is not None else (1000 if args.quota else 20)
    cfg = BenchConfig(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, pending=args.pending, teams=teams, seed=args.seed,
        cycles=args.cycles, quota=args.quota, preemptible_backlog=args.preemptible_backlog, topology=args.topology,
    )  # fmt: skip
    result = run(cfg)
    return _emit(result, args.json)


def _bench_e2e(args: argparse.Namespace) -> int:
    import asyncio

    from chamber.cli.bench_e2e import E2EConfig, run
    from chamber.common.runtime import loop_factory

    cfg = E2EConfig(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, jobs=args.jobs, pending=args.pending, clients=args.clients,
        seed=args.seed, rate=args.rate,
    )  # fmt: skip
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return _emit(runner.run(run(cfg)), args.json)


def _bench_quota(args: argparse.Namespace) -> int:
    from chamber.quota.bench import run

    result = run(teams=args.teams, pools=args.pools, seed=args.seed, demand=args.demand, jobs=args.jobs)
    return _emit(result, args.json)


def _bench_telemetry(args: argparse.Namespace) -> int:
    from chamber.collector.bench import run

    _bench_logging()

    result = run(gpus=args.gpus, rounds=args.rounds, interval_s=args.interval, seconds=args.seconds, cpu=_cpu(args.cpu))
    return _emit(result, args.json)


def _cpu(choice: str) -> int | None:
    """`--cpu`: a CPU number, `none`, or `auto` (the first CPU this process may use, when it may use two or more)."""
    if choice == "none":
        return None
    if choice != "auto":
        return int(choice)
    allowed = sorted(os.sched_getaffinity(0))
    return allowed[0] if len(allowed) > 1 else None


def _bench_health(args: argparse.Namespace) -> int:
    from chamber.health.bench import run

    _bench_logging()

    result = run(
        gpus=args.gpus,
        per_family=args.per_family,
        quiet_s=args.quiet_seconds,
        interval_s=args.interval,
        week=not args.no_week,
    )
    return _emit(result, args.json)


def _simulate(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from chamber.sim.run import simulate
    from chamber.sim.scenario import ScenarioError

    policies = args.compare.split(",") if args.compare else [args.policy]
    overrides = list(args.set) + ([f"faults.seed={args.seed}"] if args.seed is not None else [])
    out = Path(args.out)
    try:
        reports = simulate(args.scenario, policies, out, overrides)
    except (ScenarioError, ValueError) as exc:
        print(f"chamber simulate: {exc}", file=sys.stderr)
        return 2
    keys = ("policy", "jobs", "utilization", "avg_jct_s", "p99_jct_s", "avg_queue_s", "preemptions", "sim_wall_s")
    for r in reports:
        print(json.dumps({k: r[k] for k in keys}))
    print(f"chamber simulate: report in {out / 'report.md'}", file=sys.stderr)
    return 0


def _device_check(args: argparse.Namespace) -> int:
    from chamber.cli.devicecheck import run

    result = run(timeout_s=args.timeout)
    _emit(result, args.json)
    return 0 if result["ok"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chamber", description="Chamber keeps GPU fleets busy.")
    sub = parser.add_subparsers(dest="command", required=True)
    svc = sub.add_parser("service", help="run one service (what each container runs)")
    svc.add_argument("name", choices=sorted(SERVICE_MODULES))
    svc.set_defaults(func=_service)
    up = sub.add_parser("up", help="run the whole system on this machine (embedded NATS and Redis if needed)")
    up.add_argument(
        "--kube-emulator",
        action="store_true",
        help="run against an emulated Kubernetes API (Jobs in, pods bound, simulated kubelets)",
    )
    up.set_defaults(func=_up)
    kemu = sub.add_parser("kube-emulator", help="serve the emulated Kubernetes API and cluster on a port")
    kemu.add_argument("--host", default="127.0.0.1")
    kemu.add_argument("--port", type=int, default=0)
    kemu.add_argument("--webhook-url", default="", help="Chamber's admission webhooks (e.g. http://127.0.0.1:9443)")
    kemu.set_defaults(func=_kube_emulator)
    cert = sub.add_parser("webhook-cert", help="issue the admission webhooks' certificate (the Helm chart's hook Job)")
    cert.add_argument("--namespace", required=True)
    cert.add_argument("--service", required=True, help="the webhook Service's name")
    cert.add_argument("--secret", required=True, help="the TLS Secret the gateway mounts")
    cert.add_argument("--webhook", required=True, help="the webhook configurations' name")
    cert.add_argument("--api", default="in-cluster", help="the Kubernetes API (in-cluster, kubeconfig or a URL)")
    cert.set_defaults(func=_webhook_cert)
    simp = sub.add_parser("simulate", help="replay a trace through the real scheduling cores")
    simp.add_argument("--scenario", required=True, help="scenario YAML file")
    simp.add_argument(
        "--policy", default="chamber", help="chamber (default), spf, las, fair-fifo, kueue, isolated or fifo"
    )
    simp.add_argument("--compare", default="", help="several policies side by side, e.g. fifo,fair-fifo,chamber")
    simp.add_argument("--out", default="sim-out", help="directory for report.json, report.md, plots, events")
    simp.add_argument("--seed", type=int, default=None, help="seed of the fault model")
    simp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario key")
    simp.set_defaults(func=_simulate)
    bench = sub.add_parser("bench", help="benchmarks that print JSON").add_subparsers(dest="bench", required=True)
    sched = bench.add_parser("scheduler", help="the scheduling core on a random fleet and workload")
    sched.add_argument("--nodes", type=int, default=1280)
    sched.add_argument("--gpus-per-node", type=int, default=8)
    sched.add_argument("--pending", type=int, default=100_000)
    sched.add_argument("--teams", type=int, default=None, help="default 20, or 1000 with --quota")
    sched.add_argument("--quota", action="store_true", help="team quotas in cohorts: borrowing and reclaim")
    sched.add_argument("--preemptible-backlog", action="store_true", help="most placements need a preemption")
    sched.add_argument("--topology", action="store_true", help="gangs that want one rack or one node")
    sched.add_argument("--cycles", type=int, default=200)
    sched.add_argument("--seed", type=int, default=1)
    sched.add_argument("--json", action="store_true", help="one line of JSON")
    sched.set_defaults(func=_bench_scheduler)
    e2e = bench.add_parser("e2e", help="HTTP submit to placement through the real services, with a deep queue")
    e2e.add_argument("--nodes", type=int, default=128)
    e2e.add_argument("--gpus-per-node", type=int, default=8)
    e2e.add_argument("--jobs", type=int, default=5000)
    e2e.add_argument("--pending", type=int, default=0, help="jobs waiting in the queue throughout")
    e2e.add_argument("--clients", type=int, default=32, help="concurrent HTTP clients")
    e2e.add_argument("--seed", type=int, default=1)
    e2e.add_argument(
        "--rate",
        type=_positive,
        default=None,
        help="submits per second, open loop: latency at that load (default: as fast as they are taken)",
    )
    e2e.add_argument("--json", action="store_true", help="one line of JSON")
    e2e.set_defaults(func=_bench_e2e)
    quota = bench.add_parser("quota", help="fair-share recompute and admission checks")
    quota.add_argument("--teams", type=int, default=1000)
    quota.add_argument("--pools", type=int, default=8)
    quota.add_argument("--seed", type=int, default=1)
    quota.add_argument("--demand", type=float, default=3.0, help="demand as a multiple of each pool's capacity")
    quota.add_argument("--jobs", type=int, default=100_000, help="job records in the quota service's accounting")
    quota.add_argument("--json", action="store_true", help="one line of JSON")
    quota.set_defaults(func=_bench_quota)
    tele = bench.add_parser("telemetry", help="node batches through real NATS into the fleet-metrics aggregator")
    tele.add_argument("--gpus", type=int, default=100_000)
    tele.add_argument("--rounds", type=int, default=20, help="batches per node in the throughput phase")
    tele.add_argument("--interval", type=float, default=1.0, help="seconds between a node's batches (lag phase)")
    tele.add_argument("--seconds", type=float, default=15.0, help="length of the lag phase")
    tele.add_argument(
        "--cpu", default="auto", help="pin the aggregator to this one CPU and the load generator to the others "
        "(auto: the first CPU when there are two or more; none: no pinning)",
    )  # fmt: skip
    tele.add_argument("--json", action="store_true", help="one line of JSON")
    tele.set_defaults(func=_bench_telemetry)
    hb = bench.add_parser("health", help="fault detection to quarantine, on the real health service")
    hb.add_argument("--gpus", type=int, default=10_000)
    hb.add_argument("--quiet-seconds", type=float, default=20.0, help="noise only, before the faults")
    hb.add_argument("--per-family", type=int, default=3, help="faults injected per rule family")
    hb.add_argument("--interval", type=float, default=1.0, help="telemetry interval of every node")
    hb.add_argument("--no-week", action="store_true", help="skip the simulated week of noise")
    hb.add_argument("--json", action="store_true", help="one line of JSON")
    hb.set_defaults(func=_bench_health)
    check = sub.add_parser("device-check", help="on a GPU machine: NVML, GPM samples and a real job, as JSON")
    check.add_argument("--timeout", type=float, default=180.0, help="seconds for the whole check")
    check.add_argument("--json", action="store_true", help="one line of JSON")
    check.set_defaults(func=_device_check)
    register_client_commands(sub, bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except SettingsError as exc:
        print(f"chamber: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before the supervisor took over the signals (e.g. starting NATS)
        print("chamber: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
