"""infra/k8s renders offline, runs the worker safely, and grants exactly the API calls the code makes.

The RBAC check reads every module under activities/ (activities/clients/ included): every attribute named like a method of the official
kubernetes client's API classes is a call the worker makes (custom-object calls are resolved to
their group and plural from the arguments). METHOD_RBAC maps each to what it needs; a call
missing from the table, a call not granted, or a grant no call needs fails the test.
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import tomllib
from pathlib import Path

import kubernetes.client
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from activities.clients.kube import SERVING_NAMESPACE_LABEL
from workers.config import Settings
from workers.worker import SHUTDOWN_GRACE

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "infra" / "k8s"
KUSTOMIZATIONS = [K8S / "base", K8S / "overlays" / "example"]
# The namespace each worker kustomization serves in: what `kubectl apply -k` enables there.
SERVING = {"base": K8S / "serving-namespace", "example": K8S / "overlays" / "example" / "namespaces" / "llm-serving"}

# kubernetes client method -> (apiGroup, resource, verb). Custom objects are resolved separately.
METHOD_RBAC = {
    "read_namespace": ("", "namespaces", "get"),
    "read_node": ("", "nodes", "get"),
    "list_node": ("", "nodes", "list"),
    "patch_node": ("", "nodes", "patch"),
    "list_namespaced_pod": ("", "pods", "list"),
    "list_pod_for_all_namespaces": ("", "pods", "list"),
    "patch_namespaced_pod": ("", "pods", "patch"),
    "create_namespaced_pod_eviction": ("", "pods/eviction", "create"),
    "read_namespaced_service": ("", "services", "get"),
    "create_namespaced_service": ("", "services", "create"),
    "patch_namespaced_service": ("", "services", "patch"),
    "delete_namespaced_service": ("", "services", "delete"),
    "create_namespaced_event": ("", "events", "create"),
    "list_namespaced_event": ("", "events", "list"),
    "read_namespaced_deployment": ("apps", "deployments", "get"),
    "list_namespaced_deployment": ("apps", "deployments", "list"),
    "list_deployment_for_all_namespaces": ("apps", "deployments", "list"),
    "create_namespaced_deployment": ("apps", "deployments", "create"),
    "replace_namespaced_deployment": ("apps", "deployments", "update"),
    "patch_namespaced_deployment": ("apps", "deployments", "patch"),
    "delete_namespaced_deployment": ("apps", "deployments", "delete"),
    "patch_namespaced_deployment_scale": ("apps", "deployments/scale", "patch"),
    "create_namespaced_job": ("batch", "jobs", "create"),
    "list_namespaced_job": ("batch", "jobs", "list"),
}
# Discovery (/apis): every authenticated user may read it (the bootstrap system:discovery ClusterRole).
DISCOVERY_METHODS = {"get_api_versions"}
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
    """Module-level literal constants (e.g. ROUTE_API = ("gateway.networking.k8s.io", "v1")), and those
    imported by name from another module of activities/ (activities/core/deployments.py's ROUTE_API)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("activities."):
            source = ROOT / (node.module.replace(".", "/") + ".py")
            if source.is_file():
                theirs = _constants(ast.parse(source.read_text()))
                found.update({a.asname or a.name: theirs[a.name] for a in node.names if a.name in theirs})
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
            if not (isinstance(node, ast.Attribute) and node.attr in methods) or node.attr in DISCOVERY_METHODS:
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


@pytest.fixture(scope="module")
def serving_objects(objects) -> list[dict]:
    """The enabled serving namespace of the same kustomization (``objects``' parameter)."""
    worker_namespace = one(objects, "ServiceAccount")["metadata"]["namespace"]
    return render(SERVING["base" if worker_namespace == "tideplane" else "example"])


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


def test_worker_reads_its_payload_key_from_a_secret(objects):
    """Payload encryption is required by default: every rendering gives the worker its key, from a
    Secret (never a literal), and does not opt out in the settings."""
    (worker,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in worker["env"]}
    assert env["TIDEPLANE_PAYLOAD_ENCRYPTION_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "tideplane-temporal", "key": "payload-key"}
    assert "TIDEPLANE_PAYLOAD_ENCRYPTION" not in one(objects, "ConfigMap")["data"]


def test_settings_configmap_holds_only_known_settings(objects):
    known = set()
    for field in Settings.model_fields.values():
        known |= set(field.validation_alias.choices)
    config = one(objects, "ConfigMap")["data"]
    assert set(config) <= known, f"unknown settings: {set(config) - known}"
    assert config["TIDEPLANE_KUBE_IN_CLUSTER"] == "true"
    assert not any("KEY" in name for name in config), "secrets belong in a Secret, not the ConfigMap"
    Settings(**{k: v for k, v in config.items()})  # the values validate


def _grants(role: dict) -> set[tuple[str, str, str]]:
    granted = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, f"no resourceNames/nonResourceURLs expected: {rule}"
        for value in (*rule["apiGroups"], *rule["resources"], *rule["verbs"]):
            assert value != "*", f"wildcard in {rule}"
        granted |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return granted


def test_rbac_grants_exactly_what_the_code_calls(objects, serving_objects):
    needs = code_needs()
    assert ("apps", "deployments/scale", "patch") in needs and ("", "pods/eviction", "create") in needs  # scanner sees calls
    account = one(objects, "ServiceAccount")
    subject = {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": account["metadata"]["namespace"]}
    binding = one(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [subject]
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    cluster_role = one(objects, "ClusterRole")
    assert binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert not any(o["kind"] in ("Role", "RoleBinding") for o in objects)
    role, role_binding = one(serving_objects, "Role"), one(serving_objects, "RoleBinding")
    assert role_binding["subjects"] == [subject]
    assert role_binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    cluster_wide, namespaced = _grants(cluster_role), _grants(role)
    granted = cluster_wide | namespaced
    missing = {need: where for need, where in needs.items() if need not in granted}
    assert not missing, f"called but not granted: {missing}"
    assert not granted - set(needs), f"granted but never called (least privilege): {sorted(granted - set(needs))}"
    assert not cluster_wide & namespaced, "granted twice"
    # Writes happen only where a namespace is enabled; cluster-wide: reads, and cordoning nodes.
    cluster_writes = {(g, r, v) for g, r, v in cluster_wide if v not in ("get", "list") and r != "nodes"}
    assert not cluster_writes, f"cluster-wide writes: {sorted(cluster_writes)}"


def test_serving_namespace_is_labelled_where_its_role_is(serving_objects, objects):
    """`kubectl apply -k` of a serving namespace labels it (the worker's check, the NetworkPolicy's
    selector) and binds the Role in that same namespace."""
    namespace = one(serving_objects, "Namespace")["metadata"]
    assert namespace["labels"][SERVING_NAMESPACE_LABEL] == "true"
    for kind in ("Role", "RoleBinding"):
        assert one(serving_objects, kind)["metadata"]["namespace"] == namespace["name"]
    warm_up = [r for r in one(objects, "NetworkPolicy")["spec"]["egress"] if r["ports"][0]["port"] == 8000]
    assert warm_up[0]["to"] == [{"namespaceSelector": {"matchLabels": {SERVING_NAMESPACE_LABEL: "true"}}}]


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
    # the base by digest only: a tag can be moved to other bytes
    (base,) = re.findall(r"^FROM (\S+)$", text, re.M)
    assert base == "docker.io/library/python:3.11-slim-bookworm@${BASE_DIGEST}"
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and not user[-1].startswith(("root", "0")), user
    assert 'ENTRYPOINT ["tideplane"]' in text and 'CMD ["worker"]' in text
    for source in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for path in source.split():
            assert (ROOT / path).exists(), f"Containerfile copies missing {path}"
    copied = {p.rstrip("/") for line in re.findall(r"^COPY (.+) \S+$", text, re.M) for p in line.split()}
    assert {"workflows", "activities", "workers", "pyproject.toml"} <= copied


def test_the_image_installs_only_hashed_locked_dependencies():
    """Every dependency of pyproject.toml is in the lock, pinned to a version it allows, with hashes;
    the Containerfile installs the lock with --require-hashes and tideplane itself without an index."""
    text = (K8S / "Containerfile").read_text().replace("\\\n", " ")
    assert "pip install --require-hashes --no-deps -r requirements.lock" in text
    assert "pip install --no-deps --no-build-isolation --no-index ." in text
    assert not re.search(r"pip install (?!--require-hashes|--no-deps --no-build-isolation --no-index \.)", text)
    pins: dict[str, tuple[str, int]] = {}
    for block in re.split(r"\n(?=[A-Za-z])", (K8S / "requirements.lock").read_text()):
        if not (pin := re.match(r"([A-Za-z0-9._-]+)==(\S+)", block)):
            continue
        name, version = pin.groups()
        pins[canonicalize_name(name)] = (version, len(re.findall(r"--hash=sha256:[0-9a-f]{64}", block)))
    assert all(hashes for _, hashes in pins.values()), [n for n, (_, h) in pins.items() if not h]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [line for line in (K8S / "requirements.in").read_text().splitlines() if line and not line.startswith("#")]
    for requirement in map(Requirement, [*project["dependencies"], *extras]):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in infra/k8s/requirements.lock: run infra/k8s/lock.sh"
        assert requirement.specifier.contains(pins[name][0], prereleases=True), f"{name}=={pins[name][0]} vs {requirement}"


def test_the_build_refuses_a_base_that_is_not_a_digest(tmp_path):
    script = K8S / "build-image.sh"
    for digest in ("", "latest", "sha256:" + "A" * 64, "sha256:" + "a" * 63):
        done = subprocess.run([str(script), "x:1"], env={"PATH": "/usr/bin:/bin", "BASE_DIGEST": digest}, capture_output=True, text=True, timeout=30)
        assert done.returncode == 2 and "BASE_DIGEST must be sha256:<64 hex digits>" in done.stderr, digest
    digest = "sha256:" + "0123456789abcdef" * 4
    done = subprocess.run([str(script), "x:1"], env={"PATH": "/usr/bin:/bin", "BASE_DIGEST": digest, "BUILDER": "echo"}, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and f"--build-arg BASE_DIGEST={digest} -f infra/k8s/Containerfile" in done.stdout
