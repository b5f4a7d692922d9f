"""HTTP front end: discovery, REST verbs, chunked watch streams and the /sandbox control endpoints."""

from __future__ import annotations

import json
import logging
import time
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from infra.sandbox.config import SANDBOX_NAMESPACE
from infra.sandbox.httpserver import SandboxHTTPServer

from . import auth, errors, openapi, podsecurity, protobuf, resources, tables
from .api import Api
from .controllers import Controllers
from .errors import ApiError
from .faults import Faults
from .resources import BY_PATH, GROUP_VERSIONS, Resource
from .selectors import parse_field_selector, parse_label_selector
from .store import Change, Store

log = logging.getLogger(__name__)

BOOTSTRAP_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease", SANDBOX_NAMESPACE)
DEFAULT_WATCH_SECONDS = 1800


def _flag(value: str | None) -> bool:
    """Boolean query parameters: clients send true, True or 1."""
    return (value or "").lower() in ("true", "1")


class KubeApiServer(SandboxHTTPServer):
    """The emulator: store + API + controllers behind a threaded HTTP server."""

    allow_reuse_address = True

    def __init__(self, host: str, port: int, time_scale: float = 1.0, faults: Faults | None = None,
                 watch_history: int = 20000, pod_network: str = "10.244"):
        super().__init__((host, port), Handler)
        self.store = Store(watch_history)
        self.api = Api(self.store)
        self.faults = faults or Faults()
        self.controllers = Controllers(self.store, time_scale, pod_network)
        self.tokens = auth.Tokens(self.store)
        self.stopping = False
        for ns in BOOTSTRAP_NAMESPACES:
            self.api.create(resources.BY_KEY["namespaces"], "", {"metadata": {"name": ns}})
        for role in auth.BOOTSTRAP_ROLES:
            self.api.create(auth.CLUSTER_ROLES, "", role)
        for binding in auth.BOOTSTRAP_BINDINGS:
            self.api.create(auth.CLUSTER_ROLE_BINDINGS, "", binding)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self.controllers.start()
        super().serve_forever(poll_interval)

    def shutdown(self) -> None:
        self.stopping = True
        self.controllers.stop()
        with self.store.changed:
            self.store.changed.notify_all()
        super().shutdown()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: KubeApiServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # -- plumbing ---------------------------------------------------------------------------
    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        for warning in podsecurity.take_warnings():  # Pod Security warn/audit, as the API server's Warning headers
            self.send_header("Warning", '299 - "' + warning.replace("\\", "\\\\").replace('"', '\\"') + '"')
        self.end_headers()
        self.wfile.write(data)

    def _json_body(self, raw: bytes) -> Any:
        if not raw.strip():
            return None
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if content_type == protobuf.PROTOBUF:  # kubectl's typed clients
            return protobuf.decode(raw)
        if content_type not in ("", "application/json", "application/yaml", "*/*"):
            raise errors.unsupported_media_type(content_type, errors.BODY_TYPES)
        try:
            return yaml.safe_load(raw) if content_type == "application/yaml" else json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"error decoding request body: {exc}") from None

    def _dispatch(self, method: str) -> None:
        podsecurity.take_warnings()  # none left from this thread's last request
        try:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            url = urlsplit(self.path)
            path = url.path.rstrip("/") or "/"
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if path == "/sandbox/faults":
                return self._faults(method, raw)
            if path == "/sandbox/oom" and method == "POST":  # the fleet: this pod's server ran out of memory
                body = self._json_body(raw) or {}
                killed = self.server.controllers.kubelet.report_oom(body.get("namespace", ""), body.get("name", ""))
                return self._send(200 if killed else 404, {"oomKilled": killed})
            if path == "/sandbox/exit" and method == "POST":  # a node agent: this pod's container exited
                body = self._json_body(raw) or {}
                done = self.server.controllers.kubelet.report_exit(
                    body.get("namespace", ""), body.get("name", ""), body.get("exitCode", 1), body.get("message", ""))
                return self._send(200 if done else 404, {"exited": done})
            self.server.faults.inject(method)
            user = self._authorize(method, path, query)
            if method == "GET" and self._discovery(path):
                return
            self._resource(method, path, query, raw, user)
        except ApiError as exc:
            self._send(exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # answer like the real server instead of dropping the connection
            log.exception("request %s %s failed", method, self.path)
            self._send(500, errors.internal(str(exc)).status())

    def _faults(self, method: str, raw: bytes) -> None:
        faults = self.server.faults
        if method in ("PUT", "POST"):
            self._send(200, faults.update(self._json_body(raw) or {}, replace=True))
        elif method == "PATCH":
            self._send(200, faults.update(self._json_body(raw) or {}))
        elif method == "DELETE":
            self._send(200, faults.update({}, replace=True))
        else:
            self._send(200, dict(faults.settings))

    def _discovery(self, path: str) -> bool:
        parts = path.strip("/").split("/")
        if path in ("/healthz", "/livez", "/readyz"):
            self._send(200, b"ok", "text/plain")
        elif path == "/openapi/v3":
            self._send(200, openapi.root())
        elif path.startswith("/openapi/v3/") and openapi.group_version(path[len("/openapi/v3/"):]):
            self._send(200, openapi.group_version(path[len("/openapi/v3/"):]))
        elif path == "/version":
            self._send(200, resources.VERSION_INFO)
        elif path == "/api":
            self._send(200, resources.api_versions(f"{self.server.server_address[0]}:{self.server.server_address[1]}"))
        elif path == "/api/v1":
            self._send(200, resources.resource_list("", "v1"))
        elif path == "/apis":
            self._send(200, resources.api_group_list())
        elif parts[0] == "apis" and len(parts) == 2 and parts[1] in GROUP_VERSIONS:
            self._send(200, resources.api_group(parts[1]))
        elif parts[0] == "apis" and len(parts) == 3 and parts[2] in GROUP_VERSIONS.get(parts[1], []):
            self._send(200, resources.resource_list(parts[1], parts[2]))
        else:
            return False
        return True

    # -- authentication and authorization ---------------------------------------------------
    def _authorize(self, method: str, path: str, query: dict[str, str]) -> auth.User:
        """Who is asking (401 if the token is not ours) and whether RBAC lets them (403)."""
        user = self.server.tokens.authenticate(self.headers.get("Authorization"))
        if self.headers.get("Impersonate-User"):
            user = auth.impersonate(self.server.store, user, self.headers["Impersonate-User"],
                                    self.headers.get_all("Impersonate-Group") or [])
        if auth.MASTERS in user.groups:
            return user
        attrs = self._attributes(method, path, query)
        allowed, _ = auth.authorize(self.server.store, user, attrs)
        if not allowed:
            raise auth.forbidden(user, attrs)
        return user

    def _attributes(self, method: str, path: str, query: dict[str, str]) -> auth.Attributes:
        """The request's authorizer attributes (the API server's RequestInfo)."""
        try:
            res, ns, name, sub, legacy_watch = self._route(path)
        except ApiError:
            return auth.Attributes(verb=method.lower(), path=path, is_resource=False)
        if method == "GET":
            verb = "watch" if legacy_watch or _flag(query.get("watch")) else ("get" if name else "list")
        elif method == "DELETE":
            verb = "delete" if name else "deletecollection"
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]
        if res.plural == "namespaces" and name:
            ns = name  # as RequestInfo: a namespace's own namespace is itself
        return auth.Attributes(verb=verb, path=path, resource=res.plural, subresource=sub or "", group=res.group,
                               namespace=ns or "", name=name or "")

    # -- resources --------------------------------------------------------------------------
    def _route(self, path: str) -> tuple[Resource, str | None, str | None, str | None, bool]:
        """(resource, namespace, name, subresource, legacy watch path) for a REST path."""
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise self._no_route()
        watch = bool(rest) and rest[0] == "watch"
        rest = rest[1:] if watch else rest
        ns = None
        if len(rest) >= 3 and rest[0] == "namespaces" and (group, version, rest[2]) in BY_PATH \
                and BY_PATH[(group, version, rest[2])].namespaced:
            ns, rest = rest[1], rest[2:]
        if not rest or (group, version, rest[0]) not in BY_PATH or len(rest) > 3:
            raise self._no_route()
        res = BY_PATH[(group, version, rest[0])]
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if (sub and sub not in res.subresources) or (res.namespaced and name and ns is None):
            raise self._no_route()
        return res, ns, name, sub, watch

    @staticmethod
    def _no_route() -> ApiError:
        return ApiError(404, "NotFound", "the server could not find the requested resource", {})

    def _resource(self, method: str, path: str, query: dict[str, str], raw: bytes, user: auth.User) -> None:
        res, ns, name, sub, legacy_watch = self._route(path)
        api = self.server.api
        if res.verbs == ("create",):
            if method != "POST" or name is not None:
                raise errors.method_not_allowed()
            body = self._json_body(raw)
            review = (auth.access_review(self.server.store, user, body) if res.kind == "SelfSubjectAccessReview"
                      else auth.self_review(user))
            return self._send(201, review)
        if method == "POST" and sub == "token":
            return self._send(201, self.server.tokens.request(ns or "", name, self._json_body(raw)))
        dry_run = query.get("dryRun") == "All"
        lsel, fsel = query.get("labelSelector"), query.get("fieldSelector")
        if method == "GET":
            if legacy_watch and name is not None:  # /watch/.../pods/<name>: a watch of that one object
                selector = ",".join(filter(None, [f"metadata.name={name}", query.get("fieldSelector")]))
                return self._watch(res, ns, {**query, "fieldSelector": selector})
            if sub == "log":
                return self._send(200, api.pod_log(ns or "", name, query.get("container")).encode(), "text/plain")
            if name is not None:
                obj = api.get(res, ns or "", name, sub)
                if sub is None:
                    obj = self._maybe_table(res, [obj], {"resourceVersion": obj["metadata"]["resourceVersion"]}, query, obj)
                return self._send(200, obj)
            if legacy_watch or _flag(query.get("watch")):
                return self._watch(res, ns, query)
            try:
                limit = int(query["limit"]) if query.get("limit") else None
            except ValueError:
                raise errors.bad_request(f"invalid limit {query['limit']!r}") from None
            listed = api.list(res, ns, lsel, fsel, limit, query.get("continue"))
            return self._send(200, self._maybe_table(res, listed["items"], listed["metadata"], query, listed))
        if method == "POST":
            if name is None and (ns is not None or not res.namespaced):
                return self._send(201, api.create(res, ns or "", self._json_body(raw), dry_run))
            if sub == "eviction":
                return self._send(201, api.evict(ns or "", name, self._json_body(raw)))
            raise errors.method_not_allowed()
        if method == "PUT" and name is not None:
            return self._send(200, api.replace(res, ns or "", name, self._json_body(raw), sub, dry_run))
        if method == "PATCH" and name is not None:
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            return self._send(200, api.patch(res, ns or "", name, content_type, raw, sub, dry_run))
        if method == "DELETE":
            options = self._json_body(raw) or {}
            options.update({k: query[k] for k in ("propagationPolicy", "dryRun", "gracePeriodSeconds") if k in query})
            if name is not None and sub is None:
                return self._send(200, api.delete(res, ns or "", name, options))
            if name is None:
                return self._send(200, api.delete_collection(res, ns, lsel, fsel))
        raise errors.method_not_allowed()

    def _maybe_table(self, res: Resource, objs: list[dict[str, Any]], meta: dict[str, Any],
                     query: dict[str, str], plain: dict[str, Any]) -> dict[str, Any]:
        """A Table when kubectl asks for one (Accept ...;as=Table), else the plain object or list."""
        if not tables.wants_table(self.headers.get("Accept") or ""):
            return plain
        return tables.table(res, objs, {k: v for k, v in meta.items() if k in ("resourceVersion", "continue")},
                            query.get("includeObject"))

    # -- watch ------------------------------------------------------------------------------
    def _watch(self, res: Resource, ns: str | None, query: dict[str, str]) -> None:
        store = self.server.store
        # Parse selectors first, so a malformed one is a 400 instead of a broken stream.
        labels = parse_label_selector(query.get("labelSelector"))
        fields = parse_field_selector(query.get("fieldSelector"))
        timeout = float(query.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
        bookmarks = _flag(query.get("allowWatchBookmarks"))
        as_table = tables.wants_table(self.headers.get("Accept") or "")
        rv = query.get("resourceVersion") or "0"
        try:
            start = int(rv)
        except ValueError:
            raise errors.bad_request(f"invalid resourceVersion {rv!r}") from None

        def matches(obj: dict[str, Any]) -> bool:
            return ((not ns or obj["metadata"].get("namespace") == ns)
                    and labels(obj["metadata"].get("labels") or {}) and fields(obj))

        with store.lock:
            if start == 0:
                initial = [("ADDED", o) for o in store.list(res, ns) if matches(o)]
                cursor = store.rv
            else:
                changes = store.changes_since(start)
                initial = None if changes is None else self._filter(changes, res, matches)
                cursor = max(store.rv, start)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        if initial is None:
            self._chunk({"type": "ERROR", "object": errors.expired(
                f"too old resource version: {start} ({store.first_replayable + 1})").status()})
            return self._end_chunks()
        deadline = time.monotonic() + timeout
        last_sent = time.monotonic()
        events = initial
        while True:
            for kind, obj in events:
                if as_table:
                    obj = tables.table(res, [obj], {"resourceVersion": obj["metadata"]["resourceVersion"]}, "Object")
                if not self._chunk({"type": kind, "object": obj}):
                    return
                last_sent = time.monotonic()
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.server.stopping:
                break
            if bookmarks and time.monotonic() - last_sent > 10:
                bookmark = {"kind": res.kind, "apiVersion": res.api_version, "metadata": {"resourceVersion": str(cursor)}}
                if not self._chunk({"type": "BOOKMARK", "object": bookmark}):
                    return
                last_sent = time.monotonic()
            with store.changed:
                if store.rv == cursor:
                    store.changed.wait(min(remaining, 5.0))
                changes = store.changes_since(cursor)
                cursor = store.rv
            if changes is None:
                self._chunk({"type": "ERROR", "object": errors.expired("watch fell behind the change log").status()})
                break
            events = self._filter(changes, res, matches)
        self._end_chunks()

    @staticmethod
    def _filter(changes: list[Change], res: Resource, matches) -> list[tuple[str, dict[str, Any]]]:
        """Watch events for one resource and selector; objects moving out of a selector are DELETED."""
        out = []
        for c in changes:
            if c.key != res.key:
                continue
            now, before = matches(c.obj), c.old is not None and matches(c.old)
            if c.type == "DELETED":
                if before:
                    out.append(("DELETED", c.obj))
            elif now:
                out.append(("MODIFIED" if before else "ADDED", c.obj))
            elif before:
                out.append(("DELETED", c.obj))
        return out

    def _chunk(self, event: dict[str, Any]) -> bool:
        data = json.dumps(event).encode() + b"\n"
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            return True
        except (BrokenPipeError, ConnectionResetError, OSError):
            return False

    def _end_chunks(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass
