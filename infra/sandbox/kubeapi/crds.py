"""CustomResourceDefinitions: kinds that exist only once a CRD for them is applied, as on a real cluster.

- A CRD (``apiextensions.k8s.io/v1``) is checked as the apiextensions server checks it (name is
  ``<plural>.<group>``, scope, names, at least one version, exactly one storage version, a schema
  per version) and answered with ``NamesAccepted`` and ``Established`` conditions.
- While it exists, each served version is a resource: discovery lists it, its REST paths answer,
  kubectl and the Python client's ``CustomObjectsApi`` use it. Deleting the CRD deletes its objects
  and the paths answer 404 again.
- Objects are defaulted, pruned of fields the structural schema does not declare, and validated
  against the version's ``openAPIV3Schema`` (type, required, enum, minimum/maximum, min/maxItems,
  min/maxLength) with the apiextensions validator's messages, as 422 Invalid.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from .resources import BY_KEY, BY_PATH, CUSTOM_GROUPS, GROUP_VERSIONS, RESOURCES, Resource
from .timestamps import now_iso


APIEXTENSIONS = "apiextensions.k8s.io"
CRD_KEY = f"customresourcedefinitions.{APIEXTENSIONS}"
SCHEMAS: dict[str, dict[str, Any]] = {}  # resource key@version -> openAPIV3Schema of a served CRD version
_FROM_CRD: dict[str, str] = {}  # resource path key -> CRD name that registered it

Causes = list[tuple[str, str, str]]


def _served(crd: dict[str, Any]) -> list[tuple[Resource, dict[str, Any]]]:
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out = []
    for version in spec.get("versions") or []:
        if not version.get("served"):
            continue
        subresources = tuple(k for k in ("status", "scale") if k in (version.get("subresources") or {}))
        res = Resource(spec["group"], version["name"], names["plural"], names["kind"], spec.get("scope") == "Namespaced",
                       tuple(names.get("shortNames") or ()), subresources, tuple(names.get("categories") or ()))
        out.append((res, (version.get("schema") or {}).get("openAPIV3Schema") or {}))
    return out


def _path_key(res: Resource) -> str:
    return f"{res.key}@{res.version}"


def schema_of(res: Resource) -> dict[str, Any] | None:
    return SCHEMAS.get(_path_key(res))


def sync(objects: dict[str, dict]) -> None:
    """Serve exactly the versions the stored CRDs declare (called under the store's lock after a CRD
    write, with the store's objects by resource key)."""
    wanted: dict[str, tuple[Resource, dict[str, Any], str]] = {}
    for crd in objects[CRD_KEY].values():
        for res, schema in _served(crd):
            wanted[_path_key(res)] = (res, schema, crd["metadata"]["name"])
    for key in [k for k in _FROM_CRD if k not in wanted]:
        res = next(r for r in RESOURCES if _path_key(r) == key)
        RESOURCES.remove(res)
        del BY_PATH[(res.group, res.version, res.plural)], SCHEMAS[key], _FROM_CRD[key]
        if not any(r.key == res.key for r in RESOURCES):
            BY_KEY.pop(res.key, None)
            objects.pop(res.key, None)  # a deleted CRD takes its objects with it
        GROUP_VERSIONS[res.group].remove(res.version)
        if not GROUP_VERSIONS[res.group]:
            del GROUP_VERSIONS[res.group]
    for key, (res, schema, crd_name) in wanted.items():
        if key not in _FROM_CRD:
            RESOURCES.append(res)
            BY_PATH[(res.group, res.version, res.plural)] = res
            BY_KEY.setdefault(res.key, res)
            CUSTOM_GROUPS.add(res.group)
            if res.version not in GROUP_VERSIONS.setdefault(res.group, []):
                GROUP_VERSIONS[res.group].append(res.version)
            objects.setdefault(res.key, {})
            _FROM_CRD[key] = crd_name
        SCHEMAS[key] = schema


def check_definition(causes: Causes, crd: dict[str, Any]) -> None:
    """What the apiextensions server refuses in a CRD."""
    spec = crd.get("spec")
    if not isinstance(spec, dict):
        causes.append(("spec", "FieldValueRequired", "Required value"))
        return
    names = spec.get("names") or {}
    for field, value in (("spec.group", spec.get("group")), ("spec.names.plural", names.get("plural")),
                         ("spec.names.kind", names.get("kind"))):
        if not value:
            causes.append((field, "FieldValueRequired", "Required value"))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        causes.append(("spec.scope", "FieldValueNotSupported",
                       f'Unsupported value: "{spec.get("scope") or ""}": supported values: "Cluster", "Namespaced"'))
    name = (crd.get("metadata") or {}).get("name")
    if spec.get("group") and names.get("plural") and name != f"{names['plural']}.{spec['group']}":
        causes.append(("metadata.name", "FieldValueInvalid",
                       f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group'))
    versions = spec.get("versions") or []
    if not versions:
        causes.append(("spec.versions", "FieldValueInvalid", "Invalid value: null: must have exactly one version marked as storage version"))
        return
    if sum(bool(v.get("storage")) for v in versions) != 1:
        causes.append(("spec.versions", "FieldValueInvalid",
                       "Invalid value: []apiextensions.CustomResourceDefinitionVersion{...}: must have exactly one version marked as storage version"))
    for n, version in enumerate(versions):
        if not version.get("name"):
            causes.append((f"spec.versions[{n}].name", "FieldValueRequired", "Required value"))
        if not ((version.get("schema") or {}).get("openAPIV3Schema")):
            causes.append((f"spec.versions[{n}].schema.openAPIV3Schema", "FieldValueRequired",
                           "Required value: schemas are required"))


def established_status(crd: dict[str, Any]) -> dict[str, Any]:
    """What the apiextensions controllers write once the names are free and the API is served."""
    names = (crd.get("spec") or {}).get("names") or {}
    stamp = now_iso()
    return {
        "acceptedNames": {k: v for k, v in names.items() if k in ("plural", "singular", "kind", "listKind", "shortNames", "categories")},
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found",
             "lastTransitionTime": stamp},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": stamp},
        ],
        "storedVersions": [v["name"] for v in (crd.get("spec") or {}).get("versions") or [] if v.get("storage")],
    }


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}
_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}


