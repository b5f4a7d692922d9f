"""Defaulting and validation of incoming objects: what the real API server rejects with 422."""

from __future__ import annotations

import base64
import json
import random
import re
import uuid
from typing import Any

from . import crds
from .errors import ApiError, bad_request, invalid
from .quantity import parse_quantity
from .resources import KUBERNETES_VERSION, Resource
from .selectors import label_selector_matcher
from .timestamps import now_iso

# apimachinery's validation: the regexes and messages the API server answers with.
_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_DNS1035_LABEL = "[a-z]([-a-z0-9]*[a-z0-9])?"
_QUALIFIED_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
LABEL_VALUE_MAX = 63
ANNOTATIONS_MAX_BYTES = 256 * 1024
DNS1123_LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                     "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
                     f"validation is '{_DNS1123_LABEL}')")
DNS1123_SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                         "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                         f"validation is '{_DNS1123_SUBDOMAIN}')")
DNS1035_LABEL_MSG = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                     "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
                     f"regex used for validation is '{_DNS1035_LABEL}')")
QUALIFIED_NAME_MSG = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                      "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                      f"validation is '{_QUALIFIED_NAME}')")
LABEL_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                   "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
                   f"'12345', regex used for validation is '{_LABEL_VALUE}')")


def _matches(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


def dns1123_label_errors(value: str) -> list[str]:
    errs = ["must be no more than 63 characters"] if len(value) > 63 else []
    return errs + ([] if _matches(_DNS1123_LABEL, value) else [DNS1123_LABEL_MSG])


def dns1123_subdomain_errors(value: str) -> list[str]:
    errs = ["must be no more than 253 characters"] if len(value) > 253 else []
    return errs + ([] if _matches(_DNS1123_SUBDOMAIN, value) else [DNS1123_SUBDOMAIN_MSG])


def dns1035_label_errors(value: str) -> list[str]:
    errs = ["must be no more than 63 characters"] if len(value) > 63 else []
    return errs + ([] if _matches(_DNS1035_LABEL, value) else [DNS1035_LABEL_MSG])


def path_segment_errors(value: str) -> list[str]:
    """RBAC objects and a few others only need a name that can sit in a URL path."""
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in value]


def qualified_name_errors(value: str) -> list[str]:
    """A label or annotation key: an optional DNS subdomain prefix and a 63-character name part."""
    prefix, _, name = value.rpartition("/") if "/" in value else ("", "", value)
    errs: list[str] = []
    if value.count("/") > 1:
        return ["a qualified name " + QUALIFIED_NAME_MSG[len("name part "):] + " with an optional DNS subdomain "
                "prefix and '/' (e.g. 'example.com/MyName')"]
    if "/" in value:
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs += [f"prefix part {e}" for e in dns1123_subdomain_errors(prefix)]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if name and not _matches(_QUALIFIED_NAME, name):
        errs.append(QUALIFIED_NAME_MSG)
    return errs


def label_value_errors(value: str) -> list[str]:
    errs = [f"must be no more than {LABEL_VALUE_MAX} characters"] if len(value) > LABEL_VALUE_MAX else []
    return errs + ([] if _matches(_LABEL_VALUE, value) else [LABEL_VALUE_MSG])


