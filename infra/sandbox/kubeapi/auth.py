"""Authentication (ServiceAccount bearer tokens) and RBAC authorization, as the API server does them.

A request without credentials is the loopback operator (`system:admin`, group `system:masters`),
like the API server's old insecure port: the sandbox's own processes and the tests' admin
kubeconfig use it. A bearer token must be one issued by the TokenRequest API
(`kubectl create token`, `POST .../serviceaccounts/<name>/token`) for a ServiceAccount that still
exists, else 401 (client-go, hence kubectl, sends a token only over TLS, which the emulator does
not serve: kubectl acts as another identity with `--as`, impersonation, instead). Every authenticated request is then authorized by RBAC from the Roles,
ClusterRoles and their bindings in the store, with the bootstrap policy a real cluster starts with
(discovery and self-reviews for everyone authenticated, cluster-admin for `system:masters`).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from . import errors
from .resources import BY_KEY
from .store import Store

RBAC = "rbac.authorization.k8s.io"
ROLES, CLUSTER_ROLES = BY_KEY[f"roles.{RBAC}"], BY_KEY[f"clusterroles.{RBAC}"]
ROLE_BINDINGS, CLUSTER_ROLE_BINDINGS = BY_KEY[f"rolebindings.{RBAC}"], BY_KEY[f"clusterrolebindings.{RBAC}"]
SERVICE_ACCOUNTS = BY_KEY["serviceaccounts"]
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
DEFAULT_TOKEN_SECONDS = 3600


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict, hash=False, compare=False)

    def info(self) -> dict[str, Any]:
        """The UserInfo of a SelfSubjectReview."""
        out: dict[str, Any] = {"username": self.name, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = self.extra
        return out


ADMIN = User("system:admin", (MASTERS, AUTHENTICATED))


@dataclass(frozen=True)
class Attributes:
    """What a request asks to do (the API server's authorizer.Attributes)."""
    verb: str
    path: str = ""
    resource: str = ""
    subresource: str = ""
    group: str = ""
    namespace: str = ""
    name: str = ""
    is_resource: bool = True


@dataclass
class Token:
    namespace: str
    name: str
    uid: str
    expires: float  # time.time()


class Tokens:
    """Bound ServiceAccount tokens issued by the TokenRequest API."""

    def __init__(self, store: Store):
        self.store = store
        self.lock = threading.Lock()
        self.issued: dict[str, Token] = {}

    def request(self, ns: str, name: str, body: Any) -> dict[str, Any]:
        """POST serviceaccounts/<name>/token: a TokenRequest answered with its status.token."""
        sa = self.store.get(SERVICE_ACCOUNTS, ns, name)
        spec = (body or {}).get("spec") or {}
        seconds = spec.get("expirationSeconds") or DEFAULT_TOKEN_SECONDS
        if not isinstance(seconds, int) or seconds < 600:
            raise errors.invalid("TokenRequest", name, [("spec.expirationSeconds", "FieldValueInvalid",
                                 f"Invalid value: {seconds}: may not specify a duration less than 10 minutes")],
                                 "authentication.k8s.io")
        token = "sandbox." + secrets.token_urlsafe(32)
        expires = time.time() + seconds
        with self.lock:
            self.issued[token] = Token(ns, name, sa["metadata"]["uid"], expires)
        stamp = datetime.fromtimestamp(expires, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"name": name, "namespace": ns, "creationTimestamp": None},
                "spec": {"audiences": spec.get("audiences") or ["https://kubernetes.default.svc"],
                         "expirationSeconds": seconds, "boundObjectRef": spec.get("boundObjectRef")},
                "status": {"token": token, "expirationTimestamp": stamp}}

    def authenticate(self, authorization: str | None) -> User:
        """The user a request's Authorization header names; 401 for a token not issued here."""
        if not authorization:
            return ADMIN
        scheme, _, token = authorization.partition(" ")
        with self.lock:
            issued = self.issued.get(token.strip()) if scheme.lower() == "bearer" else None
        if issued is None or issued.expires < time.time():
            raise errors.unauthorized()
        sa = self.store.try_get(SERVICE_ACCOUNTS, issued.namespace, issued.name)
        if sa is None or sa["metadata"]["uid"] != issued.uid:
            raise errors.unauthorized()
        return service_account_user(issued.namespace, issued.name, issued.uid)


def service_account_user(namespace: str, name: str, uid: str = "") -> User:
    return User(f"system:serviceaccount:{namespace}:{name}",
                ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED), uid)


def impersonate(store: Store, user: User, name: str, groups: list[str]) -> User:
    """`kubectl --as=... --as-group=...`: act as another user if RBAC grants `impersonate` on it."""
    if name.startswith("system:serviceaccount:") and name.count(":") == 3:
        ns, sa = name.split(":")[2:]
        target = service_account_user(ns, sa)
        checks = [Attributes(verb="impersonate", resource="serviceaccounts", namespace=ns, name=sa)]
    else:
        target = User(name, (*groups, AUTHENTICATED))
        checks = [Attributes(verb="impersonate", resource="users", name=name)]
    checks += [Attributes(verb="impersonate", resource="groups", name=g) for g in groups]
    for attrs in checks:
        if not authorize(store, user, attrs)[0]:
            raise forbidden(user, attrs)
    return target


# -- authorization ----------------------------------------------------------------------------

