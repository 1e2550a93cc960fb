"""What `chamber up` checks before it starts anything, so a mistake is one clear message instead of a crash loop.

A port already taken (by another program, or by the services of an earlier `chamber up` still running) would
make our gateway or collector die at bind while the old one answers in its place; a mistyped quota or health
rules file would make its service die at every start with a traceback. Each is found here, before any server or
service starts, and reported with what to change.
"""

import errno
import socket

from chamber.common.settings import Settings


def port_problem(host: str, port: int, what: str, setting: str) -> str | None:
    """Why `port` on `host` cannot be bound, or None when it can (0 means any free port: always fine)."""
    if port == 0:
        return None
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        # As the servers bind: a port in TIME_WAIT is free, one with a listener is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (
                    f"{what} port {host}:{port} is already in use (another chamber up still running?); "
                    f"stop that program or set {setting} to another port"
                )
            return f"{what} cannot listen on {host}:{port} ({exc.strerror}); check {setting} and CHAMBER_HTTP_HOST"
    return None


def problems(settings: Settings) -> list[str]:
    """Everything wrong with these settings and the files they name; empty when `chamber up` can start."""
    found = [
        port_problem(settings.http_host, settings.http_port, "the API", "CHAMBER_HTTP_PORT"),
        port_problem(settings.http_host, settings.metrics_port, "the metrics endpoint", "CHAMBER_METRICS_PORT"),
    ]
    if settings.quota_file:
        found.append(_quota_file_problem(settings.quota_file))
    if settings.health_rules_file:
        found.append(_health_rules_problem(settings.health_rules_file))
    return [p for p in found if p]


def _quota_file_problem(path: str) -> str | None:
    from chamber.common.quota import ConfigError, validate
    from chamber.common.quotastore import load_yaml

    try:
        validate(load_yaml(path))
    except ConfigError as exc:
        return f"CHAMBER_QUOTA_FILE: {exc}"
    return None


def _health_rules_problem(path: str) -> str | None:
    from chamber.health.core.rules import RuleError
    from chamber.health.service import load_rules

    try:
        load_rules(path)
    except RuleError as exc:
        return f"CHAMBER_HEALTH_RULES_FILE: {exc}"
    return None
