"""Decoding of the Kubernetes protobuf envelope for the few bodies kubectl sends as protobuf.

kubectl 1.32's typed clients (`create namespace|configmap|deployment`, `auth can-i`,
`auth whoami`) POST `application/vnd.kubernetes.protobuf` and do not retry as JSON on a 415.
The body is the magic `k8s\\0` and a `runtime.Unknown` {typeMeta, raw}, raw being the object's
generated protobuf message. Only the fields listed below are decoded by name (their numbers are
those of k8s.io/api's generated.proto). Go's protobuf writes every non-pointer field, so fields
not listed are accepted only when they hold their zero value (what JSON would omit); anything else
is answered 415, so nothing a client sent is silently dropped.
"""

from __future__ import annotations

import base64
from typing import Any

from . import errors

MAGIC = b"k8s\x00"
PROTOBUF = "application/vnd.kubernetes.protobuf"

# A schema maps a field number to (JSON name, type); a type is "string", "bytes", "int", "int!"
# (an optional int whose 0 is meaningful), "bool", a nested schema, ("map", type), ("list", type).
STRING_MAP = ("map", "string")
OBJECT_META = {1: ("name", "string"), 2: ("generateName", "string"), 3: ("namespace", "string"),
               11: ("labels", STRING_MAP), 12: ("annotations", STRING_MAP), 14: ("finalizers", ("list", "string"))}
LABEL_SELECTOR = {1: ("matchLabels", STRING_MAP),
                  2: ("matchExpressions", ("list", {1: ("key", "string"), 2: ("operator", "string"),
                                                    3: ("values", ("list", "string"))}))}
CONTAINER = {1: ("name", "string"), 2: ("image", "string"), 3: ("command", ("list", "string")),
             4: ("args", ("list", "string")),
             6: ("ports", ("list", {1: ("name", "string"), 2: ("hostPort", "int"), 3: ("containerPort", "int"),
                                    4: ("protocol", "string"), 5: ("hostIP", "string")}))}
POD_TEMPLATE = {1: ("metadata", OBJECT_META), 2: ("spec", {2: ("containers", ("list", CONTAINER))})}
SCHEMAS: dict[str, dict[int, Any]] = {
    "Namespace": {1: ("metadata", OBJECT_META)},
    "ConfigMap": {1: ("metadata", OBJECT_META), 2: ("data", STRING_MAP), 3: ("binaryData", ("map", "bytes")),
                  4: ("immutable", "bool")},
    "Deployment": {1: ("metadata", OBJECT_META),
                   2: ("spec", {1: ("replicas", "int!"), 2: ("selector", LABEL_SELECTOR), 3: ("template", POD_TEMPLATE)})},
    "SelfSubjectAccessReview": {1: ("metadata", OBJECT_META), 2: ("spec", {
        1: ("resourceAttributes", {1: ("namespace", "string"), 2: ("verb", "string"), 3: ("group", "string"),
                                   4: ("version", "string"), 5: ("resource", "string"), 6: ("subresource", "string"),
                                   7: ("name", "string")}),
        2: ("nonResourceAttributes", {1: ("path", "string"), 2: ("verb", "string")})})},
    "SelfSubjectReview": {1: ("metadata", OBJECT_META)},
}
TYPE_META = {1: ("apiVersion", "string"), 2: ("kind", "string")}
UNKNOWN = {1: ("typeMeta", TYPE_META), 2: ("raw", "bytes"), 3: ("contentEncoding", "string"),
           4: ("contentType", "string")}


class Undecodable(Exception):
    """A field this decoder does not know carries a value."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise Undecodable("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, raw value) of a message; length-delimited values as bytes."""
    out, pos = [], 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
            if pos > len(data):
                raise Undecodable("truncated field")
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = int.from_bytes(data[pos:pos + size], "little"), pos + size
        else:
            raise Undecodable(f"wire type {wire}")
        out.append((number, wire, value))
    return out


def _is_zero(wire: int, value: Any) -> bool:
    """An unknown field is harmless when it holds a zero value: 0, "", or a message of zeros."""
    if wire != 2:
        return value == 0
    if not value:
        return True
    try:
        return all(_is_zero(w, v) for _, w, v in _fields(value))
    except Undecodable:
        return False


def _value(kind: Any, wire: int, raw: Any) -> Any:
    if kind == "string":
        return raw.decode()
    if kind == "bytes":
        return raw
    if kind in ("int", "int!"):
        return raw - (1 << 64) if raw >= 1 << 63 else raw
    if kind == "bool":
        return bool(raw)
    if isinstance(kind, dict):
        return decode_message(raw, kind)
    raise Undecodable(f"type {kind}")


def decode_message(data: bytes, schema: dict[int, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for number, wire, raw in _fields(data):
        if number not in schema:
            if not _is_zero(wire, raw):
                raise Undecodable(f"field {number}")
            continue
        name, kind = schema[number]
        if isinstance(kind, tuple) and kind[0] == "map":
            entry = {n: v for n, _, v in _fields(raw)}
            value = _value(kind[1], 2, entry.get(2, b""))
            obj.setdefault(name, {})[entry.get(1, b"").decode()] = (
                base64.b64encode(value).decode() if kind[1] == "bytes" else value)
        elif isinstance(kind, tuple) and kind[0] == "list":
            obj.setdefault(name, []).append(_value(kind[1], wire, raw))
        else:
            value = _value(kind, wire, raw)
            if kind == "int!" or value not in ("", 0, False):
                obj[name] = value
    return obj


def decode(raw: bytes) -> dict[str, Any]:
    """A protobuf request body as the JSON object it stands for; 415 when it cannot be."""
    try:
        if not raw.startswith(MAGIC):
            raise Undecodable("no k8s protobuf magic")
        envelope = decode_message(raw[len(MAGIC):], UNKNOWN)
        type_meta = envelope.get("typeMeta") or {}
        schema = SCHEMAS.get(type_meta.get("kind", ""))
        if schema is None:
            raise Undecodable(f"kind {type_meta.get('kind')}")
        obj = decode_message(envelope.get("raw", b""), schema)
    except (Undecodable, UnicodeDecodeError):
        raise errors.unsupported_media_type(PROTOBUF, errors.BODY_TYPES) from None
    return {"apiVersion": type_meta.get("apiVersion"), "kind": type_meta["kind"], **obj}
