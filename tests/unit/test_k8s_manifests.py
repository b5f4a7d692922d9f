"""infra/k8s renders offline, runs the worker safely, and grants exactly the API calls the code makes.

The RBAC check reads activities/*.py: every attribute named like a method of the official
kubernetes client's API classes is a call the worker makes (custom-object calls are resolved to
their group and plural from the arguments). METHOD_RBAC maps each to what it needs; a call
missing from the table, a call not granted, or a grant no call needs fails the test.
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
from pathlib import Path

import kubernetes.client
import pytest
import yaml

from workers.config import Settings
from workers.worker import SHUTDOWN_GRACE

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
KUSTOMIZATIONS = [K8S / "base", K8S / "overlays" / "example"]

# kubernetes client method -> (apiGroup, resource, verb). Custom objects are resolved separately.
METHOD_RBAC = {
    "read_namespace": ("", "namespaces", "get"),
    "read_node": ("", "nodes", "get"),
    "list_node": ("", "nodes", "list"),
    "patch_node": ("", "nodes", "patch"),
    "list_namespaced_pod": ("", "pods", "list"),
    "list_pod_for_all_namespaces": ("", "pods", "list"),
    "create_namespaced_pod_eviction": ("", "pods/eviction", "create"),
    "read_namespaced_service": ("", "services", "get"),
    "create_namespaced_service": ("", "services", "create"),
    "patch_namespaced_service": ("", "services", "patch"),
    "delete_namespaced_service": ("", "services", "delete"),
    "create_namespaced_event": ("", "events", "create"),
    "read_namespaced_deployment": ("apps", "deployments", "get"),
    "list_namespaced_deployment": ("apps", "deployments", "list"),
    "list_deployment_for_all_namespaces": ("apps", "deployments", "list"),
    "create_namespaced_deployment": ("apps", "deployments", "create"),
    "replace_namespaced_deployment": ("apps", "deployments", "update"),
    "patch_namespaced_deployment": ("apps", "deployments", "patch"),
    "delete_namespaced_deployment": ("apps", "deployments", "delete"),
    "patch_namespaced_deployment_scale": ("apps", "deployments/scale", "patch"),
}
CUSTOM_VERBS = {"get": "get", "list": "list", "create": "create", "replace": "update", "patch": "patch", "delete": "delete"}
CUSTOM_METHOD = re.compile(r"^(get|list|create|replace|patch|delete)_(namespaced|cluster)_custom_object$")


def _kube_methods() -> set[str]:
    """Every public method of the kubernetes client's *Api classes."""
    names = set()
    for cls_name, cls in vars(kubernetes.client).items():
        if cls_name.endswith("Api") and inspect.isclass(cls) and cls_name != "ApiClient":
            names |= {n for n in vars(cls) if not n.startswith("_") and not n.endswith("_with_http_info")}
    return names


def _constants(tree: ast.Module) -> dict[str, object]:
    """Module-level literal constants (e.g. ROUTE_API = ("gateway.networking.k8s.io", "v1"))."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return found


def _custom_object_need(method: str, node: ast.Attribute, parent: ast.Call, consts: dict, where: str):
    """(group, plural, verb) of a custom-object call, from its (or its wrapper's) arguments."""
    args = parent.args if parent.func is node else parent.args[parent.args.index(node) + 1:]
    flat: list[object] = []
    for arg in args:
        if isinstance(arg, ast.Starred) and isinstance(arg.value, ast.Name) and arg.value.id in consts:
            flat.extend(consts[arg.value.id])
        elif isinstance(arg, ast.Constant):
            flat.append(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in consts:
            flat.append(consts[arg.id])
        else:
            flat.append(None)
    keywords = {k.arg: k.value.value for k in parent.keywords if isinstance(k.value, ast.Constant)}
    verb, scope = CUSTOM_METHOD.match(method).groups()
    plural_at = 3 if scope == "namespaced" else 2
    group = keywords.get("group", flat[0] if flat else None)
    plural = keywords.get("plural", flat[plural_at] if len(flat) > plural_at else None)
    assert isinstance(group, str) and isinstance(plural, str), f"{where}: cannot resolve group/plural of {method}"
    return group, plural, CUSTOM_VERBS[verb]


def code_needs() -> dict[tuple[str, str, str], list[str]]:
    """(apiGroup, resource, verb) -> where activities/ (clients included) call for it."""
    methods = _kube_methods()
    needs: dict[tuple[str, str, str], list[str]] = {}
    for path in sorted((ROOT / "activities").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        consts = _constants(tree)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr in methods):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if CUSTOM_METHOD.match(node.attr):
                parent = parents.get(node)
                assert isinstance(parent, ast.Call), f"{where}: {node.attr} not called in place"
                need = _custom_object_need(node.attr, node, parent, consts, where)
            else:
                assert node.attr in METHOD_RBAC, (
                    f"{where} calls kubernetes {node.attr}: add it to METHOD_RBAC and grant it in infra/k8s/base/rbac.yaml"
                )
                need = METHOD_RBAC[node.attr]
            needs.setdefault(need, []).append(where)
    return needs


def render(kustomization: Path) -> list[dict]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(kustomization)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc is not None]


@pytest.fixture(scope="module", params=KUSTOMIZATIONS, ids=lambda p: p.name)
def objects(request) -> list[dict]:
    return render(request.param)


def one(objects: list[dict], kind: str) -> dict:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def test_every_object_parses(objects):
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "NetworkPolicy"} <= kinds
    for o in objects:
        assert o["apiVersion"] and o["metadata"]["name"], o
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert o["metadata"].get("namespace"), f"{o['kind']} {o['metadata']['name']} has no namespace"


