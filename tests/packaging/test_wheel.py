"""`pip install .` must give a working `chamber`: the wheel carries every package, the Lua scripts, the dashboard's
assets, the gRPC code generated from the .proto at build time, and the entry point (an editable install would hide
a missing data file). The wheel is built from the tracked files only, as a fresh clone would hold them, so the
generated gRPC modules must come from the build, not from a developer's working tree."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def _clean_copy(dest: Path) -> Path:
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in tracked.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.mark.timeout(180)
def test_the_wheel_carries_code_data_and_entry_point(tmp_path: Path) -> None:
    source = _clean_copy(tmp_path / "src")
    assert not list(source.rglob("*_pb2.py")), "generated code is not committed"
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        check=True,
        cwd=tmp_path,
        env={**os.environ, "CHAMBER_COMPILE": "0"},  # the compiled core is `make pytest-compiled`'s (a minute more)
    )
    (wheel,) = out.glob("chamber-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not [n for n in names if n.endswith(".so")], "CHAMBER_COMPILE=0: the pure-Python core only"
    for service in ("collector", "scheduler", "health", "quota", "gateway"):
        assert f"chamber/{service}/service.py" in names
    assert "chamber/common/ledger/write.lua" in names
    assert "chamber/cli/main.py" in names
    assert "chamber/sim/engine.py" in names
    assert "chamber/quota/core/report.py" in names
    for asset in ("index.html", "app.js", "app.css"):
        assert f"chamber/gateway/static/{asset}" in names
    for generated in ("chamber_pb2.py", "chamber_pb2.pyi", "chamber_pb2_grpc.py", "chamber.proto"):
        assert f"chamber/gateway/rpc/{generated}" in names
    for generated in ("podresources_pb2.py", "podresources_pb2.pyi", "podresources_pb2_grpc.py", "podresources.proto"):
        assert f"chamber/collector/agent/{generated}" in names, "the kubelet PodResources client is generated too"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "chamber = chamber.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