def go_value(value: Any) -> str:
    """A value as the API server prints it in a field error (Go's %#v, close enough)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value)


# Names by kind, as each kind's validation checks metadata.name.
NAME_RULES = {"Namespace": dns1123_label_errors, "Service": dns1035_label_errors,
              "Role": path_segment_errors, "ClusterRole": path_segment_errors,
              "RoleBinding": path_segment_errors, "ClusterRoleBinding": path_segment_errors}


def random_suffix(n: int = 5) -> str:
    return "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(n))


Causes = list[tuple[str, str, str]]


def _required(causes: Causes, field: str, what: str = "Required value") -> None:
    causes.append((field, "FieldValueRequired", what))


def _bad(causes: Causes, field: str, value: Any, why: str) -> None:
    causes.append((field, "FieldValueInvalid", f"Invalid value: {go_value(value)}: {why}"))


def _string_map(causes: Causes, values: Any, field: str) -> bool:
    """Whether there is a map of strings to check (absent is fine; anything else is a cause)."""
    if values is None:
        return False
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        _bad(causes, field, values, "must be a map of strings")
        return False
    return True


def check_labels(causes: Causes, labels: Any, field: str) -> None:
    """Label keys are qualified names, values 63-character label values (ValidateLabels)."""
    if not _string_map(causes, labels, field):
        return
    for key, value in labels.items():
        for why in qualified_name_errors(key):
            _bad(causes, field, key, why)
        for why in label_value_errors(value):
            _bad(causes, field, value, why)


def check_annotations(causes: Causes, annotations: Any, field: str) -> None:
    """Annotation keys are qualified names (lowercased); keys and values total at most 256 KiB."""
    if not _string_map(causes, annotations, field):
        return
    for key in annotations:
        for why in qualified_name_errors(key.lower()):
            _bad(causes, field, key, why)
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if size > ANNOTATIONS_MAX_BYTES:
        causes.append((field, "FieldValueTooLong", f"Too long: must have at most {ANNOTATIONS_MAX_BYTES} bytes"))


def _containers(causes: Causes, spec: Any, prefix: str) -> None:
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not containers:
        _required(causes, f"{prefix}.containers")
        return
    for n, c in enumerate(containers):
        if not isinstance(c, dict) or not c.get("name"):
            _required(causes, f"{prefix}.containers[{n}].name")
            continue
        if not c.get("image"):
            _required(causes, f"{prefix}.containers[{n}].image")
        _resources(causes, c.get("resources") or {}, f"{prefix}.containers[{n}].resources")


def _extended(name: str) -> bool:
    """An extended resource (nvidia.com/gpu): a domain outside kubernetes.io; never overcommitted,
    counted in whole units."""
    domain = name.split("/", 1)[0] if "/" in name else ""
    return bool(domain) and domain != "kubernetes.io" and not domain.endswith(".kubernetes.io") and not name.startswith("requests.")


def _resources(causes: Causes, resources: dict[str, Any], field: str) -> None:
    """ValidateResourceRequirements: non-negative quantities, extended resources in whole units with
    a limit their request equals, no request above its limit."""
    limits = _quantities(causes, resources.get("limits"), f"{field}.limits")
    requests = _quantities(causes, resources.get("requests"), f"{field}.requests")
    for name, (raw, value) in requests.items():
        if name in limits:
            limit_raw, limit = limits[name]
            if value != limit and _extended(name):
                _bad(causes, f"{field}.requests", str(raw), f"must be equal to {name} limit of {limit_raw}")
            elif value > limit:
                _bad(causes, f"{field}.requests", str(raw), f"must be less than or equal to {name} limit of {limit_raw}")
        elif _extended(name):
            _required(causes, f"{field}.limits", "Required value: Limit must be set for non overcommitable resources")


def _quantities(causes: Causes, values: Any, field: str) -> dict[str, tuple[Any, float]]:
    """The valid quantities of a resource map, by name; a cause for each one that is not."""
    out: dict[str, tuple[Any, float]] = {}
    for key, value in (values or {}).items() if isinstance(values, dict) else []:
        try:
            number = parse_quantity(value)
            if number < 0:
                raise ValueError
        except (ApiError, ValueError):
            _bad(causes, f"{field}[{key}]", value, "must be a non-negative quantity")
            continue
        if _extended(key) and number != int(number):
            _bad(causes, f"{field}[{key}]", str(value), "must be an integer")
            continue
        out[key] = (value, number)
    return out


def _validate_kind(res: Resource, obj: dict[str, Any], causes: Causes) -> None:
    spec = obj.get("spec")
    if res.kind == "Pod":
        _containers(causes, spec or {}, "spec")
    elif res.kind == "Node":
        _node_status(causes, obj)

    elif res.kind == "Job":
        template = (spec or {}).get("template") if isinstance(spec, dict) else None
        if not isinstance(template, dict):
            _required(causes, "spec.template")
            return
        policy = (template.get("spec") or {}).get("restartPolicy")
        if policy not in ("OnFailure", "Never"):
            causes.append(("spec.template.spec.restartPolicy", "FieldValueNotSupported",
                           f'Unsupported value: {go_value(policy or "")}: supported values: "OnFailure", "Never"'))
        check_labels(causes, (template.get("metadata") or {}).get("labels"), "spec.template.metadata.labels")
        _containers(causes, template.get("spec") or {}, "spec.template.spec")
    elif res.kind in ("Deployment", "ReplicaSet", "DaemonSet"):
        if not isinstance(spec, dict):
            _required(causes, "spec")
            return
        replicas = spec.get("replicas", 1)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            _bad(causes, "spec.replicas", replicas, "must be greater than or equal to 0")
        selector = spec.get("selector")
        template = spec.get("template") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        check_labels(causes, (template.get("metadata") or {}).get("labels"), "spec.template.metadata.labels")
        check_annotations(causes, (template.get("metadata") or {}).get("annotations"),
                          "spec.template.metadata.annotations")
        if not isinstance(selector, dict) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
            _required(causes, "spec.selector")
        else:
            check_labels(causes, selector.get("matchLabels"), "spec.selector.matchLabels")
            if not label_selector_matcher(selector)(labels):
                _bad(causes, "spec.template.metadata.labels", labels, "`selector` does not match template `labels`")
        _containers(causes, template.get("spec") or {}, "spec.template.spec")
    elif res.kind == "Service":
        _service(causes, spec if isinstance(spec, dict) else {})
    elif res.kind == "HTTPRoute":
        _http_route(causes, spec)
    elif res.key == crds.CRD_KEY:
        crds.check_definition(causes, obj)


def _service(causes: Causes, spec: dict[str, Any]) -> None:
    """ValidateService's port rules: a ClusterIP Service needs a port; with several, each is named,
    names and port/protocol pairs are unique (a strategic merge patch that changes a port number
    adds a second "http" port, which the API server refuses), numbers are 1-65535."""
    ports = spec.get("ports") or []
    if not ports and spec.get("type", "ClusterIP") != "ExternalName" and spec.get("clusterIP") != "None":
        _required(causes, "spec.ports")
    names: set[str] = set()
    pairs: set[tuple[Any, str]] = set()
    for n, port in enumerate(ports):
        field = f"spec.ports[{n}]"
        if not isinstance(port, dict):
            _bad(causes, field, port, "must be an object")
            continue
        name = port.get("name")
        if len(ports) > 1 and not name:
            _required(causes, f"{field}.name")
        elif name in names:
            causes.append((f"{field}.name", "FieldValueDuplicate", f"Duplicate value: {go_value(name)}"))
        elif name:
            names.add(name)
        number = port.get("port")
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 65535:
            _bad(causes, f"{field}.port", number, "must be between 1 and 65535, inclusive")
        pair = (number, port.get("protocol", "TCP"))
        if pair in pairs:
            causes.append((field, "FieldValueDuplicate", f"Duplicate value: {go_value(port)}"))
        pairs.add(pair)


def _schema_range(causes: Causes, value: Any, field: str, low: int, high: int) -> None:
    """An integer field of a CRD's OpenAPI schema, with the apiextensions validator's messages."""
    if not isinstance(value, int) or isinstance(value, bool):
        causes.append((field, "FieldValueTypeInvalid", f"Invalid value: {go_value(value)}: {field} in body must be of type integer"))
    elif value < low:
        _bad(causes, field, value, f"{field} in body should be greater than or equal to {low}")
    elif value > high:
        _bad(causes, field, value, f"{field} in body should be less than or equal to {high}")


def _http_route(causes: Causes, spec: Any) -> None:
    """The Gateway API CRD's schema and CEL rules for what tideplane writes: parentRefs and backendRefs."""
    if spec is None:
        return
    for n, parent in enumerate(spec.get("parentRefs") or []):
        if not (parent or {}).get("name"):
            _required(causes, f"spec.parentRefs[{n}].name")
    rules = spec.get("rules") or []
    if len(rules) > 16:
        causes.append(("spec.rules", "FieldValueTooMany", f"Too many: {len(rules)}: must have at most 16 items"))
    for r, rule in enumerate(rules):
        for b, ref in enumerate((rule or {}).get("backendRefs") or []):
            field = f"spec.rules[{r}].backendRefs[{b}]"
            if not ref.get("name"):
                _required(causes, f"{field}.name")
            if "weight" in ref:
                _schema_range(causes, ref["weight"], f"{field}.weight", 0, 1000000)
            if "port" in ref:
                _schema_range(causes, ref["port"], f"{field}.port", 1, 65535)
            elif not ref.get("group") and ref.get("kind", "Service") == "Service":
                _bad(causes, field, "object", "Must have port for Service reference")


