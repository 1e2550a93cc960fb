"""Small programs that tests run as real job processes (with `sys.executable`); each writes what it saw as JSON."""

import sys
from pathlib import Path

HERE = Path(__file__).parent


def command(name: str, *args: object) -> list[str]:
    """argv running `tests/support/jobs/<name>.py` with `args`."""
    return [sys.executable, str(HERE / f"{name}.py"), *(str(a) for a in args)]
