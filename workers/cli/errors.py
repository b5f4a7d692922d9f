"""One error style and one exit-code table for the whole ``tideplane`` CLI (docs/reference.md).

Every error is one line on stderr that begins ``tideplane: error: `` and says what is wrong (a bad
value names its rule: ``--window-hours must be > 0``); no traceback for an outside system that is
down. Exit codes:

  0  success
  1  the operation failed (a workflow failed or was refused, a system is unreachable, nothing found)
  2  usage: a bad flag or value, a missing or unreadable file, an invalid spec or setting
  3  (``rollout status`` only) the rollout is still running; 2 there means paused

Commands raise ``CliError(message, code)``; ``main`` turns it (and the outside systems' own
exceptions: Temporal's RPCError, botocore's connection errors, a missing file) into that line.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, TextIO

PREFIX = "tideplane: error: "
OK, FAILED, USAGE = 0, 1, 2


class CliError(Exception):
    """An error a command reports as one line, with its exit code."""

    def __init__(self, message: str, code: int = FAILED) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def report(message: str, code: int, stream: TextIO | None = None) -> int:
    """Print ``tideplane: error: MESSAGE`` (once, whatever prefix the message had) and return code."""
    text = str(message).strip()
    for old in ("tideplane: error: ", "tideplane: ", "error: "):
        if text.startswith(old):
            text = text[len(old):]
    print(PREFIX + text, file=stream or sys.stderr)
    return code


def explain(exc: BaseException) -> tuple[str, int] | None:
    """The one line and the exit code for an exception from an outside system; None: not ours to word."""
    if isinstance(exc, CliError):
        return exc.message, exc.code
    if isinstance(exc, FileNotFoundError):
        return f"{exc.filename or exc}: no such file", USAGE
    if isinstance(exc, (IsADirectoryError, PermissionError)):
        return f"{exc.filename or exc}: {exc.strerror}", USAGE
    name = type(exc).__name__
    module = type(exc).__module__
    if module.startswith("temporalio"):
        if name == "RPCError":
            status = getattr(getattr(exc, "status", None), "name", "")
            if status == "NOT_FOUND":
                return f"Temporal: {exc}", FAILED
            return f"Temporal: {exc}" + (" (is Temporal running? --address / TEMPORAL_ADDRESS)" if status == "UNAVAILABLE" else ""), FAILED
        if name == "WorkflowAlreadyStartedError":
            return f"already running: {exc}", FAILED
        if name == "WorkflowUpdateFailedError":
            cause = getattr(exc, "cause", None)
            return f"refused: {getattr(cause, 'message', None) or cause or exc}", FAILED
        if name == "WorkflowFailureError":
            cause = getattr(exc, "cause", None)
            return f"workflow failed: {getattr(cause, 'message', None) or cause or exc}", FAILED
    if isinstance(exc, RuntimeError) and "Failed client connect" in str(exc):
        found = re.search(r'message: "([^"]+)"', str(exc)) or re.search(r"ConnectError\(\"([^\"]+)\", ([^,]+),", str(exc))
        why = found.group(1) if found else str(exc).splitlines()[0]
        return f"cannot reach Temporal: {why} (check --address / TEMPORAL_ADDRESS)", FAILED
    if module.startswith(("botocore", "boto3")):
        if name in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError"):
            return f"S3 unreachable: {exc}", FAILED
        if name in ("NoCredentialsError", "PartialCredentialsError"):
            return f"S3: {exc} (AWS_ACCESS_KEY_ID / AWS_PROFILE)", FAILED
        return f"S3: {exc}", FAILED
    if module.startswith(("urllib3", "httpx", "httpcore", "requests")) or isinstance(exc, ConnectionError):
        return f"unreachable: {exc}", FAILED
    return None


def out_format(value: str) -> str:
    """``-o`` of the read commands."""
    if value not in ("text", "json", "yaml"):
        raise ValueError(value)
    return value


out_format.__name__ = "output format (text, json or yaml)"


def print_data(data: Any, fmt: str, stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    if fmt == "yaml":
        import yaml

        stream.write(yaml.safe_dump(data, sort_keys=False))
    else:
        stream.write(json.dumps(data, indent=2) + "\n")


def read_spec(path: str) -> Any:
    """A YAML or JSON file (``-`` for stdin); missing or unparsable is a usage error (exit 2)."""
    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except FileNotFoundError:
        raise CliError(f"{path}: no such file", USAGE) from None
    except (IsADirectoryError, PermissionError) as exc:
        raise CliError(f"{path}: {exc.strerror}", USAGE) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CliError(f"{path} is neither YAML nor JSON: {str(exc).splitlines()[0]}", USAGE) from None
    if not isinstance(data, dict):
        raise CliError(f"{path}: expected a mapping of fields, got {type(data).__name__}", USAGE)
    return data