def check_update(res: Resource, old: dict[str, Any], new: dict[str, Any]) -> None:
    """What an update may not change: a Deployment's selector; no new finalizers while deleting."""
    causes: Causes = []
    if res.kind in ("Deployment", "ReplicaSet", "DaemonSet", "Job"):
        selector = (new.get("spec") or {}).get("selector")
        if selector != (old.get("spec") or {}).get("selector"):
            causes.append(("spec.selector", "FieldValueInvalid",
                           f"Invalid value: {_go_selector(selector)}: field is immutable"))
    if old["metadata"].get("deletionTimestamp"):
        added = set(new["metadata"].get("finalizers") or []) - set(old["metadata"].get("finalizers") or [])
        if added:
            causes.append(("metadata.finalizers", "FieldValueForbidden",
                           f"Forbidden: no new finalizers can be added if the object is being deleted, found new "
                           f"finalizers []string{{{', '.join(json.dumps(f) for f in sorted(added))}}}"))
    if causes:
        raise invalid(res.kind, new["metadata"].get("name"), causes, res.group)


def _go_selector(selector: Any) -> str:
    """A LabelSelector as Go prints it in the immutable-selector error."""
    selector = selector if isinstance(selector, dict) else {}
    labels = selector.get("matchLabels") or {}
    pairs = ", ".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in sorted(labels.items()))
    exprs = selector.get("matchExpressions")
    expr_text = "[]v1.LabelSelectorRequirement(nil)" if not exprs else (
        "[]v1.LabelSelectorRequirement{" + ", ".join(
            f'v1.LabelSelectorRequirement{{Key:{json.dumps(e.get("key"))}, Operator:{json.dumps(e.get("operator"))}, '
            f'Values:[]string{{{", ".join(json.dumps(v) for v in e.get("values") or [])}}}}}' for e in exprs) + "}")
    return (f"v1.LabelSelector{{MatchLabels:map[string]string{{{pairs}}}, MatchExpressions:{expr_text}}}")


