"""Kubernetes `Status` failures, so the official client raises ApiException with the real code."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An API failure that the server answers as a `Status` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(kind: str, name: str | None, group: str = "") -> dict[str, Any]:
    details: dict[str, Any] = {"kind": kind}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    return details


def not_found(plural: str, name: str, group: str = "") -> ApiError:
    what = f"{plural}.{group}" if group else plural
    return ApiError(404, "NotFound", f'{what} "{name}" not found', _details(plural, name, group))


def already_exists(plural: str, name: str, group: str = "") -> ApiError:
    what = f"{plural}.{group}" if group else plural
    return ApiError(409, "AlreadyExists", f'{what} "{name}" already exists', _details(plural, name, group))


def conflict(plural: str, name: str, group: str = "", why: str | None = None) -> ApiError:
    what = f"{plural}.{group}" if group else plural
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {what} "{name}": {why}',
                    _details(plural, name, group))


def qualified_kind(kind: str, group: str = "") -> str:
    """`Deployment.apps`, `Pod`: how the API server names a kind in its messages."""
    return f"{kind}.{group}" if group else kind


def invalid(kind: str, name: str | None, causes: list[tuple[str, str, str]], group: str = "") -> ApiError:
    """422 Invalid; causes are (field, reason, message) like FieldValueRequired/FieldValueInvalid.

    The message is the API server's: `Deployment.apps "x" is invalid: <field>: <message>`, the
    field errors in brackets when there are several.
    """
    errs = [f"{field}: {message}" if field else message for field, _, message in causes]
    text = errs[0] if len(errs) == 1 else f"[{', '.join(errs)}]"
    details = _details(kind, name, group)
    details["causes"] = [{"field": f, "reason": r, "message": f"{m}"} for f, r, m in causes]
    return ApiError(422, "Invalid", f'{qualified_kind(kind, group)} "{name or ""}" is invalid: {text}', details)


def forbidden(plural: str, name: str | None, group: str, why: str) -> ApiError:
    """403 Forbidden as the API server words it: `pods "x" is forbidden: <why>`."""
    what = f"{plural}.{group}" if group else plural
    subject = f'{what} "{name}"' if name else what
    return ApiError(403, "Forbidden", f"{subject} is forbidden: {why}", _details(plural, name, group))


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed(message: str = "the server does not allow this method on the requested resource") -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


BUILTIN_PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json",
                       "application/strategic-merge-patch+json", "application/apply-patch+yaml")
BODY_TYPES = ("application/json", "application/yaml", "application/vnd.kubernetes.protobuf")
CUSTOM_PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml")


def unsupported_media_type(content_type: str, accepted: tuple[str, ...] = BUILTIN_PATCH_TYPES) -> ApiError:
    return ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                    f"accepted media types include: {', '.join(accepted)}")


def too_many_requests(message: str) -> ApiError:
    return ApiError(429, "TooManyRequests", message)


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError", f"Internal error occurred: {message}")
