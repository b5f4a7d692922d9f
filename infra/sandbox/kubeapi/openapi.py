"""A minimal OpenAPI v3 index: just enough for kubectl to see that the server validates fields.

kubectl's `apply`/`create` refuse to run (strict validation) unless the OpenAPI v3 document of
the object's group/version lists a PATCH operation, tagged with the object's GVK, accepting the
`fieldValidation` query parameter; then kubectl leaves validation to the server and needs no
full schema.
"""

from __future__ import annotations

from typing import Any

from .resources import RESOURCES


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
            "paths": paths, "components": {"schemas": {}}}