def _node_status(causes: Causes, obj: dict[str, Any]) -> None:
    for kind in ("allocatable", "capacity"):
        _quantities(causes, (obj.get("status") or {}).get(kind), f"status.{kind}")


def check_status(res: Resource, obj: dict[str, Any]) -> None:
    """Status writes skip object validation, but a node's resources must still be quantities."""
    causes: Causes = []
    if res.kind == "Node":
        _node_status(causes, obj)
    if causes:
        raise invalid(res.kind, obj["metadata"]["name"], causes, res.group)


def _without_nulls(value: Any) -> Any:
    """A built-in kind is decoded into Go structs: a JSON null is the field's absence."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def prepare(res: Resource, obj: Any, creating: bool) -> dict[str, Any]:
    """Check an incoming object (422 Invalid naming the fields) and fill in the server's defaults."""
    if not isinstance(obj, dict):
        raise bad_request(f"the body of the request must be a JSON object for {res.kind}")
    if not res.custom:
        obj = _without_nulls(obj)
    causes: Causes = []
    if obj.get("kind") not in (None, res.kind):
        _bad(causes, "kind", obj["kind"], f"must be {res.kind}")
    if obj.get("apiVersion") not in (None, res.api_version):
        _bad(causes, "apiVersion", obj["apiVersion"], f"must be {res.api_version}")
    obj["kind"], obj["apiVersion"] = res.kind, res.api_version
    meta = obj.get("metadata")
    if meta is None:
        meta = obj["metadata"] = {}
    if not isinstance(meta, dict):
        raise invalid(res.kind, None, [("metadata", "FieldValueInvalid", "must be an object")], res.group)
    if creating and not meta.get("name") and meta.get("generateName"):
        meta["name"] = f"{meta['generateName']}{random_suffix()}"
    name = meta.get("name")
    if not name:
        _required(causes, "metadata.name", "name or generateName is required")
    elif not isinstance(name, str):
        _bad(causes, "metadata.name", name, "must be a string")
    else:
        for why in NAME_RULES.get(res.kind, dns1123_subdomain_errors)(name):
            _bad(causes, "metadata.name", name, why)
    check_labels(causes, meta.get("labels"), "metadata.labels")
    check_annotations(causes, meta.get("annotations"), "metadata.annotations")
    schema = crds.schema_of(res)
    if schema is not None:
        obj = crds.check_object(causes, schema, obj)
    _validate_kind(res, obj, causes)
    if causes:
        raise invalid(res.kind, name if isinstance(name, str) else None, causes, res.group)
    if not res.namespaced:
        meta.pop("namespace", None)
    _default(res, obj)
    return obj