def _type_ok(kind: str | None, value: Any) -> bool:
    if kind is None:
        return True
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES.get(kind, object))


def _quote(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def default_and_prune(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting and pruning: absent fields get their ``default``, undeclared ones go."""
    if isinstance(value, dict) and schema.get("type") == "object":
        props = schema.get("properties")
        if props is not None and not schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in schema:
            value = {k: v for k, v in value.items() if k in props}
        for key, sub in (props or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = default_and_prune(sub, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                value[key] = default_and_prune(extra, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [default_and_prune(schema["items"], v) for v in value]
    return value


def check_value(causes: Causes, schema: dict[str, Any], value: Any, field: str) -> None:
    """The apiextensions validator's checks and messages for one value and what it contains."""
    kind = schema.get("type")
    if not _type_ok(kind, value):
        causes.append((field, "FieldValueTypeInvalid",
                       f"Invalid value: {_quote(value)}: {field} in body must be of type {kind}: {_quote(_JSON_TYPES.get(type(value), 'null'))}"))
        return
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_quote(v) for v in schema["enum"])
        causes.append((field, "FieldValueNotSupported", f"Unsupported value: {_quote(value)}: supported values: {supported}"))
    if kind in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            causes.append((field, "FieldValueInvalid", f"Invalid value: {value}: {field} in body should be greater than or equal to {schema['minimum']}"))
        if "maximum" in schema and value > schema["maximum"]:
            causes.append((field, "FieldValueInvalid", f"Invalid value: {value}: {field} in body should be less than or equal to {schema['maximum']}"))
    if kind == "string":
        if "minLength" in schema and len(value) < schema["minLength"]:
            causes.append((field, "FieldValueInvalid", f"Invalid value: {_quote(value)}: {field} in body should be at least {schema['minLength']} chars long"))
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            causes.append((field, "FieldValueTooLong", f"Too long: may not be more than {schema['maxLength']} bytes"))
    if kind == "array":
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            causes.append((field, "FieldValueTooMany", f"Too many: {len(value)}: must have at most {schema['maxItems']} items"))
        if "minItems" in schema and len(value) < schema["minItems"]:
            causes.append((field, "FieldValueInvalid", f"Invalid value: {len(value)}: {field} in body should have at least {schema['minItems']} items"))
        for n, item in enumerate(value):
            check_value(causes, schema.get("items") or {}, item, f"{field}[{n}]")
    if kind == "object":
        for key in schema.get("required") or []:
            if key not in value:
                causes.append((f"{field}.{key}" if field else key, "FieldValueRequired", "Required value"))
        for key, sub in (schema.get("properties") or {}).items():
            if key in value and key != "metadata":
                check_value(causes, sub, value[key], f"{field}.{key}" if field else key)


def check_object(causes: Causes, schema: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """Default, prune and validate a custom object against its version's schema; returns the pruned object."""
    meta = obj.get("metadata")
    pruned = default_and_prune(schema, {k: v for k, v in obj.items() if k != "metadata"})
    pruned["metadata"] = meta
    pruned.setdefault("apiVersion", obj.get("apiVersion"))
    pruned.setdefault("kind", obj.get("kind"))
    check_value(causes, schema, pruned, "")
    return pruned
