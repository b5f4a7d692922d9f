"""The three patch formats the API accepts: JSON merge patch, strategic merge patch, JSON patch."""

from __future__ import annotations

import copy
from typing import Any

from .errors import ApiError, bad_request

# Lists that strategic merge patches merge element-by-element, keyed by this field.
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
    "imagePullSecrets": "name", "conditions": "type", "ownerReferences": "uid", "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey", "addresses": "type", "images": None,
}
# Primitive lists that strategic merge unions instead of replacing.
MERGE_PRIMITIVES = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _list_key(field: str, items: list[Any]) -> str | None:
    if field == "ports":  # container ports merge on containerPort, service ports on port
        sample = next((i for i in items if isinstance(i, dict)), {})
        return "containerPort" if "containerPort" in sample else "port"
    return MERGE_KEYS.get(field)


def _merge_list(field: str, target: list[Any], patch: list[Any]) -> list[Any]:
    key = _list_key(field, target + patch)
    if field in MERGE_PRIMITIVES:
        return target + [v for v in patch if v not in target]
    if key is None or not all(isinstance(i, dict) for i in patch):
        return copy.deepcopy([i for i in patch if not (isinstance(i, dict) and "$patch" in i)])
    if any(i.get("$patch") == "replace" for i in patch):
        return copy.deepcopy([i for i in patch if "$patch" not in i])
    result = copy.deepcopy(target)
    for item in patch:
        index = next((n for n, t in enumerate(result) if isinstance(t, dict) and t.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(strategic_merge({}, item))
        else:
            result[index] = strategic_merge(result[index], item)
    return result


def _set_order(items: list[Any], order: list[Any], field: str) -> list[Any]:
    key = _list_key(field, items)
    ident = (lambda i: i.get(key) if isinstance(i, dict) else i) if key else (lambda i: i)
    wanted = [ident(o) if isinstance(o, dict) else o for o in order]
    ranked = {v: n for n, v in enumerate(wanted)}
    return sorted(items, key=lambda i: ranked.get(ident(i), len(ranked)))


def strategic_merge(target: Any, patch: Any) -> Any:
    """Strategic merge patch for the fields tideplane and kubectl patch (directives included)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = value
        elif key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field, []) if v not in value]
        elif key == "$retainKeys":
            continue
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value)
        elif isinstance(value, list):
            result[key] = _merge_list(key, [], value)
        else:
            result[key] = copy.deepcopy(value)
    if "$retainKeys" in patch:
        result = {k: v for k, v in result.items() if k in patch["$retainKeys"]}
    for field, order in orders.items():
        if isinstance(result.get(field), list):
            result[field] = _set_order(result[field], order, field)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, "Invalid", f"jsonpatch: path {path!r} does not exist") from None
    return node


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    try:
        return parent[int(parts[-1])] if isinstance(parent, list) else parent[parts[-1]]
    except (KeyError, IndexError, ValueError, TypeError):
        raise ApiError(422, "Invalid", f"jsonpatch: path {path!r} does not exist") from None


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent = _parent(doc, parts, path)
    try:
        return parent.pop(int(parts[-1])) if isinstance(parent, list) else parent.pop(parts[-1])
    except (KeyError, IndexError, ValueError, TypeError):
        raise ApiError(422, "Invalid", f"jsonpatch: cannot remove missing path {path!r}") from None


def _add(doc: Any, path: str, value: Any, replace: bool = False) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if index > len(parent) or (replace and index >= len(parent)):
            raise ApiError(422, "Invalid", f"jsonpatch: index out of range at {path!r}")
        if replace:
            parent[index] = value
        else:
            parent.insert(index, value)
    elif isinstance(parent, dict):
        if replace and last not in parent:
            raise ApiError(422, "Invalid", f"jsonpatch: replace of missing path {path!r}")
        parent[last] = value
    else:
        raise ApiError(422, "Invalid", f"jsonpatch: cannot add at {path!r}")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902: add, remove, replace, move, copy, test."""
    if not isinstance(ops, list):
        raise bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid json patch operation {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            doc = _add(doc, path, copy.deepcopy(op.get("value")), replace=True)
        elif kind == "move":
            doc = _add(doc, path, _remove(doc, op["from"]))
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise ApiError(422, "Invalid", f"jsonpatch: test failed at {path!r}")
        else:
            raise bad_request(f"unknown json patch operation {kind!r}")
    return doc
