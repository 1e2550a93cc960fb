"""Kubernetes API semantics the emulator needs and kmock 0.8 lacks, as pure functions on plain dicts.

Label and field selectors, RFC 7386 merge patches, strategic merge patches (with the patch merge keys of the
fields Chamber, kubectl and the official client touch; every other list is atomic, as taints are in the real
API), and PodDisruptionBudget arithmetic.
"""

import copy
import re
from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]


class SelectorError(ValueError):
    """A selector the API server would reject (400)."""


# ---- selectors ---------------------------------------------------------------------------------------------------

_SET = re.compile(r"^\s*(!?)([A-Za-z0-9./_-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_EQ = re.compile(r"^\s*([A-Za-z0-9./_-]+)\s*(==|=|!=)\s*([A-Za-z0-9._-]*)\s*$")


def _split(selector: str) -> list[str]:
    """Split on commas outside parentheses (`a in (x,y),b=c` -> two requirements)."""
    parts, depth, current = [], 0, ""
    for ch in selector:
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        current += ch
    parts.append(current)
    return [p for p in parts if p.strip()]


def label_matcher(selector: str | None) -> Callable[[dict[str, str]], bool]:
    """A predicate over a labels dict for a label selector (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`)."""
    reqs: list[tuple[str, str, set[str]]] = []
    for req in _split(selector or ""):
        if m := _EQ.match(req):
            key, op, value = m.groups()
            reqs.append((key, "!=" if op == "!=" else "=", {value}))
        elif m := _SET.match(req):
            neg, key, op, values = m.groups()
            vals = {v.strip() for v in (values or "").split(",") if v.strip()}
            reqs.append((key, op or ("!exists" if neg else "exists"), vals))
        else:
            raise SelectorError(f"unable to parse requirement: {req!r}")

    def matches(labels: dict[str, str]) -> bool:
        for key, op, values in reqs:
            value = labels.get(key)
            ok = {
                "=": value in values, "in": value in values, "!=": value not in values,
                "notin": value not in values, "exists": key in labels, "!exists": key not in labels,
            }[op]  # fmt: skip
            if not ok:
                return False
        return True

    return matches


def field_matcher(selector: str | None) -> Callable[[Obj], bool]:
    """A predicate over an object for a field selector (`metadata.name=x`, `spec.nodeName!=`, `status.phase=...`)."""
    reqs: list[tuple[list[str], bool, str]] = []
    for req in _split(selector or ""):
        m = _EQ.match(req)
        if not m:
            raise SelectorError(f"invalid field selector: {req!r}")
        path, op, value = m.groups()
        reqs.append((path.split("."), op != "!=", value))

    def matches(obj: Obj) -> bool:
        return all((str(dig(obj, path) or "") == value) == equal for path, equal, value in reqs)

    return matches


def match_label_selector(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A structured selector (`matchLabels`, `matchExpressions`) as in webhooks' objectSelector and PDBs."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), set(expr.get("values") or [])
        ok = {
            "In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
            "Exists": key in labels, "DoesNotExist": key not in labels,
        }.get(op, False)  # fmt: skip
        if not ok:
            return False
    return True


def dig(obj: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


# ---- patches -------------------------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, `null` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "volumeMounts": "mountPath", "ports": "containerPort", "conditions": "type",
    "ownerReferences": "uid", "imagePullSecrets": "name", "hostAliases": "ip", "containerStatuses": "name",
}  # fmt: skip
"""Lists the real API merges by a key in a strategic merge patch. Every other list (taints, tolerations, args,
command ...) is atomic: the patch's list replaces it."""
SET_LISTS = {"finalizers"}


def strategic_merge_patch(target: Any, patch: Any, field: str = "") -> Any:
    """Strategic merge: as a merge patch, except lists with a patch merge key merge element by element
    (`$patch: delete` removes one) and `finalizers` merge as a set."""
    if isinstance(patch, list):
        key = MERGE_KEYS.get(field)
        if field in SET_LISTS and isinstance(target, list):
            return target + [v for v in patch if v not in target]
        if key is None or not isinstance(target, list):
            return copy.deepcopy([v for v in patch if not (isinstance(v, dict) and v.get("$patch") == "delete")])
        merged = [dict(item) for item in target]
        for item in patch:
            if not isinstance(item, dict):
                continue
            index = next((i for i, old in enumerate(merged) if old.get(key) == item.get(key)), None)
            if item.get("$patch") == "delete":
                if index is not None:
                    merged.pop(index)
            elif index is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[index] = strategic_merge_patch(merged[index], item)
        return merged
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        else:
            result[key] = strategic_merge_patch(result.get(key), value, key)
    return result


# ---- PodDisruptionBudgets ---------------------------------------------------------------------------------------


def _amount(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        share = int(value[:-1]) * total
        return -(-share // 100) if round_up else share // 100
    return int(value)


def disruptions_allowed(pdb: Obj, healthy: int, total: int) -> int:
    """How many of the budget's pods may be disrupted now (the real controller's arithmetic, simplified)."""
    spec = pdb.get("spec") or {}
    if "minAvailable" in spec:
        return healthy - _amount(spec["minAvailable"], total, round_up=True)
    if "maxUnavailable" in spec:
        return _amount(spec["maxUnavailable"], total, round_up=True) - (total - healthy)
    return healthy