def _subject_matches(subject: dict[str, Any], user: User, binding_ns: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return name == user.name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        return user.name == f"system:serviceaccount:{subject.get('namespace') or binding_ns}:{name}"
    return False


def _has(values: list[str] | None, wanted: str) -> bool:
    return bool(values) and ("*" in values or wanted in values)


def _resource_matches(resources: list[str], resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for r in resources or []:
        if r in ("*", combined):
            return True
        if subresource and r in (f"*/{subresource}", f"{resource}/*"):
            return True
    return False


def rule_allows(rule: dict[str, Any], attrs: Attributes) -> bool:
    if not _has(rule.get("verbs"), attrs.verb):
        return False
    if not attrs.is_resource:
        return any(u == "*" or u == attrs.path or (u.endswith("*") and attrs.path.startswith(u[:-1]))
                   for u in rule.get("nonResourceURLs") or [])
    if not _has(rule.get("apiGroups"), attrs.group):
        return False
    if not _resource_matches(rule.get("resources") or [], attrs.resource, attrs.subresource):
        return False
    names = rule.get("resourceNames")
    return not names or attrs.name in names


def authorize(store: Store, user: User, attrs: Attributes) -> tuple[bool, str]:
    """(allowed, reason) from RBAC; `system:masters` is always allowed, as on a real server."""
    if MASTERS in user.groups:
        return True, ""
    with store.lock:
        for binding in store.list(CLUSTER_ROLE_BINDINGS):
            if any(_subject_matches(s, user, "") for s in binding.get("subjects") or []):
                role = store.try_get(CLUSTER_ROLES, "", (binding.get("roleRef") or {}).get("name", ""))
                if role and any(rule_allows(r, attrs) for r in role.get("rules") or []):
                    return True, (f'RBAC: allowed by ClusterRoleBinding "{binding["metadata"]["name"]}" of '
                                  f'ClusterRole "{role["metadata"]["name"]}" to {_who(user)}')
        if attrs.namespace and attrs.is_resource:
            for binding in store.list(ROLE_BINDINGS, attrs.namespace):
                if not any(_subject_matches(s, user, attrs.namespace) for s in binding.get("subjects") or []):
                    continue
                ref = binding.get("roleRef") or {}
                role = (store.try_get(ROLES, attrs.namespace, ref.get("name", "")) if ref.get("kind") == "Role"
                        else store.try_get(CLUSTER_ROLES, "", ref.get("name", "")))
                if role and any(rule_allows(r, attrs) for r in role.get("rules") or []):
                    return True, (f'RBAC: allowed by RoleBinding "{binding["metadata"]["name"]}/{attrs.namespace}" '
                                  f'of {ref.get("kind")} "{role["metadata"]["name"]}" to {_who(user)}')
    return False, ""


def _who(user: User) -> str:
    if user.name.startswith("system:serviceaccount:"):
        ns, name = user.name.split(":")[2:4]
        return f'ServiceAccount "{name}/{ns}"'
    return f'User "{user.name}"'


def forbidden(user: User, attrs: Attributes) -> errors.ApiError:
    """403 with the API server's wording (responsewriters.forbiddenMessage)."""
    if not attrs.is_resource:
        return errors.ApiError(403, "Forbidden",
                               f'forbidden: User "{user.name}" cannot {attrs.verb} path "{attrs.path}"', {})
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    scope = (f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope")
    why = f'User "{user.name}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.group}" {scope}'
    return errors.forbidden(attrs.resource, attrs.name or None, attrs.group, why)


# -- reviews ----------------------------------------------------------------------------------

def access_review(store: Store, user: User, body: Any) -> dict[str, Any]:
    """SelfSubjectAccessReview (`kubectl auth can-i`): may the caller do what the spec says?"""
    spec = (body or {}).get("spec") if isinstance(body, dict) else None
    res_attrs, non_res = (spec or {}).get("resourceAttributes"), (spec or {}).get("nonResourceAttributes")
    if bool(res_attrs) == bool(non_res):
        raise errors.invalid("SelfSubjectAccessReview", "", [("spec.resourceAttributes", "FieldValueRequired",
                             "Required value: exactly one of nonResourceAttributes or resourceAttributes must be specified")],
                             "authorization.k8s.io")
    if res_attrs:
        attrs = Attributes(verb=res_attrs.get("verb", ""), resource=res_attrs.get("resource", ""),
                           subresource=res_attrs.get("subresource", ""), group=res_attrs.get("group", ""),
                           namespace=res_attrs.get("namespace", ""), name=res_attrs.get("name", ""))
    else:
        attrs = Attributes(verb=non_res.get("verb", ""), path=non_res.get("path", ""), is_resource=False)
    allowed, reason = authorize(store, user, attrs)
    status: dict[str, Any] = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    return {"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}


def self_review(user: User) -> dict[str, Any]:
    """SelfSubjectReview (`kubectl auth whoami`)."""
    return {"kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None}, "status": {"userInfo": user.info()}}


# -- bootstrap policy -------------------------------------------------------------------------

def _cluster_role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}, "rules": rules}


def _binding(name: str, role: str, group: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": RBAC, "kind": "Group", "name": group}]}


BOOTSTRAP_ROLES = [
    _cluster_role("cluster-admin", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                                    {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
    _cluster_role("system:discovery", [{"nonResourceURLs": [
        "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz",
        "/version", "/version/"], "verbs": ["get"]}]),
    _cluster_role("system:basic-user", [
        {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
         "verbs": ["create"]},
        {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]}]),
    _cluster_role("system:public-info-viewer", [{"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version",
                                                                      "/version/"], "verbs": ["get"]}]),
]
BOOTSTRAP_BINDINGS = [
    _binding("cluster-admin", "cluster-admin", MASTERS),
    _binding("system:discovery", "system:discovery", AUTHENTICATED),
    _binding("system:basic-user", "system:basic-user", AUTHENTICATED),
    _binding("system:public-info-viewer", "system:public-info-viewer", AUTHENTICATED),
]
