"""Chromium for browser tests: Debian's package, installed here when missing (the test is skipped, saying why,
only when that is impossible), driven by Playwright with flags that work in a container."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def _install() -> str:
    if shutil.which("apt-get") is None:
        return "apt-get is not available"
    if os.geteuid() != 0:
        return "not root, cannot apt-get install chromium"
    run = subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, check=False)
        run = subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], capture_output=True, text=True,
                             check=False)  # fmt: skip
    return "" if run.returncode == 0 else f"apt-get install chromium failed: {run.stderr[-300:]}"


def chromium() -> str:
    """The Chromium binary, installed on first use; skips the test when it cannot be had."""
    if not CHROMIUM.exists():
        why = _install()
        if not CHROMIUM.exists():
            pytest.skip(f"Chromium is not installed and could not be installed ({why or 'unknown reason'})")
    return str(CHROMIUM)
