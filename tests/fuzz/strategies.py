"""Hypothesis strategies for fuzzing what Chamber reads: documents shaped like a contract (from its msgspec type
information, so they follow the contracts as they change), then broken in one place; arbitrary JSON; bytes.

Shaped-then-broken documents reach the deep fields (a GPU index inside a sample inside a batch) that random JSON
never would; the arbitrary ones check the decoder's outer edges.
"""

import json
import math
from typing import Any

import msgspec.inspect as mi
from hypothesis import strategies as st

MAX_INT = 2**64
"""Beyond what any field holds, to find overflows."""

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-MAX_INT, max_value=MAX_INT),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
"""Any JSON value."""


def _number(info: Any, integer: bool) -> st.SearchStrategy[Any]:
    lo = info.ge if info.ge is not None else (info.gt if info.gt is not None else None)
    hi = info.le if info.le is not None else (info.lt if info.lt is not None else None)
    if integer:
        lo = None if lo is None else math.ceil(lo) + (1 if info.gt is not None and info.ge is None else 0)
        hi = None if hi is None else math.floor(hi) - (1 if info.lt is not None and info.le is None else 0)
        return st.integers(min_value=lo if lo is not None else -(2**40), max_value=hi if hi is not None else 2**40)
    return st.floats(
        min_value=lo,
        max_value=hi,
        exclude_min=info.gt is not None and info.ge is None,
        exclude_max=info.lt is not None and info.le is None,
        allow_nan=False,
        allow_infinity=False,
    )


def shaped(info: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Plain JSON values that the type described by `info` (msgspec.inspect) accepts."""
    if isinstance(info, mi.StructType | mi.DataclassType):
        required = {f.encode_name: shaped(f.type, depth + 1) for f in info.fields if f.required}
        optional = {f.encode_name: shaped(f.type, depth + 1) for f in info.fields if not f.required}
        tag = getattr(info, "tag", None)
        fixed = {getattr(info, "tag_field", None) or "kind": st.just(tag)} if tag is not None else {}
        doc = st.fixed_dictionaries({**fixed, **required}, optional=optional if depth < 4 else {})
        if getattr(info, "array_like", False):
            names = [f.encode_name for f in info.fields]
            return doc.map(lambda d: [d[n] for n in names if n in d])
        return doc
    if isinstance(info, mi.UnionType):
        return st.one_of([shaped(t, depth) for t in info.types])
    if isinstance(info, mi.NoneType):
        return st.none()
    if isinstance(info, mi.BoolType):
        return st.booleans()
    if isinstance(info, mi.IntType):
        return _number(info, integer=True)
    if isinstance(info, mi.FloatType):
        return _number(info, integer=False)
    if isinstance(info, mi.StrType):
        text = st.from_regex(info.pattern, fullmatch=True) if info.pattern else st.text(max_size=12)
        lo, hi = info.min_length or 0, info.max_length
        return text.filter(lambda s: len(s) >= lo and (hi is None or len(s) <= hi))
    if isinstance(info, mi.LiteralType):
        return st.sampled_from(info.values)
    if isinstance(info, mi.EnumType):
        return st.sampled_from([m.value for m in info.cls])
    if isinstance(info, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        lo = info.min_length or 0
        return st.lists(shaped(info.item_type, depth + 1), min_size=lo, max_size=max(lo, 3 if depth < 4 else 0))
    if isinstance(info, mi.DictType):
        keys = shaped(info.key_type, depth + 1)
        return st.dictionaries(keys, shaped(info.value_type, depth + 1), min_size=info.min_length or 0, max_size=3)
    if isinstance(info, mi.AnyType):
        return json_values
    raise NotImplementedError(f"no strategy for {info!r}")


def contract_documents(type_: Any) -> st.SearchStrategy[Any]:
    """Documents the contract accepts."""
    return shaped(mi.type_info(type_))


@st.composite
def broken(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> Any:
    """A valid document with one place changed: a value replaced, a key dropped or added, a list emptied."""
    doc = draw(valid)
    paths = list(_paths(doc, ()))
    path = draw(st.sampled_from(paths))
    change = draw(st.sampled_from(["replace", "drop", "add"]))
    return _change(doc, path, change, draw)


def _paths(doc: Any, here: tuple[Any, ...]) -> Any:
    yield here
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, (*here, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _paths(value, (*here, i))


def _change(doc: Any, path: tuple[Any, ...], change: str, draw: st.DrawFn) -> Any:
    if not path:
        return draw(json_values)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if change == "replace":
        parent[last] = draw(json_values)
    elif change == "drop":
        del parent[last]
    elif isinstance(parent, dict):
        parent[draw(st.text(max_size=10))] = draw(json_values)
    else:
        parent.append(draw(json_values))
    return doc


def to_json(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def nested(data: bytes, depth: int) -> bytes:
    """`data` inside `depth` arrays or objects (built as bytes: too deep for Python's own structures)."""
    return (
        b'{"x":' * (depth // 2) + b"[" * (depth - depth // 2) + data + b"]" * (depth - depth // 2) + b"}" * (depth // 2)
    )
