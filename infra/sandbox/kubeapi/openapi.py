"""OpenAPI v3 documents: the operations kubectl looks for, and the schemas `kubectl explain` reads.

kubectl's `apply`/`create` refuse to run (strict validation) unless the OpenAPI v3 document of
the object's group/version lists a PATCH operation, tagged with the object's GVK, accepting the
`fieldValidation` query parameter; then kubectl leaves validation to the server.

The schemas of built-in kinds are built from the official Python client's models (generated from
the same OpenAPI, so the fields, types and descriptions are the API server's); the Gateway API
kinds, served as custom resources, get an open object schema.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

from .resources import RESOURCES

SCHEMA_PREFIX = "io.k8s.sandbox."
_PRIMITIVES = {"str": {"type": "string"}, "int": {"type": "integer", "format": "int64"},
               "bool": {"type": "boolean"}, "float": {"type": "number", "format": "double"},
               "datetime": {"type": "string", "format": "date-time"}, "date": {"type": "string", "format": "date"},
               "object": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{SCHEMA_PREFIX}{name.removeprefix('V1')}"}


def _description(prop: property) -> str:
    """The field's description: the middle paragraph of the generated getter's docstring."""
    parts = [p.replace("# noqa: E501", "").strip() for p in (prop.fget.__doc__ or "").split("\n\n")]
    return parts[1] if len(parts) > 2 else ""


def _required(model: type, attribute: str) -> bool:
    setter = getattr(model, attribute).fset
    return setter is not None and "must not be `None`" in inspect.getsource(setter)


def _schema_of(type_name: str, schemas: dict[str, Any], models: Any) -> dict[str, Any]:
    if type_name in _PRIMITIVES:
        return dict(_PRIMITIVES[type_name])
    if match := re.fullmatch(r"list\[(.+)\]", type_name):
        return {"type": "array", "items": _schema_of(match.group(1), schemas, models)}
    if match := re.fullmatch(r"dict\(str, (.+)\)", type_name):
        return {"type": "object", "additionalProperties": _schema_of(match.group(1), schemas, models)}
    model = getattr(models, type_name, None)
    if model is None:
        return {"type": "object"}
    _add_model(model, schemas, models)
    return _ref(type_name)


def _add_model(model: type, schemas: dict[str, Any], models: Any) -> str:
    name = SCHEMA_PREFIX + model.__name__.removeprefix("V1")
    if name in schemas:
        return name
    schemas[name] = schema = {"type": "object", "properties": {}}
    required = []
    for attribute, type_name in model.openapi_types.items():
        field = model.attribute_map[attribute]
        prop = _schema_of(type_name, schemas, models)
        description = _description(getattr(model, attribute))
        schema["properties"][field] = ({"allOf": [prop], "description": description} if "$ref" in prop
                                       else {**prop, "description": description})
        if _required(model, attribute):
            required.append(field)
    if required:
        schema["required"] = required
    return name


@functools.lru_cache(maxsize=None)
def _schemas(path: str) -> dict[str, Any]:
    """Schemas of the kinds served under one group/version, by their GVK."""
    from kubernetes import client as models  # heavy import: only when kubectl explain asks

    schemas: dict[str, Any] = {}
    for r in RESOURCES:
        if _gv_path(r.group, r.version) != path or r.verbs == ("create",):
            continue
        gvk = [{"group": r.group, "version": r.version, "kind": r.kind}]
        model = getattr(models, f"V1{r.kind}", None)
        if model is None or r.custom:
            name = f"{SCHEMA_PREFIX}{r.kind}"
            schemas[name] = {"type": "object", "description": f"{r.kind} ({r.api_version}), a custom resource.",
                             "x-kubernetes-preserve-unknown-fields": True,
                             "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                            "metadata": {"type": "object"}, "spec": {"type": "object"},
                                            "status": {"type": "object"}}}
        else:
            name = _add_model(model, schemas, models)
        schemas[name]["x-kubernetes-group-version-kind"] = gvk
    return schemas


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def root() -> dict[str, Any]:
    paths = {_gv_path(r.group, r.version) for r in RESOURCES}
    return {"paths": {p: {"serverRelativeURL": f"/openapi/v3/{p}?hash=tideplane"} for p in sorted(paths)}}


def group_version(path: str) -> dict[str, Any] | None:
    """The document for `api/v1` or `apis/<group>/<version>`, or None when unknown."""
    paths: dict[str, Any] = {}
    for r in RESOURCES:
        if _gv_path(r.group, r.version) != path:
            continue
        prefix = f"/{path}/namespaces/{{namespace}}/{r.plural}" if r.namespaced else f"/{path}/{r.plural}"
        gvk = {"group": r.group, "version": r.version, "kind": r.kind}
        params = [{"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
                  for n in ("dryRun", "fieldManager", "fieldValidation")]
        ok = {"responses": {"200": {"description": "OK"}}, "parameters": params}
        paths[prefix] = {"post": {"operationId": f"create{r.kind}", "x-kubernetes-action": "post",
                                  "x-kubernetes-group-version-kind": gvk, **ok}}
        paths[f"{prefix}/{{name}}"] = {
            "patch": {"operationId": f"patch{r.kind}", "x-kubernetes-action": "patch",
                      "x-kubernetes-group-version-kind": gvk, **ok},
            "put": {"operationId": f"replace{r.kind}", "x-kubernetes-action": "put",
                    "x-kubernetes-group-version-kind": gvk, **ok},
        }
    if not paths:
        return None
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes (tideplane sandbox)", "version": "v1.32.0"},
            "paths": paths, "components": {"schemas": _schemas(path)}}
