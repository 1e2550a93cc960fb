"""Maps the `chamber.*` namespace onto the repository layout.

Each component lives in its own root (`libs/common`, `services/scheduler`, ...) that holds one portion of the
`chamber` namespace package; setuptools' declarative `packages.find` cannot merge one namespace from several roots,
so this file lists the packages and where each one lives. Everything else is in pyproject.toml.
"""

from pathlib import Path

from setuptools import find_namespace_packages, setup

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

packages: list[str] = []
package_dir: dict[str, str] = {}
for root in ROOTS:
    for name in find_namespace_packages(where=root, include=["chamber.*"]):
        if name not in package_dir:
            packages.append(name)
            package_dir[name] = str(Path(root, *name.split(".")))

setup(
    packages=packages,
    package_dir=package_dir,
    package_data={"": ["*.lua", "*.html", "*.js", "*.css", "*.yaml", "py.typed"]},
)
