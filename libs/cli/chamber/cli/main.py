"""The `chamber` command line."""

import argparse
import importlib
import sys
import time

from chamber.common.settings import Settings, SettingsError

SERVICE_MODULES = {
    "collector": "chamber.collector.service",
    "scheduler": "chamber.scheduler.service",
    "health": "chamber.health.service",
    "quota": "chamber.quota.service",
    "gateway": "chamber.gateway.service",
}


def _service(args: argparse.Namespace) -> int:
    from chamber.common.runtime import run_service

    settings = Settings.from_env()
    module = importlib.import_module(SERVICE_MODULES[args.name])
    run_service(args.name, module.main, settings)
    return 0


def _up(args: argparse.Namespace) -> int:
    from chamber.cli.infra import InfraError, resolve
    from chamber.cli.supervisor import supervise

    started = time.monotonic()
    settings = Settings.from_env()
    try:
        infra = resolve()
    except InfraError as exc:
        print(f"chamber: {exc}", file=sys.stderr)
        return 1
    try:
        nats_from, redis_from = infra.origin["nats"], infra.origin["redis"]
        print(f"chamber: NATS {infra.nats_url} ({nats_from}), Redis {infra.redis_url} ({redis_from})")
        url = f"http://{settings.http_host}:{settings.http_port}"
        print(f"chamber: starting services; API will be at {url} (OpenAPI at {url}/openapi.json)", flush=True)
        return supervise(infra, {}, url, started, out=lambda line: print(line, flush=True))
    finally:
        infra.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chamber", description="Chamber keeps GPU fleets busy.")
    sub = parser.add_subparsers(dest="command", required=True)
    svc = sub.add_parser("service", help="run one service (what each container runs)")
    svc.add_argument("name", choices=sorted(SERVICE_MODULES))
    svc.set_defaults(func=_service)
    up = sub.add_parser("up", help="run the whole system on this machine (embedded NATS and Redis if needed)")
    up.set_defaults(func=_up)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except SettingsError as exc:
        print(f"chamber: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
