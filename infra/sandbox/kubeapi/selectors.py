"""Label and field selectors, in the string form of list/watch queries and the LabelSelector form."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .errors import bad_request

Labels = dict[str, str]
Matcher = Callable[[Labels], bool]

_REQUIREMENT = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9._/-]+)\s*"
    r"(?:(?P<op>==|=|!=|\s+in\s+|\s+notin\s+)\s*(?P<value>\([^)]*\)|[A-Za-z0-9._-]*))?\s*$"
)


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def _requirement(key: str, op: str, values: list[str]) -> Matcher:
    if op in ("=", "==", "in"):
        return lambda labels: key in labels and labels[key] in values
    if op in ("!=", "notin"):
        return lambda labels: key not in labels or labels[key] not in values
    if op == "exists":
        return lambda labels: key in labels
    if op == "!exists":
        return lambda labels: key not in labels
    raise bad_request(f"unable to parse requirement: unknown operator {op!r}")


def parse_label_selector(text: str | None) -> Matcher:
    """`a=b,c!=d,e in (x,y),f notin (z),g,!h` -> predicate over a labels dict."""
    if not text:
        return lambda labels: True
    reqs: list[Matcher] = []
    for part in _split_top(text):
        m = _REQUIREMENT.match(part)
        if not m or (m.group("neg") and m.group("op")):
            raise bad_request(f"unable to parse requirement: invalid label selector {text!r}")
        key, op = m.group("key"), (m.group("op") or "").strip()
        if not op:
            reqs.append(_requirement(key, "!exists" if m.group("neg") else "exists", []))
            continue
        raw = m.group("value") or ""
        if op in ("in", "notin"):
            if not raw.startswith("("):
                raise bad_request(f"unable to parse requirement: {op} needs a (set) in {text!r}")
            values = [v.strip() for v in raw[1:-1].split(",") if v.strip()]
        else:
            if raw.startswith("("):
                raise bad_request(f"unable to parse requirement: invalid value in {text!r}")
            values = [raw]
        reqs.append(_requirement(key, op, values))
    return lambda labels: all(r(labels) for r in reqs)


def label_selector_matcher(selector: dict[str, Any] | None) -> Matcher:
    """A metav1.LabelSelector (matchLabels + matchExpressions); an empty selector matches everything."""
    selector = selector or {}
    reqs: list[Matcher] = [_requirement(k, "=", [v]) for k, v in (selector.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in selector.get("matchExpressions") or []:
        reqs.append(_requirement(expr["key"], ops.get(expr.get("operator"), "?"), list(expr.get("values") or [])))
    return lambda labels: all(r(labels) for r in reqs)


def label_selector_string(selector: dict[str, Any] | None) -> str:
    """Render a LabelSelector as the string form (Scale.status.selector)."""
    selector = selector or {}
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op, key, values = expr.get("operator"), expr["key"], ",".join(expr.get("values") or [])
        parts.append({"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})",
                      "Exists": key, "DoesNotExist": f"!{key}"}.get(op, key))
    return ",".join(parts)


_FIELD_DEFAULTS = {"spec.unschedulable": "false"}


def field_value(obj: dict[str, Any], path: str) -> str:
    """A field as a field selector compares it: missing -> "" (or the API default), bools lower-case."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return _FIELD_DEFAULTS.get(path, "")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(text: str | None) -> Callable[[dict[str, Any]], bool]:
    """`metadata.name=x,spec.nodeName!=,status.phase==Running` -> predicate over an object."""
    if not text:
        return lambda obj: True
    reqs = []
    for part in _split_top(text):
        m = re.match(r"^\s*([A-Za-z0-9._]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not m:
            raise bad_request(f"invalid field selector: {text!r}")
        path, op, value = m.groups()
        reqs.append((path, op == "!=", value))
    return lambda obj: all((field_value(obj, p) == v) != neg for p, neg, v in reqs)
