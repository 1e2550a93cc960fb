"""The scheduler's pure core: snapshots in, decisions out. No I/O, no clock reads, no asyncio.

Its hot modules are compiled with mypyc when Chamber is installed from a wheel on a machine with a C compiler (see
`setup.py`); `build()` says which core this process runs. Compiled, the code means the same, with one difference
to keep in mind when writing it: a generator expression that is returned or kept (not consumed at once by `any`,
`all`, `next`, `sum`, ...) is built whole, as a list; where laziness matters (a search that stops early), use
`map`, `filter` or a generator function.
"""


def build() -> str:
    """Which core this process runs: "compiled" (by mypyc) or "python"."""
    from chamber.scheduler.core import cycle

    return "python" if (cycle.__file__ or "").endswith(".py") else "compiled"