def test_worker_deployment_is_production_shaped(objects):
    deployment = one(objects, "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (worker,) = pod["containers"]
    assert spec["replicas"] >= 2
    assert pod["terminationGracePeriodSeconds"] > SHUTDOWN_GRACE.total_seconds() + 15
    assert worker["args"] == ["worker"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(worker["resources"][kind])
    config = one(objects, "ConfigMap")["data"]
    metrics_port = int(config.get("TIDEPLANE_METRICS_PORT", Settings.model_fields["metrics_port"].default))
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    assert ports["metrics"] == metrics_port
    for probe in ("readinessProbe", "livenessProbe"):
        assert worker[probe]["httpGet"]["port"] in ("metrics", metrics_port)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert worker["securityContext"]["allowPrivilegeEscalation"] is False
    # settings come from the generated ConfigMap (its hashed name is rewritten into the Deployment)
    assert {"configMapRef": {"name": one(objects, "ConfigMap")["metadata"]["name"]}} in worker["envFrom"]


def test_settings_configmap_holds_only_known_settings(objects):
    known = set()
    for field in Settings.model_fields.values():
        known |= set(field.validation_alias.choices)
    config = one(objects, "ConfigMap")["data"]
    assert set(config) <= known, f"unknown settings: {set(config) - known}"
    assert config["TIDEPLANE_KUBE_IN_CLUSTER"] == "true"
    assert not any("KEY" in name for name in config), "secrets belong in a Secret, not the ConfigMap"
    Settings(**{k: v for k, v in config.items()})  # the values validate


def test_rbac_grants_exactly_what_the_code_calls(objects):
    needs = code_needs()
    assert ("apps", "deployments/scale", "patch") in needs and ("", "pods/eviction", "create") in needs  # scanner sees calls
    account = one(objects, "ServiceAccount")
    binding = one(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": account["metadata"]["namespace"]}
    ]
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    role = one(objects, "ClusterRole")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    granted = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, f"no resourceNames/nonResourceURLs expected: {rule}"
        for value in (*rule["apiGroups"], *rule["resources"], *rule["verbs"]):
            assert value != "*", f"wildcard in {rule}"
        granted |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    missing = {need: where for need, where in needs.items() if need not in granted}
    assert not missing, f"called but not granted: {missing}"
    assert not granted - set(needs), f"granted but never called (least privilege): {sorted(granted - set(needs))}"
    assert not any(o["kind"] in ("Role", "RoleBinding") for o in objects)


def test_network_policy_opens_only_metrics_and_named_egress(objects):
    policy = one(objects, "NetworkPolicy")["spec"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    ((ingress,),) = [policy["ingress"]]
    assert ingress["ports"] == [{"protocol": "TCP", "port": 9464}]
    egress_ports = {p["port"] for rule in policy["egress"] for p in rule["ports"]}
    assert egress_ports == {53, 7233, 9090, 8000, 443, 6443}
    assert all(rule.get("to") for rule in policy["egress"]), "every egress rule names its peers"


def test_example_overlay_targets_temporal_cloud():
    objects = render(K8S / "overlays" / "example")
    deployment = one(objects, "Deployment")
    (worker,) = deployment["spec"]["template"]["spec"]["containers"]
    assert worker["image"].startswith("registry.example.com/")
    assert {o["metadata"].get("namespace") for o in objects} <= {"tideplane-system", None}
    env = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in worker["env"]}
    assert env["TIDEPLANE_TEMPORAL_API_KEY"] == "tideplane-temporal"
    assert one(objects, "ConfigMap")["data"]["TIDEPLANE_TEMPORAL_ADDRESS"].endswith(".tmprl.cloud:7233")
    temporal_rule = [r for r in one(objects, "NetworkPolicy")["spec"]["egress"] if r["ports"][0]["port"] == 7233]
    assert temporal_rule[0]["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}]


def test_containerfile_builds_a_non_root_worker():
    text = (K8S / "Containerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and not user[-1].startswith(("root", "0")), user
    assert 'ENTRYPOINT ["tideplane"]' in text and 'CMD ["worker"]' in text
    for source in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for path in source.split():
            assert (ROOT / path).exists(), f"Containerfile copies missing {path}"
    copied = {p.rstrip("/") for line in re.findall(r"^COPY (.+) \S+$", text, re.M) for p in line.split()}
    assert {"workflows", "activities", "workers", "pyproject.toml"} <= copied
