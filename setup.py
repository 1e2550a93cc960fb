"""Maps the `chamber.*` namespace onto the repository layout, and generates the gRPC code at build time.

Each component lives in its own root (`libs/common`, `services/scheduler`, ...) that holds one portion of the
`chamber` namespace package; setuptools' declarative `packages.find` cannot merge one namespace from several roots,
so this file lists the packages and where each one lives. Everything else is in pyproject.toml.

The scheduling core's hot modules (`COMPILED`) are compiled to C with mypyc when a wheel is built (`pip install .`,
the image), if a C compiler is there: the same code, type-checked as `make typecheck` does, with the same decisions
and fewer seconds (`chamber bench scheduler` says which core it ran; docs/scheduler.md has the figures). Without a
compiler, or with `CHAMBER_COMPILE=0`, the wheel holds the pure-Python core; `CHAMBER_COMPILE=require` (the image)
fails the build instead. An editable install (`make install`) is never compiled: an edited module must not be
shadowed by a stale build of it.

The `.proto` files (the gateway's API; the kubelet's PodResources API, which the node agent calls) are compiled by
`build_py` (grpcio-tools is a build requirement): into the build directory for a wheel (`pip install .`), next to
the `.proto` for an editable install (`make install`; the generated files are git-ignored). The generated code is
never committed.
"""

import os
import sys
from pathlib import Path

from setuptools import Extension, find_namespace_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOTS = [
    "libs/common",
    "libs/cli",
    "libs/sim",
    "services/collector",
    "services/scheduler",
    "services/health",
    "services/quota",
    "services/gateway",
]
PROTOS = [
    (Path("services/gateway"), Path("chamber/gateway/rpc/chamber.proto")),
    (Path("services/collector"), Path("chamber/collector/agent/podresources.proto")),
]
"""(source root, path below it): each is imported as the module its path names (`chamber.gateway.rpc.chamber_pb2`)."""
CORE = "services/scheduler/chamber/scheduler/core"
COMPILED = [
    *(f"{CORE}/{name}.py" for name in ("cycle", "split", "queue", "state", "admission", "placement", "fleet",
                                       "backfill", "consolidation", "preemption", "whatif", "capacity", "model",
                                       "fill_order", "reasons", "decisions")),
    "libs/common/chamber/common/quota/admission.py",
    "libs/common/chamber/common/quota/book.py",
]  # fmt: skip
"""The modules a scheduling cycle spends its time in (`chamber bench scheduler`), compiled with mypyc."""

packages: list[str] = []
package_dir: dict[str, str] = {}
for root in ROOTS:
    for name in find_namespace_packages(where=root, include=["chamber.*"]):
        if name not in package_dir:
            packages.append(name)
            package_dir[name] = str(Path(root, *name.split(".")))


def compile_protos(out: Path | None) -> None:
    """`protoc` from grpcio-tools: messages (with type stubs) and gRPC stubs, into `out`, or next to each `.proto`
    (None: an editable install)."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    for root, proto in PROTOS:
        dest = root if out is None else out
        dest.mkdir(parents=True, exist_ok=True)
        args = ["protoc", f"-I{root}", f"-I{include}", f"--python_out={dest}", f"--pyi_out={dest}",
                f"--grpc_python_out={dest}", str(root / proto)]  # fmt: skip
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")


COMPILE = os.environ.get("CHAMBER_COMPILE", "1")
""""0": never compile; "require": fail the build rather than fall back to pure Python (the image); else compile
when a C compiler is there."""


def compiled_core() -> list[Extension]:
    """mypyc's extensions for `COMPILED`, when a wheel is being built (`bdist_wheel`: pip and `python -m build`
    build one; an editable install runs `editable_wheel`) and compiling is not turned off."""
    if "bdist_wheel" not in sys.argv[1:] or COMPILE == "0":
        return []
    try:
        from mypyc.build import mypycify

        # mypyc type-checks the modules as `make typecheck` does, with what they import: msgspec is a build
        # requirement for that (pyproject.toml), as mypy is.
        return list(mypycify(["--config-file", "pyproject.toml", *COMPILED], opt_level="3"))
    except (Exception, SystemExit) as err:  # mypyc reports a failed type check by exiting
        if COMPILE == "require":
            raise
        print(f"warning: the scheduling core is not compiled ({err!r}); it runs as pure Python", file=sys.stderr)
        return []


class BuildCompiledCore(build_ext):
    """The compiled core is an optimisation: when it cannot be built (no C compiler), the wheel keeps the pure
    Python modules, and none of the compiled ones (they load as a set: each needs mypyc's shared library)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as err:  # a failing compiler raises one of several types
            if COMPILE == "require":
                raise
            for path in self.get_outputs():
                Path(path).unlink(missing_ok=True)
            self.warn(f"the scheduling core was not compiled ({err}); it runs as pure Python")


class BuildWithProtos(build_py):
    def run(self) -> None:
        compile_protos(None if self.editable_mode else Path(self.build_lib))
        if not self.editable_mode:  # a compiled module of an earlier build would shadow its source in this wheel
            lib = Path(self.build_lib)
            for stale in [*lib.glob("*__mypyc*.so"), *lib.glob("chamber/**/*.so")]:
                stale.unlink()
        super().run()


setup(
    packages=packages,
    package_dir=package_dir,
    package_data={"": ["*.lua", "*.html", "*.js", "*.css", "*.yaml", "*.proto", "py.typed"]},
    cmdclass={"build_py": BuildWithProtos, "build_ext": BuildCompiledCore},
    ext_modules=compiled_core(),
)
