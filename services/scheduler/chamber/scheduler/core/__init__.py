"""The scheduler's pure core: snapshots in, decisions out. No I/O, no clock reads, no asyncio.

Its hot modules are compiled with mypyc when Chamber is installed from a wheel on a machine with a C compiler (see
`setup.py`); `build()` says which core this process runs. Compiled, the code makes the same decisions, but its
classes are native ones, which differ from Python's in ways to keep in mind when writing it or its tests:
- a generator expression that is returned or kept (not consumed at once by `any`, `all`, `next`, `sum`, ...) is
  built whole, as a list: where laziness matters (a search that stops early), use `map`, `filter` or a generator
  function;
- patching a method of a core class changes nothing for the compiled code that calls it; a function takes only
  the class it declares (no stand-ins), and attributes hold only their declared types (a list is not a tuple);
- frozen dataclasses (`Shape`, the decisions) cannot be copied or pickled;
- a fixed-length tuple read into a local of its type may be a copy: `is` against the stored one fails (a cache
  keyed by a tuple's identity never hits), so such a cache compares the stored object, read as `object`
  (`JobQueue.lane_item`);
- the `__init__` that `dataclass` writes runs as interpreted Python (~10x the time of a compiled one: a
  cycle spent an eighth of its time constructing decisions, reasons and admissions), so the classes a cycle makes
  by the thousand have their own `__init__`, taking their fields in order with the same defaults
  (`tests/unit/scheduler/test_own_inits.py`); a frozen one sets them with `object.__setattr__`, which compiles to
  a plain store;
- a value reached through `Any` (an item of a walk's `Entry` tuple, say) is looked up generically, attribute by
  attribute: read it into a local of its class first (`split`, `JobQueue.current`).
The tests that rely on Python's behaviour run on the pure-Python core only (`tests.support.core`).
"""

from importlib.machinery import EXTENSION_SUFFIXES


def build() -> str:
    """Which core this process runs: "compiled" (by mypyc) or "python"."""
    from chamber.scheduler.core import cycle

    return "compiled" if (cycle.__file__ or "").endswith(tuple(EXTENSION_SUFFIXES)) else "python"