def _default(res: Resource, obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if res.kind == "Pod":
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        tolerations = spec.setdefault("tolerations", [])
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):  # DefaultTolerationSeconds
            if not any(t.get("key") == key and t.get("effect") in (None, "", "NoExecute") for t in tolerations):
                tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})
        for c in spec["containers"]:
            c.setdefault("imagePullPolicy", "IfNotPresent")
    elif res.kind == "ReplicaSet":
        spec.setdefault("replicas", 1)
    elif res.kind == "Job":
        for key, value in (("completions", 1), ("parallelism", 1), ("backoffLimit", 6), ("suspend", False),
                           ("completionMode", "NonIndexed")):
            spec.setdefault(key, value)
        if "selector" not in spec:  # generated, as the API server does (manualSelector unset)
            uid = obj["metadata"].setdefault("uid", str(uuid.uuid4()))
            spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
            labels = spec["template"].setdefault("metadata", {}).setdefault("labels", {})
            labels.update({"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid,
                           "batch.kubernetes.io/job-name": obj["metadata"]["name"], "job-name": obj["metadata"]["name"]})
    elif res.kind == "DaemonSet":
        spec.setdefault("revisionHistoryLimit", 10)
        strategy = spec.setdefault("updateStrategy", {"type": "RollingUpdate"})
        if strategy.get("type") == "RollingUpdate":
            strategy.setdefault("rollingUpdate", {"maxUnavailable": 1, "maxSurge": 0})
    elif res.kind == "Deployment":
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        strategy = spec.setdefault("strategy", {})
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            rolling.setdefault("maxSurge", "25%")
            rolling.setdefault("maxUnavailable", "25%")
    elif res.kind == "Service":
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if spec["type"] != "ExternalName" and not spec.get("clusterIP"):
            spec["clusterIP"] = f"10.96.{random.randint(0, 255)}.{random.randint(1, 254)}"
            spec["clusterIPs"] = [spec["clusterIP"]]
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
    elif res.kind == "Secret":  # stringData is write-only: merged into data (base64), as the API server does
        string_data = obj.pop("stringData", None) or {}
        if string_data:
            obj["data"] = {**(obj.get("data") or {}),
                           **{key: base64.b64encode(str(value).encode()).decode() for key, value in string_data.items()}}
        obj.setdefault("type", "Opaque")
    elif res.kind == "Namespace":
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")
    elif res.kind == "Node":
        status = obj.setdefault("status", {})
        if status.get("allocatable") and not status.get("capacity"):
            status["capacity"] = dict(status["allocatable"])
        if status.get("capacity") and not status.get("allocatable"):
            status["allocatable"] = dict(status["capacity"])


def reset_status_on_create(res: Resource, obj: dict[str, Any]) -> None:
    """The server owns status: new pods start Pending, new deployments with an empty status."""
    if res.kind == "Pod":
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    elif res.kind == "Deployment":
        obj["status"] = {}
    elif res.kind == "ReplicaSet":
        obj["status"] = {"replicas": 0}
    elif res.kind == "Job":
        obj["status"] = {}
    elif res.key == crds.CRD_KEY:
        obj["status"] = crds.established_status(obj)
    elif res.kind == "DaemonSet":
        obj["status"] = {"currentNumberScheduled": 0, "desiredNumberScheduled": 0, "numberMisscheduled": 0,
                         "numberReady": 0}
    elif res.kind == "Node":
        status = obj["status"]
        if not status.get("conditions"):
            ts = now_iso()
            status["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                     "message": "kubelet is posting ready status",
                                     "lastHeartbeatTime": ts, "lastTransitionTime": ts}]
        name = obj["metadata"]["name"]
        info = {"machineID": name, "systemUUID": name, "bootID": name, "kernelVersion": "6.1.0",
                "osImage": "Amazon Linux 2023", "containerRuntimeVersion": "containerd://1.7.0",
                "kubeletVersion": KUBERNETES_VERSION, "kubeProxyVersion": KUBERNETES_VERSION,
                "operatingSystem": "linux", "architecture": "amd64"}
        status["nodeInfo"] = {**info, **(status.get("nodeInfo") or {})}


def check_replicas(value: Any, kind: str, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise invalid(kind, name, [("spec.replicas", "FieldValueInvalid",
                                    f"Invalid value: {value!r}: must be greater than or equal to 0")])
    return value
