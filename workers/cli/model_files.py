"""A YAML (or JSON) file read as a pydantic model; the error names the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from workflows.core.failures import field_errors


M = TypeVar("M", bound=BaseModel)


def load_model_file(path: Path, model: type[M], what: str, error: type[ValueError]) -> M:
    """A YAML or JSON (JSON is YAML) file as ``model``; ``error`` names the field, e.g. ``schedules.0.time_zone``."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise error(f"cannot read {path}: {exc}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise error(f"invalid {what} {path}: {field_errors(exc, '(file)')}") from None
