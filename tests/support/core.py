"""Which scheduling core the tests run on (`make pytest`: the pure-Python one; `make pytest-compiled`: the one a wheel
compiles with mypyc, see setup.py).

Some tests patch the core's methods (to turn a shortcut off and check that it changes no decision, or to count
what a cycle looks at), deep-copy its objects or hand it a stand-in: compiled classes allow none of that (a patched
method is not what compiled code calls; frozen compiled dataclasses cannot be copied; a compiled function takes
only the class it declares). Those tests run on the pure-Python core only: the compiled core is the same source.
"""

import pytest

from chamber.scheduler.core import build

COMPILED = build() == "compiled"

pure_core_only = pytest.mark.skipif(
    COMPILED, reason="patches, copies or stands in for the core's classes, which compiled classes do not allow"
)
