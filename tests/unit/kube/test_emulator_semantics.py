"""The emulator's API semantics: selectors, patches and disruption budgets."""

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chamber.cli.kubesim.semantics import (
    SelectorError,
    disruptions_allowed,
    field_matcher,
    label_matcher,
    merge_patch,
    strategic_merge_patch,
)

SELECTORS = [
    ("a=1", {"a": "1"}, True), ("a==1", {"a": "2"}, False), ("a!=1", {}, True), ("a", {"a": ""}, True),
    ("!a", {"a": "x"}, False), ("a in (1, 2),b", {"a": "2", "b": "x"}, True), ("a notin (1,2)", {"a": "1"}, False),
    ("", {"x": "y"}, True),
]  # fmt: skip


@pytest.mark.parametrize(("selector", "labels", "expected"), SELECTORS)
def test_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert label_matcher(selector)(labels) is expected


def test_field_selectors_and_bad_selectors() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    assert field_matcher("spec.nodeName=n1,status.phase!=Failed")(pod)
    assert not field_matcher("spec.nodeName=n2")(pod)
    with pytest.raises(SelectorError):
        label_matcher("a in")
    with pytest.raises(SelectorError):
        field_matcher("spec.nodeName")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)
objects = st.dictionaries(st.text(max_size=3), json_values, max_size=4)


@given(objects, objects)
def test_a_merge_patch_sets_every_key_it_names_and_keeps_the_rest(
    target: dict[str, Any], patch: dict[str, Any]
) -> None:
    result = merge_patch(target, patch)
    for key, value in patch.items():
        if value is None:
            assert key not in result
        elif not isinstance(value, dict):
            assert result[key] == value
    for key in target.keys() - patch.keys():
        assert result[key] == target[key]
    assert merge_patch(result, patch) == result, "applying a merge patch twice changes nothing more"


def test_strategic_merge_merges_keyed_lists_and_replaces_atomic_ones() -> None:
    pod = {"spec": {"containers": [{"name": "a", "image": "x"}], "tolerations": [{"key": "t1"}]},
           "metadata": {"finalizers": ["f1"]}}  # fmt: skip
    patch = {"spec": {"containers": [{"name": "a", "image": "y"}, {"name": "b"}], "tolerations": [{"key": "t2"}]},
             "metadata": {"finalizers": ["f2"]}}  # fmt: skip
    out = strategic_merge_patch(pod, patch)
    assert out["spec"]["containers"] == [{"name": "a", "image": "y"}, {"name": "b"}]
    assert out["spec"]["tolerations"] == [{"key": "t2"}]
    assert out["metadata"]["finalizers"] == ["f1", "f2"]
    removed = strategic_merge_patch(out, {"spec": {"containers": [{"name": "b", "$patch": "delete"}]}})
    assert [c["name"] for c in removed["spec"]["containers"]] == ["a"]


def test_disruption_budget_arithmetic() -> None:
    assert disruptions_allowed({"spec": {"minAvailable": 2}}, healthy=2, total=2) == 0
    assert disruptions_allowed({"spec": {"minAvailable": "50%"}}, healthy=4, total=4) == 2
    assert disruptions_allowed({"spec": {"maxUnavailable": 1}}, healthy=3, total=4) == 0
