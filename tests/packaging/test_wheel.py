"""`pip install .` must give a working `chamber`: the wheel carries every package, the Lua scripts and the entry
point (an editable install would hide a missing data file)."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.timeout(180)
def test_the_wheel_carries_code_data_and_entry_point(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("chamber-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for service in ("collector", "scheduler", "health", "quota", "gateway"):
        assert f"chamber/{service}/service.py" in names
    assert "chamber/common/ledger/claim.lua" in names
    assert "chamber/common/ledger/release.lua" in names
    assert "chamber/cli/main.py" in names
    assert "chamber/sim/engine.py" in names
    assert "chamber/quota/core/report.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "chamber = chamber.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
