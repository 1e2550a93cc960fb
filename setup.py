"""Maps the `chamber.*` namespace onto the repository layout, and generates the gRPC code at build time.

Each component lives in its own root (`libs/common`, `services/scheduler`, ...) that holds one portion of the
`chamber` namespace package; setuptools' declarative `packages.find` cannot merge one namespace from several roots,
so this file lists the packages and where each one lives. Everything else is in pyproject.toml.

The `.proto` files (the gateway's API; the kubelet's PodResources API, which the node agent calls) are compiled by
`build_py` (grpcio-tools is a build requirement): into the build directory for a wheel (`pip install .`), next to
the `.proto` for an editable install (`make install`; the generated files are git-ignored). The generated code is
never committed.
"""

from pathlib import Path

from setuptools import find_namespace_packages, setup
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


class BuildWithProtos(build_py):
    def run(self) -> None:
        compile_protos(None if self.editable_mode else Path(self.build_lib))
        super().run()


setup(
    packages=packages,
    package_dir=package_dir,
    package_data={"": ["*.lua", "*.html", "*.js", "*.css", "*.yaml", "*.proto", "py.typed"]},
    cmdclass={"build_py": BuildWithProtos},
)
