"""kubectl-like output: a table by default (rich), `-o wide` for more columns, `-o json` / `-o yaml` for programs."""

import json
import math
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
    return _span(max(0, int((now or time.time()) - ts)))


def until(ts: float, now: float | None = None) -> str:
    """How long until `ts` (`in 3d`, rounded up: a token that lasts 11 h 59 min is `in 12h`), or `expired`."""
    left = math.ceil(ts - (now or time.time()))
    return f"in {_span(left, up=True)}" if left > 0 else "expired"


def _span(s: int, *, up: bool = False) -> str:
    for unit, name, below in ((1, "s", 120), (60, "m", 7200), (3600, "h", 172800)):
        if s < below:
            return f"{-(-s // unit) if up else s // unit}{name}"
    return f"{-(-s // 86400) if up else s // 86400}d"


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds from `3600`, `90m`, `12h` or `30d`; ValueError naming the forms otherwise."""
    raw = text.strip().lower()
    unit = DURATION_UNITS.get(raw[-1:], 0)
    number = raw[:-1] if unit else raw
    try:
        value = float(number) * (unit or 1)
    except ValueError:
        raise ValueError(
            f"not a duration: {text!r} (use seconds, or a number with s, m, h or d: 90m, 12h, 30d)"
        ) from None
    if not 0 < value < float("inf"):
        raise ValueError(f"a duration must be above 0 and finite: {text!r}")
    return value


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
