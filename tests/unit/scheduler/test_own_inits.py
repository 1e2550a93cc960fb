"""The core classes with their own `__init__` (written so for the compiled core: the one `dataclass` writes runs
as interpreted Python there, see `chamber.scheduler.core`) take exactly their dataclass fields, in order, with the
same defaults: `dataclasses.replace` and every caller rely on it, and a field added later must not be forgotten."""

import dataclasses
import inspect

import pytest

from chamber.common.contracts import GpuRef
from chamber.scheduler.core.admission import Admissions, Option, QuotaNeed
from chamber.scheduler.core.decisions import Place, Wait
from chamber.scheduler.core.model import RunningJob
from chamber.scheduler.core.reasons import Reason, WaitKind
from tests.support.core import pure_core_only

OWN_INIT = [Place, Wait, Reason, Option, QuotaNeed, Admissions, RunningJob]


@pure_core_only  # (compiled, a native method has no signature to read)
@pytest.mark.parametrize("cls", OWN_INIT, ids=lambda cls: cls.__name__)
def test_an_own_init_takes_the_fields_in_order_with_their_defaults(cls: type) -> None:
    fields = [f for f in dataclasses.fields(cls) if f.init]
    params = list(inspect.signature(cls).parameters.values())  # (the class, so `self` is left out)
    assert [p.name for p in params] == [f.name for f in fields]
    for f, p in zip(fields, params, strict=True):
        if f.default is not dataclasses.MISSING:
            assert p.default == f.default, f.name
        elif f.default_factory is not dataclasses.MISSING:
            assert p.default is None, f.name  # None stands for "a new one" (a default cannot be mutable)
        else:
            assert p.default is inspect.Parameter.empty, f.name


def test_an_own_init_keeps_what_the_generated_one_did() -> None:
    """Frozen ones stay frozen, equal and hashable by value; a defaulted list is a new one each time; a running
    job works out where it holds GPUs when not told; `dataclasses.replace` still makes a changed copy."""
    reason = Reason(WaitKind.QUOTA, "over quota")
    same = Reason(WaitKind.QUOTA, "over quota")
    assert reason == same
    assert hash(reason) == hash(same)
    with pytest.raises(dataclasses.FrozenInstanceError):
        reason.text = "other"  # type: ignore[misc]
    one, two = Admissions([], "", [], []), Admissions([], "", [], [])
    assert one.reclaim_only == []
    assert one.reclaim_only is not two.reclaim_only
    assert dataclasses.replace(Place("j", 1, (), "r"), attempt=2) == Place("j", 2, (), "r")
    gpus = (GpuRef(node="a", index=0), GpuRef(node="a", index=1), GpuRef(node="b", index=0))
    job = RunningJob("j", "t", 1, True, gpus, 0.0, 0.0, None, 0.0, None)
    assert job.spread == (("a", 2), ("b", 1))
    assert (job.borrowed, job.stopping, job.attempt, job.pool) == (False, False, 0, "")
