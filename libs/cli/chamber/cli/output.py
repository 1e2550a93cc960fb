"""kubectl-like output: a table by default (rich), `-o wide` for more columns, `-o json` / `-o yaml` for programs."""

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[dict[str, Any]], object]
    wide_only: bool = False


def console() -> Console:
    return Console(file=sys.stdout, soft_wrap=False, width=200 if not sys.stdout.isatty() else None)


def age(ts: float | None, now: float | None = None) -> str:
    if not ts:
        return "-"
    s = max(0, int((now or time.time()) - ts))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def table(rows: Sequence[dict[str, Any]], columns: Sequence[Column], *, wide: bool = False, title: str = "") -> Table:
    shown = [c for c in columns if wide or not c.wide_only]
    out = Table(title=title or None, box=None, header_style="bold", pad_edge=False)
    for c in shown:
        out.add_column(c.header, overflow="fold")
    for row in rows:
        out.add_row(*(str(c.value(row)) for c in shown))
    return out


def emit(data: Any, fmt: str, rows: Sequence[dict[str, Any]] | None = None, columns: Sequence[Column] = ()) -> None:
    """Print `data` as json or yaml, else `rows` (default: `data`) as a table."""
    if fmt == "json":
        print(json.dumps(data, indent=2))
    elif fmt == "yaml":
        print(yaml.safe_dump(data, sort_keys=False).rstrip())
    else:
        shown = rows if rows is not None else data
        if not shown:
            print("(none)")
            return
        console().print(table(shown, columns, wide=fmt == "wide"))
